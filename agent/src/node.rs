//! The node as cgroupfs and the filesystems show it: controller mounts,
//! the node's signals, the pods found in kubelet's cgroup layout, their
//! metadata from a `--pod-metadata` file; what it reads is put in the
//! snapshot types the engine decides on ([`crate::decide::snapshot`]).
pub mod cgroupfs;
pub mod cold_cache;
pub(crate) mod container_pressure;
pub(crate) mod containers;
pub mod forks;
pub mod inventory;
pub(crate) mod pod_metadata;
pub mod runtime;
pub mod stalls;
pub mod stats;
