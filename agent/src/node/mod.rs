//! The node as cgroupfs and the filesystems show it: controller mounts,
//! the node's signals, the pods found in kubelet's cgroup layout, their
//! metadata from a `--pod-metadata` file, and the snapshot types the engine
//! decides on.
pub mod cgroupfs;
pub mod cold_cache;
pub mod container_pressure;
pub mod containers;
pub mod forks;
pub mod inventory;
pub mod pod_metadata;
pub mod resources;
pub mod runtime;
pub mod snapshot;
pub mod stalls;
pub mod stats;
