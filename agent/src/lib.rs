//! evictd: a Kubernetes node agent that detects memory and PID pressure in
//! the kernel (eBPF on raw tracepoints) and keeps kubelet's eviction policy.
pub mod act;
pub mod config;
pub mod decide;
pub mod duration;
pub mod kernel;
pub mod node;
pub mod quantity;
pub mod report;
pub mod run;
pub mod scopes;
#[cfg(test)]
mod testing;
