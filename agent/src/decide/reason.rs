//! Why a pod is killed, one type from the decision to every report of the
//! kill (its log line, the `reason` label of `evictd_evictions_total`, the
//! pod's `Evicted` event and its report journal, the pre-kill hook), as
//! Android's lmkd records one of its typed kill reasons.
use crate::decide::{rank::Ranked, thresholds::Signal};

/// Why a pod is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KillReason {
    /// A node eviction threshold on this signal was met (kubelet's
    /// synchronize), and the ranking's usage or priority chose the pod.
    Threshold(Signal),
    /// `pid.available`'s threshold was met and the pod went first because
    /// it forks fastest (`--pid-ranking fork-rate`): without its fork rate
    /// another pod of its priority would have gone before it or beside it.
    ForkRate,
    /// The pod outgrew one of its own local-storage limits (kubelet's
    /// `localStorageEviction`); no threshold need be met.
    PodLimit(PodLimit),
    /// The pod thrashed at its own memory limit (`--thrashing-eviction`,
    /// [`crate::decide::thrashing`]); no threshold need be met.
    Thrashing,
    /// The pod's containers stayed under memory pressure past the grace
    /// period (KEP-5986's stage 2, [`crate::decide::memory_high`]); no
    /// threshold need be met.
    ContainerMemoryPressure,
}

/// The local-storage limit a pod outgrew, each under kubelet's signal name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PodLimit {
    /// An emptyDir volume's `sizeLimit` (`emptyDirLimitEviction`).
    EmptyDir,
    /// The sum of the containers' ephemeral-storage limits
    /// (`podEphemeralStorageLimitEviction`).
    PodEphemeralStorage,
    /// One container's ephemeral-storage limit
    /// (`containerEphemeralLimitEviction`).
    Container,
}

impl PodLimit {
    /// The signal kubelet counts the eviction under in its
    /// `evictions_total` metric.
    pub(crate) fn signal(self) -> &'static str {
        match self {
            Self::EmptyDir => "emptydirfs.limit",
            Self::PodEphemeralStorage => "ephemeralpodfs.limit",
            Self::Container => "ephemeralcontainerfs.limit",
        }
    }
}

impl KillReason {
    /// The kind of reason: the `reason` label of the eviction metric, the
    /// hook's `EVICTD_REASON`, the event's annotation.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Threshold(_) => "threshold",
            Self::ForkRate => "fork-rate",
            Self::PodLimit(_) => "pod-limit",
            Self::Thrashing => "thrashing",
            Self::ContainerMemoryPressure => "container-memory-pressure",
        }
    }

    /// The signal the kill answers, kubelet's name for it.
    pub(crate) fn signal(self) -> &'static str {
        match self {
            Self::Threshold(signal) => signal.as_str(),
            Self::ForkRate => Signal::PidAvailable.as_str(),
            Self::PodLimit(limit) => limit.signal(),
            // Evicted as kubelet evicts for memory: the resource it lacks.
            Self::Thrashing => Signal::MemoryAvailable.as_str(),
            // The KEP's label for its evictions in kubelet_evictions.
            Self::ContainerMemoryPressure => "memory.high.pressure",
        }
    }

    /// Why the pod at `position` of `ranking` is killed for a threshold on
    /// `signal`: the fork rate when the ranking looked at it
    /// ([`Ranked::fork_rate`], `--pid-ranking fork-rate` only) and it put
    /// the pod ahead of an evictable pod of the same priority (kubelet's
    /// order ranks those by process count alone); else the threshold.
    pub(crate) fn for_threshold(signal: Signal, ranking: &[Ranked], position: usize) -> Self {
        let victim = &ranking[position];
        let forks_faster = |other: &Ranked| {
            other.evictable
                && other.known == victim.known
                && other.priority == victim.priority
                && other.fork_rate < victim.fork_rate
        };
        if ranking[position + 1..].iter().any(forks_faster) {
            Self::ForkRate
        } else {
            Self::Threshold(signal)
        }
    }
}
