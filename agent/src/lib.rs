//! evictd: a Kubernetes node agent that detects memory and PID pressure in
//! the kernel (eBPF on raw tracepoints) and keeps kubelet's eviction policy.
//!
//! Data path: kernel band crossing -> [`bpf`] event stream -> [`monitor`]
//! (fresh cgroupfs read, levels, re-arm) -> logs and [`metrics`].
pub mod bpf;
pub mod capabilities;
pub mod cgroup;
pub mod config;
pub mod daemon;
pub mod duration;
pub mod endpoint;
pub mod engine;
pub mod evictor;
pub mod inventory;
pub mod kernel_layout;
pub mod kill;
pub mod kubernetes;
pub mod levels;
pub mod metrics;
pub mod monitor;
pub mod notify;
pub mod pod_metadata;
pub mod quantity;
pub mod rank;
pub mod seccomp;
pub mod signals;
pub mod simulate;
pub mod snapshot;
pub mod state;
#[cfg(test)]
mod testing;
pub mod thresholds;
pub mod triggers;
pub mod watch;
