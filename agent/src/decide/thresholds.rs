//! Eviction signals and thresholds with kubelet's names and meanings
//! (`pkg/kubelet/eviction/api`), and their parsing from kubelet's flags and
//! KubeletConfiguration fields.
use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Serialize};

use crate::decide::layout::DiskLayout;

/// An eviction signal, named as kubelet names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    ContainerFsAvailable,
    ContainerFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub(crate) const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The resource reclaimed when this signal's threshold is met
    /// (kubelet's `signalToResource`).
    pub(crate) fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    /// The node condition reported while this signal's threshold is met
    /// (kubelet's `signalToNodeCondition`).
    pub(crate) fn node_condition(self) -> NodeCondition {
        match self.resource() {
            Resource::Memory => NodeCondition::MemoryPressure,
            Resource::EphemeralStorage | Resource::Inodes => NodeCondition::DiskPressure,
            Resource::Pids => NodeCondition::PidPressure,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported eviction signal {0:?}; expected one of memory.available, allocatableMemory.available, nodefs.available, nodefs.inodesFree, imagefs.available, imagefs.inodesFree, containerfs.available, containerfs.inodesFree, pid.available"
)]
pub struct UnknownSignal(pub String);

impl FromStr for Signal {
    type Err = UnknownSignal;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Signal::ALL
            .into_iter()
            .find(|signal| signal.as_str() == text)
            .ok_or_else(|| UnknownSignal(text.to_owned()))
    }
}

impl Serialize for Signal {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What a pod is ranked by and what an eviction reclaims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Memory,
    Pids,
    EphemeralStorage,
    Inodes,
}

impl Resource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Pids => "pids",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
        }
    }

    /// Whether it is counted in bytes (Kubernetes writes those with binary
    /// suffixes, "100Mi") rather than in tasks or inodes ("20k").
    pub(crate) fn in_bytes(self) -> bool {
        matches!(self, Resource::Memory | Resource::EphemeralStorage)
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Resource {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[expect(
    clippy::enum_variant_names,
    reason = "kubelet's condition names, as the API shows them"
)]
pub(crate) enum NodeCondition {
    MemoryPressure,
    DiskPressure,
    PidPressure,
}

impl NodeCondition {
    pub(crate) const ALL: [NodeCondition; 3] = [
        NodeCondition::MemoryPressure,
        NodeCondition::DiskPressure,
        NodeCondition::PidPressure,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "MemoryPressure",
            NodeCondition::DiskPressure => "DiskPressure",
            NodeCondition::PidPressure => "PIDPressure",
        }
    }
}

impl fmt::Display for NodeCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for NodeCondition {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A threshold's value: an absolute quantity or a share of the signal's
/// capacity. The percentage is an `f32` fraction, as in kubelet, so
/// thresholds resolve to the same byte as kubelet's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThresholdValue {
    /// Exact integer value: bytes for memory and disk, a count for inodes
    /// and PIDs.
    Quantity(i64),
    /// "10%" is 0.1.
    Percentage(f32),
}

impl ThresholdValue {
    /// The value against a capacity, as kubelet's `GetThresholdQuantity`:
    /// `int64(float64(capacity) * float64(percentage))`.
    pub(crate) fn resolve(self, capacity: i64) -> i64 {
        match self {
            ThresholdValue::Quantity(value) => value,
            ThresholdValue::Percentage(fraction) => (capacity as f64 * f64::from(fraction)) as i64,
        }
    }
}

/// kubelet supports one operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operator {
    LessThan,
}

/// One eviction threshold. A hard threshold has a zero grace period. Read
/// back (a decision record's) from what `evictd thresholds` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "PrintedThreshold")]
pub struct Threshold {
    pub signal: Signal,
    pub operator: Operator,
    pub value: ThresholdValue,
    #[serde(rename = "grace_period_seconds", serialize_with = "whole_seconds")]
    pub grace_period: Duration,
    /// `{"quantity": 0}` when not configured, as the contract prints it.
    pub min_reclaim: ThresholdValue,
    /// kubelet's `isHardEvictionThreshold`: no grace period. A soft
    /// threshold given 0s is hard too: it evicts with no pod grace period.
    #[serde(skip)]
    pub hard: bool,
}

/// A threshold as printed: `hard` is its zero grace period.
#[derive(Deserialize)]
struct PrintedThreshold {
    signal: Signal,
    operator: Operator,
    value: ThresholdValue,
    grace_period_seconds: u64,
    min_reclaim: ThresholdValue,
}

impl From<PrintedThreshold> for Threshold {
    fn from(printed: PrintedThreshold) -> Self {
        Self {
            signal: printed.signal,
            operator: printed.operator,
            value: printed.value,
            grace_period: Duration::from_secs(printed.grace_period_seconds),
            min_reclaim: printed.min_reclaim,
            hard: printed.grace_period_seconds == 0,
        }
    }
}

fn whole_seconds<S: serde::Serializer>(
    period: &Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(period.as_secs())
}

/// kubelet's default `evictionPressureTransitionPeriod`, also what a zero
/// one in a KubeletConfiguration file becomes.
pub const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(5 * 60);

/// Everything the engine needs from configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    pub thresholds: Vec<Threshold>,
    /// `--eviction-max-pod-grace-period`: a soft eviction gives a pod
    /// min(its own termination grace period, this). kubelet's default is 0.
    pub max_pod_grace_period: Duration,
    /// `--eviction-pressure-transition-period`: how long a node condition
    /// stays after its last threshold stopped being met.
    pub pressure_transition_period: Duration,
}

/// Thresholds for the tests of the stages below the command line, as
/// config resolves kubelet's flags.
#[cfg(test)]
impl EvictionConfig {
    /// `thresholds` with kubelet's default periods.
    pub(crate) fn of(thresholds: Vec<Threshold>) -> Self {
        Self {
            thresholds,
            max_pod_grace_period: Duration::ZERO,
            pressure_transition_period: DEFAULT_PRESSURE_TRANSITION_PERIOD,
        }
    }
}

#[cfg(test)]
impl Threshold {
    /// `signal<value`, met at once: what `--eviction-hard` gives.
    pub(crate) fn hard(signal: Signal, value: ThresholdValue) -> Self {
        Self::soft(signal, value, Duration::ZERO)
    }

    /// `signal<value`, met once it held for `grace_period`: what
    /// `--eviction-soft` with `--eviction-soft-grace-period` gives.
    pub(crate) fn soft(signal: Signal, value: ThresholdValue, grace_period: Duration) -> Self {
        Self {
            signal,
            operator: Operator::LessThan,
            value,
            grace_period,
            min_reclaim: ThresholdValue::Quantity(0),
            hard: grace_period.is_zero(),
        }
    }

    /// `--eviction-hard memory.available<bytes` as kubelet takes it: with
    /// the pods' allocatable memory enforced (its default), a copy guards
    /// the pods' cgroup too.
    pub(crate) fn hard_memory_available(bytes: i64) -> [Self; 2] {
        [Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable]
            .map(|signal| Self::hard(signal, ThresholdValue::Quantity(bytes)))
    }
}

/// kubelet's `UpdateContainerFsThresholds`, which it applies once it knows
/// the layout: the containerfs thresholds are not the user's to choose.
/// They are copies of nodefs's (one filesystem, or writable layers on
/// nodefs beside a split imagefs) or of imagefs's (a dedicated imagefs,
/// which holds the writable layers), hard from hard and soft from soft
/// (with its grace period), bytes from bytes and inodes from inodes, with
/// the value and minimum reclaim. A containerfs threshold the user set is
/// replaced where it stands ([`containerfs_conflicts`] says so); the others
/// are appended, in kubelet's order. Where the layout's source has no such
/// threshold, kubelet copies an empty one: a value of 0, below which no
/// filesystem's availability falls, so it is never met.
///
/// The list's length does not depend on the layout, so a threshold keeps
/// its place when the layout becomes known.
pub(crate) fn with_containerfs_thresholds(
    thresholds: &[Threshold],
    layout: DiskLayout,
) -> Vec<Threshold> {
    let (bytes, inodes) = match layout {
        DiskLayout::DedicatedImageFs => (Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
        DiskLayout::Shared | DiskLayout::SplitImageFs => {
            (Signal::NodeFsAvailable, Signal::NodeFsInodesFree)
        }
    };
    let mut result = thresholds.to_vec();
    for (target, source) in [
        (Signal::ContainerFsAvailable, bytes),
        (Signal::ContainerFsInodesFree, inodes),
    ] {
        for hard in [true, false] {
            // kubelet's loop keeps the last of each kind it sees.
            let copied = thresholds
                .iter()
                .rev()
                .find(|t| t.signal == source && t.hard == hard);
            let derived = match copied {
                Some(source) => Threshold {
                    signal: target,
                    grace_period: if hard {
                        Duration::ZERO
                    } else {
                        source.grace_period
                    },
                    ..source.clone()
                },
                None => Threshold {
                    signal: target,
                    operator: Operator::LessThan,
                    value: ThresholdValue::Quantity(0),
                    grace_period: Duration::ZERO,
                    min_reclaim: ThresholdValue::Quantity(0),
                    hard: true,
                },
            };
            match thresholds
                .iter()
                .rposition(|t| t.signal == target && t.hard == hard)
            {
                Some(index) => result[index] = derived,
                None => result.push(derived),
            }
        }
    }
    result
}

/// What kubelet's `UpdateContainerFsThresholds` reports of each containerfs
/// threshold the user set, which it ignores: its error text, e.g. `found
/// containerfs.available for hard eviction. ignoring`.
pub(crate) fn containerfs_conflicts(thresholds: &[Threshold]) -> Vec<String> {
    thresholds
        .iter()
        .filter(|t| {
            matches!(
                t.signal,
                Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree
            )
        })
        .map(|t| {
            let kind = if t.hard { "hard" } else { "soft" };
            format!("found {} for {kind} eviction. ignoring", t.signal)
        })
        .collect()
}
