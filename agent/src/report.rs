//! What the agent tells the world: the bounded `endpoint` that serves the
//! Prometheus metrics ([`crate::metrics`]), the `decisions` kept in
//! --state-dir, what the kernel side saw (OOM victims, the programs'
//! counters), and the Kubernetes API (pod metadata in, eviction reports
//! out).
pub mod decisions;
pub(crate) mod endpoint;
pub mod kernel_side;
pub mod kubernetes;
