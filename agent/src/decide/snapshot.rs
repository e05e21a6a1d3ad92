//! A node at one instant, in the JSON schema of `evictd simulate` and
//! `evictd snapshot` (shared/contracts/simulate.md). The engine decides on
//! this and nothing else, whether it came from a file or from the live node.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{decide::layout::DiskLayout, decide::resources, quantity::Quantity};

/// Pods whose priority is at least this are critical (kubelet's
/// `scheduling.SystemCriticalPriority`, 2 * 10^9).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Seconds on the engine's clock; 0 for a lone snapshot.
    #[serde(default)]
    pub time: f64,
    pub node: NodeStats,
    #[serde(default)]
    pub pods: Vec<PodSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStats {
    pub memory: MemoryStats,
    /// The pods' cgroup (kubepods) against node allocatable memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<MemoryStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<PidStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodefs: Option<FsStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imagefs: Option<FsStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containerfs: Option<FsStats>,
}

impl NodeStats {
    /// Whether imagefs is a filesystem of its own, as kubelet's
    /// `HasDedicatedImageFs` decides it (pkg/kubelet/stats/provider.go):
    /// imagefs is on another device than nodefs. Two statistics of one
    /// filesystem differ whenever anything writes between the readings, so
    /// only a snapshot that does not say which devices (one written by
    /// hand) is judged by its statistics.
    pub(crate) fn dedicated_imagefs(&self) -> bool {
        match (&self.nodefs, &self.imagefs) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(nodefs), Some(imagefs)) => match (nodefs.device, imagefs.device) {
                (Some(nodefs_device), Some(imagefs_device)) => nodefs_device != imagefs_device,
                _ => nodefs != imagefs,
            },
        }
    }

    /// The node's layout as kubelet decides it (shared/contracts/simulate.md):
    /// a dedicated imagefs ([`NodeStats::dedicated_imagefs`]) is split from
    /// the writable layers when containerfs is on another device
    /// (`IsContainerFsSeparateFromImageFs`); without devices it is not.
    pub(crate) fn disk_layout(&self) -> DiskLayout {
        if !self.dedicated_imagefs() {
            return DiskLayout::Shared;
        }
        let devices = (
            self.imagefs.and_then(|fs| fs.device),
            self.containerfs.and_then(|fs| fs.device),
        );
        match devices {
            (Some(imagefs), Some(containerfs)) if imagefs != containerfs => {
                DiskLayout::SplitImageFs
            }
            _ => DiskLayout::DedicatedImageFs,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStats {
    pub capacity_bytes: u64,
    pub working_set_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidStats {
    pub max: u64,
    pub in_use: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStats {
    pub capacity_bytes: u64,
    pub available_bytes: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    /// The filesystem's device (`st_dev`), which says whether imagefs is
    /// nodefs. Live snapshots fill it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodSnapshot {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub priority: i32,
    #[serde(default, rename = "static")]
    pub is_static: bool,
    #[serde(default)]
    pub mirror: bool,
    pub containers: Vec<ContainerSpec>,
    /// `spec.initContainers`, in order; a sidecar has `restart_policy`
    /// `Always`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<ContainerSpec>,
    /// `spec.overhead`: what the pod's runtime class costs on top of its
    /// containers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overhead: ResourceList,
    /// `spec.resources`: requests and limits for the pod as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// `spec.volumes` that are emptyDirs, with their `sizeLimit`: the live
    /// agent evicts a pod whose emptyDir outgrows it (with
    /// --container-runtime-endpoint, which measures the volumes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub empty_dirs: Vec<EmptyDirVolume>,
    /// `spec.terminationGracePeriodSeconds`; Kubernetes defaults it to 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default)]
    pub usage: PodUsage,
    /// Live snapshots only: the pod's cgroup, relative to the hierarchy
    /// root (e.g. `/kubepods/burstable/pod<uid>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Live snapshots only: fields above that are defaults because nothing
    /// told evictd their value (e.g. `["namespace", "name", "priority"]` for
    /// a pod found in cgroups but absent from --pod-metadata).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<String>,
    /// Live snapshots only: the QoS class kubelet's cgroup layout shows
    /// (kubepods/, burstable/, besteffort/), the only QoS evidence for a pod
    /// whose containers are unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_qos: Option<QosClass>,
    /// Live snapshots only: evictd itself runs in this pod's cgroup, so the
    /// pod is never a victim (the agent never kills itself).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hosts_evictd: bool,
}

/// Kubernetes' QoS classes, in the order kubelet's OOM scores protect them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum QosClass {
    BestEffort,
    Burstable,
    Guaranteed,
}

impl QosClass {
    /// The class as Kubernetes spells it (the `qos` label of metrics).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::BestEffort => "BestEffort",
            Self::Burstable => "Burstable",
            Self::Guaranteed => "Guaranteed",
        }
    }
}

/// Quantities by resource name (`memory`, `cpu`, `ephemeral-storage`...),
/// as a pod spec's `requests`, `limits` and `overhead` hold them.
pub type ResourceList = BTreeMap<String, Quantity>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub name: String,
    #[serde(default)]
    pub requests: ResourceList,
    #[serde(default)]
    pub limits: ResourceList,
    /// An init container's `restartPolicy`: `Always` makes it a sidecar,
    /// which keeps running beside the containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
}

/// An emptyDir volume of the pod spec and its `sizeLimit`, if set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmptyDirVolume {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<Quantity>,
}

/// Pod-level `spec.resources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub requests: ResourceList,
    #[serde(default)]
    pub limits: ResourceList,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodUsage {
    #[serde(default)]
    pub memory_working_set_bytes: u64,
    #[serde(default)]
    pub pids: u64,
    #[serde(default)]
    pub rootfs_bytes: u64,
    #[serde(default)]
    pub logs_bytes: u64,
    #[serde(default)]
    pub local_volume_bytes: u64,
    /// The pod's inodes, all of them: what ranks it where the split below
    /// is not given.
    #[serde(default)]
    pub inodes: u64,
    /// The walk of the pod's logs and volumes fell short (a directory
    /// evictd cannot read, or past the walk's bounds): the disk figures
    /// are at least what they say, and a disk ranking that counts them
    /// places the pod as kubelet places one it has no stats for, first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disk_incomplete: bool,
    /// The inodes of its writable layers, its logs and its local volumes
    /// apart, which inode signals rank by per filesystem as the bytes are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_inodes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs_inodes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_volume_inodes: Option<u64>,
    /// The pod's recent fork rate, which `--pid-ranking fork-rate` ranks
    /// PID pressure by; absent counts as no forks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forks_per_second: Option<ForkRate>,
    /// The pod's memory stall and refault counters as last read (every
    /// [`STALLS_INTERVAL`](crate::node::stalls::STALLS_INTERVAL) at most);
    /// live exact listings only. Thrashing is judged on two of them
    /// (`decide::thrashing`); `simulate` ignores them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_stalls: Option<MemoryStalls>,
}

/// A pod cgroup's cumulative memory counters, as the kernel keeps them
/// since the cgroup was made, and when they were read: a rate over a window
/// is the difference of two readings over their times. A counter the
/// kernel does not keep is absent (v1 has no activations and no PSI).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStalls {
    /// CLOCK_MONOTONIC nanoseconds at the reading.
    pub read_at_ns: u64,
    /// Pages faulted back in soon after they were reclaimed (memory.stat
    /// `workingset_refault_anon`/`_file`; v1's hierarchical `total_` ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workingset_refault_anon: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workingset_refault_file: Option<u64>,
    /// Refaulted pages put straight back on the active list (v2's
    /// `workingset_activate_anon`/`_file`): the working set does not fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workingset_activate_anon: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workingset_activate_file: Option<u64>,
    /// Microseconds some (`some`) or all (`full`) of the pod's tasks
    /// stalled on memory (v2 memory.pressure's `total=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_some_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_full_us: Option<u64>,
    /// The pod's file pages, active and inactive (memory.stat
    /// `active_file` + `inactive_file`; v1's `total_` ones): what its
    /// refaults are a share of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_bytes: Option<u64>,
    /// The bytes charged to the pod's cgroup and its memory limit (none:
    /// unlimited), read with the counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// How many times its charges met that limit (v1 `memory.failcnt`, v2
    /// memory.events `max`): a pod whose count grew was at its limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_hits: Option<u64>,
}

/// Forks a second: a finite number, not below zero, so that rates compare
/// as a total order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct ForkRate(f64);

impl ForkRate {
    pub(crate) const NONE: Self = Self(0.0);

    pub(crate) fn per_second(self) -> f64 {
        self.0
    }
}

impl TryFrom<f64> for ForkRate {
    type Error = String;

    fn try_from(rate: f64) -> Result<Self, String> {
        if rate.is_finite() && rate >= 0.0 {
            // -0.0 would order below 0.0.
            Ok(Self(rate.abs()))
        } else {
            Err(format!(
                "forks_per_second {rate} is not a finite number of forks a second, 0 or more"
            ))
        }
    }
}

impl From<ForkRate> for f64 {
    fn from(rate: ForkRate) -> f64 {
        rate.0
    }
}

// Never NaN (see `TryFrom<f64>`), so equality and order are total.
impl Eq for ForkRate {}

impl PartialOrd for ForkRate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ForkRate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl PodSnapshot {
    /// `namespace/name`, as rankings print pods.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// kubelet never evicts static, mirror or system-critical pods.
    pub(crate) fn is_critical(&self) -> bool {
        self.is_static || self.mirror || self.priority >= SYSTEM_CRITICAL_PRIORITY
    }

    /// Whether nothing but cgroups told evictd about this pod (see
    /// [`PodSnapshot::unknown`]).
    pub(crate) fn metadata_missing(&self) -> bool {
        !self.unknown.is_empty()
    }

    /// Whether any eviction may choose this pod.
    pub fn is_evictable(&self) -> bool {
        !self.is_critical() && !self.hosts_evictd
    }

    /// The QoS class as Kubernetes derives it (`resources::qos_class`).
    /// A pod whose containers are unknown (found in cgroups only) takes the
    /// class its cgroup path shows.
    pub fn qos_class(&self) -> QosClass {
        if self.containers.is_empty()
            && let Some(qos) = self.cgroup_qos
        {
            return qos;
        }
        resources::qos_class(self)
    }

    /// The pod's request for `resource`, in whole units, as kubelet's
    /// eviction ranking sees it ([`resources::request`]).
    pub fn request(&self, resource: &str) -> i64 {
        resources::request(self, resource).map_or(0, |quantity| quantity.value())
    }
}
