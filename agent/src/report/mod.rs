//! What the agent tells the world: Prometheus metrics and the bounded
//! `endpoint` that serves them, what the kernel side saw (OOM victims, the
//! programs' counters), and the Kubernetes API (pod metadata in, eviction
//! reports out).
pub mod decisions;
pub mod endpoint;
pub mod kernel;
pub mod kubernetes;
pub mod metrics;
