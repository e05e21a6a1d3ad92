//! Which pod goes first: kubelet's eviction ranking (`rankMemoryPressure`,
//! `rankPIDPressure`, `rankDiskPressureFunc` in
//! pkg/kubelet/eviction/helpers.go) and Kubernetes' QoS classes, with the
//! reason for every pod's place so a decision can be explained.
use std::{borrow::Borrow, cmp::Reverse};

use crate::{
    decide::thresholds::{Resource, Signal},
    node::snapshot::PodSnapshot,
};

/// Resource names as pod specs spell them.
const MEMORY: &str = "memory";
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// Which of a pod's filesystem usages count against a disk signal
/// (kubelet's `buildSignalToRankFunc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskMeasure {
    /// No dedicated imagefs: writable layers, logs and local volumes all
    /// live on the one filesystem.
    Everything,
    /// Dedicated imagefs, nodefs signals: logs and local volumes.
    LogsAndVolumes,
    /// Dedicated imagefs, imagefs and containerfs signals: writable layers.
    WritableLayers,
}

impl DiskMeasure {
    /// evictd's snapshots do not say which filesystem a pod's files are on;
    /// like kubelet, an imagefs counts as dedicated when it is a different
    /// filesystem from nodefs, which evictd sees as different statistics.
    pub fn for_signal(signal: Signal, dedicated_imagefs: bool) -> Self {
        match (dedicated_imagefs, signal) {
            (false, _) => DiskMeasure::Everything,
            (true, Signal::NodeFsAvailable | Signal::NodeFsInodesFree) => {
                DiskMeasure::LogsAndVolumes
            }
            (true, _) => DiskMeasure::WritableLayers,
        }
    }

    fn bytes(self, pod: &PodSnapshot) -> u64 {
        let usage = &pod.usage;
        match self {
            DiskMeasure::Everything => usage
                .rootfs_bytes
                .saturating_add(usage.logs_bytes)
                .saturating_add(usage.local_volume_bytes),
            DiskMeasure::LogsAndVolumes => {
                usage.logs_bytes.saturating_add(usage.local_volume_bytes)
            }
            DiskMeasure::WritableLayers => usage.rootfs_bytes,
        }
    }

    /// Whether the measure counts what evictd walks itself (logs and local
    /// volumes), and so whether a walk cut short leaves it a lower bound.
    fn counts_walked_usage(self) -> bool {
        self != DiskMeasure::WritableLayers
    }
}

/// One pod's place in a ranking; [`Ranked::reason`] says why.
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
    /// and volumes fell short ([`PodUsage::disk_incomplete`](crate::node::snapshot::PodUsage::disk_incomplete)).
    pub usage_incomplete: bool,
    resource: Resource,
    /// Why the pod is never evicted, if its kind says so.
    protection: Option<&'static str>,
    hosts_evictd: bool,
}

impl Ranked {
    /// The pod's standing, for the log line that explains a decision. Made
    /// only for the pods a decision names: a ranking of every pod on a
    /// node must not format a sentence per pod.
    pub fn reason(&self) -> String {
        let resource = self.resource;
        let usage = self.usage;
        let mut text = match self.request {
            Some(request) if usage > request => {
                format!("{resource} {usage} exceeds request {request}")
            }
            Some(request) => format!("{resource} {usage} within request {request}"),
            None => format!("{resource} {usage}"),
        };
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
pub fn rank<P: Borrow<PodSnapshot>>(
    pods: &[P],
    signal: Signal,
    dedicated_imagefs: bool,
) -> Vec<Ranked> {
    let mut entries: Vec<(Ranked, i64)> = pods
        .iter()
        .enumerate()
        .map(|(index, pod)| measure(index, pod.borrow(), signal, dedicated_imagefs))
        .collect();
    // A stable sort keeps the input order among equals: kubelet's
    // sort.Sort is not stable, so its tie order is arbitrary. Keys of plain
    // numbers, made once per pod: the sort moves them, not the entries.
    match signal.resource() {
        Resource::Pids => entries.sort_by_cached_key(|(ranked, usage)| {
            (Reverse(ranked.known), ranked.priority, Reverse(*usage))
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
fn measure(index: usize, pod: &PodSnapshot, signal: Signal, dedicated: bool) -> (Ranked, i64) {
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
            let measure = DiskMeasure::for_signal(signal, dedicated);
            usage_incomplete = pod.usage.disk_incomplete && measure.counts_walked_usage();
            let usage = saturate(measure.bytes(pod));
            let request = pod.request(EPHEMERAL_STORAGE);
            (usage, Some(request), usage.saturating_sub(request))
        }
        // Nothing requests inodes, so any use exceeds the (zero) request;
        // kubelet still subtracts the ephemeral-storage request from the
        // inode count for the last key, and so does evictd. Snapshots carry
        // one inode total per pod, used whichever filesystem is starved.
        Resource::Inodes => {
            usage_incomplete = pod.usage.disk_incomplete;
            let usage = saturate(pod.usage.inodes);
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
