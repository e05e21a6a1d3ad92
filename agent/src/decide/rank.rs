//! Which pod goes first: kubelet's eviction ranking (`rankMemoryPressure`,
//! `rankPIDPressure`, `rankDiskPressureFunc` in
//! pkg/kubelet/eviction/helpers.go) and Kubernetes' QoS classes, with the
//! reason for every pod's place so a decision can be explained.
use std::{borrow::Borrow, cmp::Reverse, fmt, str::FromStr};

use crate::{
    decide::snapshot::{ForkRate, PodSnapshot, PodUsage},
    decide::{
        layout::DiskLayout,
        thresholds::{Resource, Signal},
    },
    quantity::Quantity,
};

/// How PID pressure ranks pods of equal priority.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PidRanking {
    /// kubelet's `rankPIDPressure`: priority, then process count. At equal
    /// priority a pod with many quiet processes goes before a fork bomb
    /// that has fewer so far.
    #[default]
    Kubelet,
    /// Priority, then the pod's recent fork rate (higher first), then
    /// process count: the pod making the pressure goes first.
    ForkRate,
}

impl PidRanking {
    const NAMES: [(&str, Self); 2] = [("kubelet", Self::Kubelet), ("fork-rate", Self::ForkRate)];
}

impl fmt::Display for PidRanking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::NAMES
            .iter()
            .find(|(_, ranking)| ranking == self)
            .map_or("", |(name, _)| name);
        f.write_str(name)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a PID ranking: kubelet or fork-rate")]
pub struct UnknownPidRanking(String);

impl FromStr for PidRanking {
    type Err = UnknownPidRanking;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::NAMES
            .iter()
            .find(|(name, _)| *name == text)
            .map(|(_, ranking)| *ranking)
            .ok_or_else(|| UnknownPidRanking(text.to_owned()))
    }
}

/// Resource names as pod specs spell them.
const MEMORY: &str = "memory";
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// Which of a pod's filesystem usages count against a disk signal: the
/// set of kubelet's `fsStatsType`s that `buildSignalToRankFunc` gives the
/// signal's `rankDiskPressureFunc` for the layout. Some sets also name
/// `fsStatsImages`, which kubelet measures per pod as nothing (its
/// `containerUsage` adds only writable layers and logs): it counts 0 here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskMeasure {
    /// `fsStatsRoot`: the containers' writable layers.
    pub writable_layers: bool,
    /// `fsStatsLogs`: the containers' logs.
    pub logs: bool,
    /// `fsStatsLocalVolumeSource`: the pod's local volumes.
    pub local_volumes: bool,
}

impl DiskMeasure {
    /// Every byte and inode the pod uses.
    pub(crate) const EVERYTHING: Self = Self {
        writable_layers: true,
        logs: true,
        local_volumes: true,
    };
    /// What lives on nodefs beside a dedicated imagefs.
    pub(crate) const LOGS_AND_VOLUMES: Self = Self {
        writable_layers: false,
        logs: true,
        local_volumes: true,
    };
    /// What lives on a dedicated imagefs that holds the writable layers.
    pub(crate) const WRITABLE_LAYERS: Self = Self {
        writable_layers: true,
        logs: false,
        local_volumes: false,
    };
    /// The images alone (a split layout's imagefs): 0 for every pod.
    pub(crate) const IMAGES: Self = Self {
        writable_layers: false,
        logs: false,
        local_volumes: false,
    };

    /// kubelet's `buildSignalToRankFunc(withImageFs, splitContainerImageFs)`
    /// for a disk signal: one filesystem counts everything for every
    /// signal; a dedicated imagefs splits nodefs (logs and volumes) from
    /// imagefs and containerfs (writable layers); a split imagefs leaves
    /// nodefs and containerfs everything the pod writes and imagefs its
    /// images.
    pub(crate) fn for_signal(signal: Signal, layout: DiskLayout) -> Self {
        use Signal::{ImageFsAvailable, ImageFsInodesFree, NodeFsAvailable, NodeFsInodesFree};
        match (layout, signal) {
            (DiskLayout::Shared, _) => Self::EVERYTHING,
            (DiskLayout::DedicatedImageFs, NodeFsAvailable | NodeFsInodesFree) => {
                Self::LOGS_AND_VOLUMES
            }
            (DiskLayout::DedicatedImageFs, _) => Self::WRITABLE_LAYERS,
            (DiskLayout::SplitImageFs, ImageFsAvailable | ImageFsInodesFree) => Self::IMAGES,
            (DiskLayout::SplitImageFs, _) => Self::EVERYTHING,
        }
    }

    /// kubelet's `podDiskUsage` in bytes.
    pub(crate) fn bytes(self, usage: &PodUsage) -> u64 {
        self.sum(
            usage.rootfs_bytes,
            usage.logs_bytes,
            usage.local_volume_bytes,
        )
    }

    /// kubelet's `podDiskUsage` in inodes. A pod whose inodes are not
    /// given apart ranks by its total wherever anything counts.
    pub(crate) fn inodes(self, usage: &PodUsage) -> u64 {
        let split = [
            usage.rootfs_inodes,
            usage.logs_inodes,
            usage.local_volume_inodes,
        ];
        if split.iter().all(Option::is_none) {
            return if self == Self::IMAGES {
                0
            } else {
                usage.inodes
            };
        }
        self.sum(
            usage.rootfs_inodes.unwrap_or(0),
            usage.logs_inodes.unwrap_or(0),
            usage.local_volume_inodes.unwrap_or(0),
        )
    }

    fn sum(self, writable_layers: u64, logs: u64, local_volumes: u64) -> u64 {
        [
            (self.writable_layers, writable_layers),
            (self.logs, logs),
            (self.local_volumes, local_volumes),
        ]
        .into_iter()
        .filter(|(counted, _)| *counted)
        .fold(0u64, |total, (_, value)| total.saturating_add(value))
    }

    /// Whether the measure counts what evictd walks itself (logs and local
    /// volumes), and so whether a walk cut short leaves it a lower bound.
    fn counts_walked_usage(self) -> bool {
        self.logs || self.local_volumes
    }
}

/// One pod's place in a ranking; `Ranked::reason` says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked {
    /// Index of the pod in the slice that was ranked: its name is there
    /// (not copied into every place: a decision names a few pods of many).
    pub index: usize,
    pub priority: i32,
    /// Usage of the starved resource, as kubelet measures it for this signal.
    pub usage: i64,
    /// The request usage is compared with; `None` for PIDs, which kubelet
    /// ranks by priority and count alone.
    pub request: Option<i64>,
    pub exceeds_request: Option<bool>,
    /// Whether any eviction may choose this pod ([`PodSnapshot::is_evictable`]).
    pub evictable: bool,
    /// Whether evictd knows the pod's metadata (see [`rank`]).
    pub known: bool,
    /// Whether `usage` is only a lower bound: the walk of the pod's logs
    /// and volumes fell short ([`PodUsage::disk_incomplete`](crate::decide::snapshot::PodUsage::disk_incomplete)).
    pub usage_incomplete: bool,
    /// The fork rate the pod was ranked by ([`PidRanking::ForkRate`]);
    /// `None` when the ranking does not look at it.
    pub fork_rate: Option<ForkRate>,
    resource: Resource,
    /// Why the pod is never evicted, if its kind says so.
    protection: Option<&'static str>,
    hosts_evictd: bool,
}

impl Ranked {
    /// The pod's standing, for the log line that explains a decision. Made
    /// only for the pods a decision names: a ranking of every pod on a
    /// node must not format a sentence per pod.
    pub(crate) fn reason(&self) -> String {
        let resource = self.resource;
        // As Kubernetes writes quantities: a person reads this.
        let amount = |value: i64| Quantity::from_units(value, resource.in_bytes());
        let usage = amount(self.usage);
        let mut text = match self.request.map(|request| (request, amount(request))) {
            Some((request, shown)) if self.usage > request => {
                format!("{resource} {usage} exceeds request {shown}")
            }
            Some((_, shown)) => format!("{resource} {usage} within request {shown}"),
            None => format!("{resource} {usage}"),
        };
        if let Some(rate) = self.fork_rate {
            text.push_str(&format!(", {:.1} forks/s", rate.per_second()));
        }
        text.push_str(&format!(", priority {}", self.priority));
        if let Some(protection) = self.protection {
            text.push_str("; ");
            text.push_str(protection);
        }
        if self.hosts_evictd {
            text.push_str("; runs evictd, never evicted");
        }
        if !self.known {
            text.push_str("; metadata unknown, after every pod evictd knows");
        }
        if self.usage_incomplete {
            text.push_str(
                "; disk usage at least this (not all of it could be measured), ranked as a pod without stats",
            );
        }
        text
    }
}

/// Every pod in eviction order for a threshold on `signal`, first to evict
/// first. Ties keep the input order.
///
/// kubelet knows every pod it ranks; evictd may not (a pod created while
/// the API was away, say), and a pod found only in cgroups would otherwise
/// rank as priority 0 with no requests, ahead of everything it may really
/// be (a critical DaemonSet pod, a Guaranteed pod within its requests). So
/// pods whose metadata is missing go after every pod evictd knows: not
/// knowing a pod never makes it more likely to die.
///
/// A pod whose disk usage evictd could not measure whole (a directory it
/// cannot read, a walk past its bounds) is the reverse case: it may hide
/// its usage on purpose, so it must never be safer for it. For a disk
/// signal that counts what evictd walks, it is ranked as kubelet ranks a
/// pod it has no stats for (`exceedDiskRequests` and `disk`: "prioritize
/// evicting the pod for which no stats were found"): before every measured
/// pod, then by priority.
///
/// `pid_ranking` orders PID pressure's pods of equal priority; a pod
/// without a fork rate ranks as one that does not fork.
pub fn rank<P: Borrow<PodSnapshot>>(
    pods: &[P],
    signal: Signal,
    layout: DiskLayout,
    pid_ranking: PidRanking,
) -> Vec<Ranked> {
    let mut entries: Vec<(Ranked, i64)> = pods
        .iter()
        .enumerate()
        .map(|(index, pod)| {
            let (mut ranked, key) = measure(index, pod.borrow(), signal, layout);
            if ranked.resource == Resource::Pids && pid_ranking == PidRanking::ForkRate {
                ranked.fork_rate = Some(
                    pod.borrow()
                        .usage
                        .forks_per_second
                        .unwrap_or(ForkRate::NONE),
                );
            }
            (ranked, key)
        })
        .collect();
    // A stable sort keeps the input order among equals: kubelet's
    // sort.Sort is not stable, so its tie order is arbitrary. Keys of plain
    // numbers, made once per pod: the sort moves them, not the entries.
    match signal.resource() {
        Resource::Pids => entries.sort_by_cached_key(|(ranked, usage)| {
            (
                Reverse(ranked.known),
                ranked.priority,
                Reverse(ranked.fork_rate),
                Reverse(*usage),
            )
        }),
        Resource::Memory | Resource::EphemeralStorage | Resource::Inodes => {
            entries.sort_by_cached_key(|(ranked, excess)| {
                // Pods without a whole measure are equal in both usage
                // keys, as kubelet's comparisons of two pods without stats.
                let measured = !ranked.usage_incomplete;
                (
                    Reverse(ranked.known),
                    Reverse(ranked.usage_incomplete),
                    Reverse(measured && ranked.exceeds_request == Some(true)),
                    ranked.priority,
                    Reverse(if measured { *excess } else { 0 }),
                )
            });
        }
    }
    entries.into_iter().map(|(ranked, _)| ranked).collect()
}

/// The pod's explanation and its sort key after "exceeds" and priority:
/// usage over request (memory, disk) or the PID count.
fn measure(index: usize, pod: &PodSnapshot, signal: Signal, layout: DiskLayout) -> (Ranked, i64) {
    let saturate = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    let resource = signal.resource();
    let mut usage_incomplete = false;
    let (usage, request, key) = match resource {
        Resource::Memory => {
            let usage = saturate(pod.usage.memory_working_set_bytes);
            let request = pod.request(MEMORY);
            (usage, Some(request), usage.saturating_sub(request))
        }
        Resource::Pids => {
            let usage = saturate(pod.usage.pids);
            (usage, None, usage)
        }
        Resource::EphemeralStorage => {
            let measure = DiskMeasure::for_signal(signal, layout);
            usage_incomplete = pod.usage.disk_incomplete && measure.counts_walked_usage();
            let usage = saturate(measure.bytes(&pod.usage));
            let request = pod.request(EPHEMERAL_STORAGE);
            (usage, Some(request), usage.saturating_sub(request))
        }
        // Nothing requests inodes, so any use exceeds the (zero) request;
        // kubelet still subtracts the ephemeral-storage request from the
        // inode count for the last key, and so does evictd.
        Resource::Inodes => {
            let measure = DiskMeasure::for_signal(signal, layout);
            usage_incomplete = pod.usage.disk_incomplete && measure.counts_walked_usage();
            let usage = saturate(measure.inodes(&pod.usage));
            let key = usage.saturating_sub(pod.request(EPHEMERAL_STORAGE));
            (usage, Some(0), key)
        }
    };
    let exceeds_request = request.map(|request| usage > request);
    let ranked = Ranked {
        index,
        priority: pod.priority,
        usage,
        request,
        exceeds_request,
        evictable: pod.is_evictable(),
        known: !pod.metadata_missing(),
        usage_incomplete,
        fork_rate: None,
        resource,
        protection: protection(pod),
        hosts_evictd: pod.hosts_evictd,
    };
    (ranked, key)
}

fn protection(pod: &PodSnapshot) -> Option<&'static str> {
    if pod.is_static || pod.mirror {
        Some("static pod, never evicted")
    } else if pod.is_critical() {
        Some("system-critical priority, never evicted")
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
