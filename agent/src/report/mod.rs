//! What the agent tells the world: Prometheus metrics and the Kubernetes
//! API (pod metadata in, eviction reports out).
pub mod kubernetes;
pub mod metrics;
