//! kubelet's eviction policy, pure: thresholds, the engine (thresholds
//! met, grace periods, node conditions, the starved resource), the disk
//! layout that decides what a disk signal measures, the ranking of pods and
//! the choice of victims, why each is killed, a pod thrashing at its own
//! limit, the `snapshot` types it decides on and Kubernetes' arithmetic on
//! a pod's `resources` (its requests and QoS class).
pub(crate) mod engine;
pub mod layout;
pub(crate) mod memory_high;
pub mod rank;
pub(crate) mod reason;
pub mod resources;
pub mod snapshot;
pub(crate) mod thrashing;
pub mod thresholds;
