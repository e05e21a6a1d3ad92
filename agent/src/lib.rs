//! evictd: a Kubernetes node agent that detects memory and PID pressure in
//! the kernel (eBPF on tracepoints) and keeps kubelet's eviction policy.
pub mod kernel_layout;
pub mod bpf;
pub mod cgroup;
pub mod duration;
pub mod levels;
pub mod metrics;
pub mod monitor;
pub mod watch;
pub mod config;
pub mod daemon;
#[path = "/tmp/quantity_shim.rs"] pub mod quantity;
