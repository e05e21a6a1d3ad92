//! kubelet's local-storage limit evictions
//! (pkg/kubelet/eviction/eviction_manager.go `localStorageEviction`,
//! `emptyDirLimitEviction`, `podEphemeralStorageLimitEviction`,
//! `containerEphemeralStorageLimitEviction`; messages from helpers.go),
//! which run before any threshold is looked at and need no node pressure:
//!
//! 1. an emptyDir volume using more than its `sizeLimit`;
//! 2. the pod using more ephemeral storage (writable layers, logs, local
//!    volumes, etc-hosts) than its ephemeral-storage limit, as kubelet's
//!    `PodLimits` aggregates it (init containers, sidecars, overhead);
//! 3. a container whose logs (and writable layer, without a dedicated
//!    imagefs) exceed its own ephemeral-storage limit.
//!
//! The first that applies evicts the pod, with kubelet's one-second grace
//! period (`immediateEvictionGracePeriodSeconds`), even if the node is
//! under no pressure at all.
//!
//! evictd adds one case kubelet does not have, because kubelet's walk has
//! no bounds and every capability: a limit the pod's usage could not be
//! measured against whole ([`LocalStorageViolation::Unmeasured`]). What
//! was seen is within it, the rest is unknown, and a pod that hides usage
//! (a directory evictd cannot read, more entries or deeper trees than the
//! walk takes) must not escape its own limit by it. A walk cut short only
//! by time is the node's slowness, not the pod's doing: not judged then.
use std::collections::BTreeMap;

use serde::Serialize;

use super::disk_usage::{Incomplete, PodDiskUsage};
use crate::{
    decide::reason::PodLimit,
    decide::{resources, snapshot::PodSnapshot},
    quantity::Quantity,
};

const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// A running pod over one of its local-storage limits.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LocalStorageEviction {
    pub pod: PodSnapshot,
    pub violation: LocalStorageViolation,
}

/// Why a pod is evicted for its local storage.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum LocalStorageViolation {
    EmptyDir {
        volume: String,
        #[serde(serialize_with = "as_text")]
        limit: Quantity,
        used_bytes: u64,
    },
    Pod {
        #[serde(serialize_with = "as_text")]
        limit: Quantity,
        used_bytes: u64,
    },
    Container {
        container: String,
        #[serde(serialize_with = "as_text")]
        limit: Quantity,
        used_bytes: u64,
    },
    /// The emptyDir `volume`'s limit, or the pod's (`None`), which its
    /// usage could not be measured against whole: `used_bytes` were seen.
    Unmeasured {
        volume: Option<String>,
        #[serde(serialize_with = "as_text")]
        limit: Quantity,
        used_bytes: u64,
        reason: Incomplete,
    },
}

fn as_text<S: serde::Serializer>(quantity: &Quantity, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(quantity)
}

impl LocalStorageViolation {
    /// kubelet's message for the pod's status and event, word for word
    /// (`emptyDirMessageFmt`, `podEphemeralStorageMessageFmt`,
    /// `containerEphemeralStorageMessageFmt`), trailing space included.
    pub fn message(&self) -> String {
        match self {
            Self::EmptyDir { volume, limit, .. } => format!(
                "Usage of EmptyDir volume {} exceeds the limit {}. ",
                go_quote(volume),
                go_quote(&limit.to_string())
            ),
            Self::Pod { limit, .. } => format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {limit}. "
            ),
            Self::Container {
                container, limit, ..
            } => format!(
                "Container {container} exceeded its local ephemeral storage limit {}. ",
                go_quote(&limit.to_string())
            ),
            Self::Unmeasured {
                volume: Some(volume),
                limit,
                used_bytes,
                reason,
            } => format!(
                "Usage of EmptyDir volume {} could not be measured whole ({}): at least {used_bytes} bytes, against the limit {}. ",
                go_quote(volume),
                why(*reason),
                go_quote(&limit.to_string())
            ),
            Self::Unmeasured {
                volume: None,
                limit,
                used_bytes,
                reason,
            } => format!(
                "Pod ephemeral local storage usage could not be measured whole ({}): at least {used_bytes} bytes, against the total limit of containers {limit}. ",
                why(*reason)
            ),
        }
    }

    /// The limit outgrown.
    pub(crate) fn limit(&self) -> PodLimit {
        match self {
            Self::EmptyDir { .. }
            | Self::Unmeasured {
                volume: Some(_), ..
            } => PodLimit::EmptyDir,
            Self::Pod { .. } | Self::Unmeasured { volume: None, .. } => {
                PodLimit::PodEphemeralStorage
            }
            Self::Container { .. } => PodLimit::Container,
        }
    }

    /// The signal kubelet counts the eviction under in its
    /// `evictions_total` metric.
    pub(crate) fn signal(&self) -> &'static str {
        self.limit().signal()
    }

    /// The limit exceeded and what was measured against it.
    pub(crate) fn limit_and_use(&self) -> (Quantity, u64) {
        match self {
            Self::EmptyDir {
                limit, used_bytes, ..
            }
            | Self::Pod { limit, used_bytes }
            | Self::Container {
                limit, used_bytes, ..
            }
            | Self::Unmeasured {
                limit, used_bytes, ..
            } => (*limit, *used_bytes),
        }
    }
}

/// Why a walk fell short, for an eviction message.
fn why(reason: Incomplete) -> &'static str {
    match reason {
        Incomplete::Unreadable => "a directory evictd cannot read",
        Incomplete::Entries => "more files than evictd counts",
        Incomplete::Depth => "directories nested deeper than evictd walks",
        Incomplete::Time => "too slow to walk",
    }
}

/// Go's `%q` for the names and quantities kubelet quotes (printable ASCII:
/// DNS labels and quantity strings), escaping what Go escapes there.
fn go_quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c if c.is_ascii_graphic() || c == ' ' => quoted.push(c),
            c => quoted.push_str(&c.escape_unicode().to_string()),
        }
    }
    quoted.push('"');
    quoted
}

/// Whether `pod` sets a limit its local storage is held to: only such pods
/// need their disk measured for [`evaluate`]. A container's own limit is
/// part of the pod's ([`resources::ephemeral_storage_limit`]).
pub fn has_limit(pod: &PodSnapshot) -> bool {
    pod.empty_dirs
        .iter()
        .filter_map(|volume| volume.size_limit)
        .any(|limit| is_positive(&limit))
        || resources::ephemeral_storage_limit(pod).is_some()
}

/// The pods among `pods` over a local-storage limit, by the runtime's
/// reading `usage` (by pod uid); a pod the reading does not hold is not
/// judged.
pub(crate) fn violations(
    pods: Vec<PodSnapshot>,
    usage: &BTreeMap<String, PodDiskUsage>,
    dedicated_imagefs: bool,
) -> Vec<LocalStorageEviction> {
    pods.into_iter()
        .filter_map(|pod| {
            let measured = usage.get(&pod.uid)?;
            let violation = evaluate(&pod, measured, dedicated_imagefs)?;
            Some(LocalStorageEviction { pod, violation })
        })
        .collect()
}

/// The local-storage eviction of one pod, if any: kubelet's order
/// (emptyDir, then pod, then container) and its comparisons (strictly more
/// than the limit) on what was measured, then the limits it could not be
/// measured against whole (`unmeasured`). `dedicated_imagefs` is
/// kubelet's: with one, writable layers do not count against a container's
/// own limit, which only regular containers are held to
/// (`containerEphemeralStorageLimitEviction`).
pub fn evaluate(
    pod: &PodSnapshot,
    usage: &PodDiskUsage,
    dedicated_imagefs: bool,
) -> Option<LocalStorageViolation> {
    exceeded(pod, usage, dedicated_imagefs).or_else(|| unmeasured(pod, usage))
}

fn exceeded(
    pod: &PodSnapshot,
    usage: &PodDiskUsage,
    dedicated_imagefs: bool,
) -> Option<LocalStorageViolation> {
    for volume in &pod.empty_dirs {
        let (Some(limit), Some(used)) = (volume.size_limit, usage.empty_dir(&volume.name)) else {
            continue;
        };
        if is_positive(&limit) && exceeds(used.bytes, &limit) {
            return Some(LocalStorageViolation::EmptyDir {
                volume: volume.name.clone(),
                limit,
                used_bytes: used.bytes,
            });
        }
    }
    if let Some(limit) = resources::ephemeral_storage_limit(pod) {
        let used = usage.ephemeral_storage_bytes();
        if exceeds(used, &limit) {
            return Some(LocalStorageViolation::Pod {
                limit,
                used_bytes: used,
            });
        }
    }
    for measured in &usage.containers {
        let Some(limit) = pod
            .containers
            .iter()
            .find(|c| c.name == measured.name)
            .and_then(|c| c.limits.get(EPHEMERAL_STORAGE))
            .filter(|limit| limit.value() != 0)
        else {
            continue;
        };
        let mut used = measured.logs.map_or(0, |logs| logs.bytes);
        if !dedicated_imagefs {
            used = used.saturating_add(measured.rootfs.map_or(0, |rootfs| rootfs.bytes));
        }
        if exceeds(used, limit) {
            return Some(LocalStorageViolation::Container {
                container: measured.name.clone(),
                limit: *limit,
                used_bytes: used,
            });
        }
    }
    None
}

/// The first limit, in kubelet's order, that the pod's usage could not be
/// measured against whole, unless only time cut the walk short.
fn unmeasured(pod: &PodSnapshot, usage: &PodDiskUsage) -> Option<LocalStorageViolation> {
    let reason = usage.incomplete.as_ref()?.shortfall.reason;
    if reason == Incomplete::Time {
        return None;
    }
    for volume in &pod.empty_dirs {
        let Some(limit) = volume.size_limit.filter(is_positive) else {
            continue;
        };
        if !usage.empty_dir_whole(&volume.name) {
            return Some(LocalStorageViolation::Unmeasured {
                volume: Some(volume.name.clone()),
                limit,
                used_bytes: usage.empty_dir(&volume.name).map_or(0, |used| used.bytes),
                reason,
            });
        }
    }
    resources::ephemeral_storage_limit(pod).map(|limit| LocalStorageViolation::Unmeasured {
        volume: None,
        limit,
        used_bytes: usage.ephemeral_storage_bytes(),
        reason,
    })
}

fn is_positive(quantity: &Quantity) -> bool {
    !quantity.is_zero() && !quantity.is_negative()
}

/// `used > limit`, exactly as Kubernetes compares quantities.
fn exceeds(used: u64, limit: &Quantity) -> bool {
    let used = Quantity::from_units(i64::try_from(used).unwrap_or(i64::MAX), true);
    used > *limit
}

#[cfg(test)]
mod tests;
