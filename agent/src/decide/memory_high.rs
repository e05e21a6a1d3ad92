//! KEP-5986's per-container memory pressure (kubelet gate
//! `MemoryHighEviction`, alpha planned for Kubernetes 1.37), out of tree:
//! each container's cgroup v2 `memory.events` `high` and `max` counts as
//! rates per second between two readings, and its `memory.pressure` `some`
//! avg10; any of them past its threshold (0: off, the default) puts the
//! pod under pressure. Once that has lasted the grace period:
//!
//! 1. If a container's `high` rate is past its threshold and its
//!    `memory.high` is below its `memory.max`, its `memory.high` is raised
//!    to `memory.max` (stage 1), and the pod has another grace period to
//!    recover.
//! 2. Otherwise (only `max` or PSI past, or the pressure outlasted the
//!    relaxation) the pod is evicted (stage 2).
//!
//! The grace restarts only when every signal of every container of the pod
//! is back under its threshold; a pod that recovered and comes under
//! pressure again starts at stage 1 again (what a runtime that rewrote
//! `memory.high` meanwhile gets).
use std::{collections::BTreeMap, time::Duration};

/// The KEP's four settings (its KubeletConfiguration names without the
/// `Memory` prefix); a threshold of 0 is off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MemoryHighThresholds {
    /// `MemoryHighEvictionThreshold`: memory.events `high` per second.
    pub high_rate: f64,
    /// `MemoryMaxEvictionThreshold`: memory.events `max` per second.
    pub max_rate: f64,
    /// `MemoryPSIEvictionThreshold`: memory.pressure `some` avg10, percent.
    pub psi_some_avg10: f64,
    /// `MemoryPressureEvictionGracePeriod`.
    pub grace: Duration,
}

impl MemoryHighThresholds {
    /// Every threshold off: what the KEP and evictd default to.
    pub(crate) const OFF: Self = Self {
        high_rate: 0.0,
        max_rate: 0.0,
        psi_some_avg10: 0.0,
        grace: Duration::from_secs(30),
    };

    pub(crate) fn enabled(&self) -> bool {
        self.high_rate > 0.0 || self.max_rate > 0.0 || self.psi_some_avg10 > 0.0
    }
}

/// One container's files, read at `read_at_ns`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ContainerReading {
    pub read_at_ns: u64,
    /// memory.events `high` and `max`: times the cgroup went over its
    /// memory.high (and was throttled) or reached its memory.max.
    pub high_events: u64,
    pub max_events: u64,
    /// memory.pressure `some avg10=`; `None` on a kernel without PSI.
    pub some_avg10: Option<f64>,
    /// memory.high and memory.max in bytes; `None` is `max` (no limit).
    pub memory_high: Option<u64>,
    pub memory_max: Option<u64>,
}

impl ContainerReading {
    /// Whether raising memory.high to memory.max would lift anything.
    pub(crate) fn relaxable(&self) -> bool {
        match (self.memory_high, self.memory_max) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(high), Some(max)) => high < max,
        }
    }
}

/// A container's signals between two readings, each with whether it is
/// past its threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ContainerSignals {
    pub high_rate: f64,
    pub max_rate: f64,
    pub some_avg10: Option<f64>,
    pub high_past: bool,
    pub max_past: bool,
    pub psi_past: bool,
    /// The largest ratio of a signal past its threshold to the threshold:
    /// the KEP's last ranking key.
    pub worst_ratio: f64,
}

impl ContainerSignals {
    /// The signals from `before` to `now`; `None` when a counter went
    /// backwards (the container's cgroup was made again) or no time passed.
    pub(crate) fn between(
        before: &ContainerReading,
        now: &ContainerReading,
        thresholds: &MemoryHighThresholds,
    ) -> Option<Self> {
        let window_ns = now.read_at_ns.checked_sub(before.read_at_ns)?;
        if window_ns == 0 {
            return None;
        }
        let seconds = window_ns as f64 / 1e9;
        let high_rate = now.high_events.checked_sub(before.high_events)? as f64 / seconds;
        let max_rate = now.max_events.checked_sub(before.max_events)? as f64 / seconds;
        let past = |value: f64, threshold: f64| threshold > 0.0 && value > threshold;
        let high_past = past(high_rate, thresholds.high_rate);
        let max_past = past(max_rate, thresholds.max_rate);
        let psi_past = now
            .some_avg10
            .is_some_and(|avg10| past(avg10, thresholds.psi_some_avg10));
        let ratio = |is_past: bool, value: f64, threshold: f64| {
            if is_past { value / threshold } else { 0.0 }
        };
        let worst_ratio = ratio(high_past, high_rate, thresholds.high_rate)
            .max(ratio(max_past, max_rate, thresholds.max_rate))
            .max(ratio(
                psi_past,
                now.some_avg10.unwrap_or(0.0),
                thresholds.psi_some_avg10,
            ));
        Some(Self {
            high_rate,
            max_rate,
            some_avg10: now.some_avg10,
            high_past,
            max_past,
            psi_past,
            worst_ratio,
        })
    }

    pub(crate) fn past(&self) -> bool {
        self.high_past || self.max_past || self.psi_past
    }

    /// What a person is told about this container.
    pub(crate) fn describe(&self) -> String {
        let psi = self.some_avg10.map_or(String::new(), |avg10| {
            format!(", PSI some avg10 {avg10:.2}%")
        });
        format!(
            "memory.high hit {:.1}/s, memory.max hit {:.1}/s{psi}",
            self.high_rate, self.max_rate
        )
    }
}

/// Where a pod stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct PodPressure {
    /// When the current grace period started (the pressure's first
    /// reading, or the relaxation); `None` while no signal is past.
    since_ns: Option<u64>,
    /// Stage 1 was taken in this episode of pressure.
    relaxed: bool,
}

/// What to do with a pod now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// No signal past, or the grace has not run out.
    Wait,
    /// Stage 1: raise these containers' memory.high to their memory.max.
    Relax(Vec<String>),
    /// Stage 2: evict the pod; its worst signal ratio ranks it.
    Evict { worst_ratio: f64 },
    /// Every signal back under its threshold after stage 1 was taken: the
    /// episode is over (the KEP clears its pod condition then).
    Recovered,
}

impl PodPressure {
    /// The step for a pod whose containers read `signals` (by container,
    /// with each one's reading now) at `now_ns`.
    pub(crate) fn judge(
        &mut self,
        signals: &BTreeMap<String, (ContainerSignals, ContainerReading)>,
        grace: Duration,
        now_ns: u64,
    ) -> Step {
        if !signals.values().any(|(signals, _)| signals.past()) {
            let relaxed = self.relaxed;
            *self = Self::default();
            return if relaxed { Step::Recovered } else { Step::Wait };
        }
        let since = *self.since_ns.get_or_insert(now_ns);
        if now_ns.saturating_sub(since) < grace.as_nanos() as u64 {
            return Step::Wait;
        }
        if !self.relaxed {
            let throttled: Vec<String> = signals
                .iter()
                .filter(|(_, (signals, reading))| signals.high_past && reading.relaxable())
                .map(|(container, _)| container.clone())
                .collect();
            if !throttled.is_empty() {
                self.relaxed = true;
                self.since_ns = Some(now_ns);
                return Step::Relax(throttled);
            }
        }
        let worst_ratio = signals
            .values()
            .map(|(signals, _)| signals.worst_ratio)
            .fold(0.0, f64::max);
        Step::Evict { worst_ratio }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const SECOND_NS: u64 = 1_000_000_000;
    const GRACE: Duration = Duration::from_secs(20);

    fn thresholds() -> MemoryHighThresholds {
        MemoryHighThresholds {
            high_rate: 1.0,
            max_rate: 2.0,
            psi_some_avg10: 0.0,
            grace: GRACE,
        }
    }

    /// A container held at a 24 MiB memory.high below a 64 MiB memory.max,
    /// read `at_s` seconds in.
    fn reading(at_s: u64, high_events: u64, max_events: u64) -> ContainerReading {
        ContainerReading {
            read_at_ns: at_s * SECOND_NS,
            high_events,
            max_events,
            some_avg10: Some(12.5),
            memory_high: Some(24 * MIB),
            memory_max: Some(64 * MIB),
        }
    }

    fn signals(
        before: ContainerReading,
        now: ContainerReading,
    ) -> BTreeMap<String, (ContainerSignals, ContainerReading)> {
        let signals = ContainerSignals::between(&before, &now, &thresholds()).unwrap();
        BTreeMap::from([("app".to_owned(), (signals, now))])
    }

    #[test]
    fn rates_are_events_a_second_and_only_a_set_threshold_is_ever_past() {
        let found =
            ContainerSignals::between(&reading(0, 0, 0), &reading(10, 50, 10), &thresholds())
                .unwrap();
        assert_eq!((found.high_rate, found.max_rate), (5.0, 1.0));
        assert!(found.high_past && !found.max_past);
        // PSI's threshold is 0: off, whatever the avg10.
        assert!(!found.psi_past);
        assert_eq!(found.worst_ratio, 5.0);
        assert!(!MemoryHighThresholds::OFF.enabled());
    }

    #[test]
    fn counters_that_went_backwards_or_no_time_give_no_signal() {
        let thresholds = thresholds();
        assert_eq!(
            ContainerSignals::between(&reading(0, 90, 0), &reading(10, 5, 0), &thresholds),
            None
        );
        assert_eq!(
            ContainerSignals::between(&reading(10, 0, 0), &reading(10, 90, 0), &thresholds),
            None
        );
    }

    #[test]
    fn a_throttled_container_is_relaxed_after_the_grace_then_evicted_if_pressure_persists() {
        let mut pod = PodPressure::default();
        let at = |s: u64| s * SECOND_NS;
        let throttled = |s: u64| signals(reading(s - 10, 100 * s, 0), reading(s, 100 * s + 500, 0));
        assert_eq!(pod.judge(&throttled(10), GRACE, at(10)), Step::Wait);
        assert_eq!(pod.judge(&throttled(20), GRACE, at(20)), Step::Wait);
        assert_eq!(
            pod.judge(&throttled(30), GRACE, at(30)),
            Step::Relax(vec!["app".to_owned()])
        );
        // The relaxation has a grace of its own.
        assert_eq!(pod.judge(&throttled(40), GRACE, at(40)), Step::Wait);
        assert_eq!(
            pod.judge(&throttled(50), GRACE, at(50)),
            Step::Evict { worst_ratio: 50.0 }
        );
    }

    #[test]
    fn a_pod_that_recovers_after_stage_1_is_said_recovered_once_and_starts_again_at_stage_1() {
        let mut pod = PodPressure::default();
        let at = |s: u64| s * SECOND_NS;
        let throttled = signals(reading(0, 0, 0), reading(10, 500, 0));
        let calm = signals(reading(0, 0, 0), reading(10, 5, 0));
        assert_eq!(pod.judge(&throttled, GRACE, at(10)), Step::Wait);
        assert!(matches!(
            pod.judge(&throttled, GRACE, at(30)),
            Step::Relax(_)
        ));
        assert_eq!(pod.judge(&calm, GRACE, at(40)), Step::Recovered);
        // Said once: the next calm reading is no news.
        assert_eq!(pod.judge(&calm, GRACE, at(45)), Step::Wait);
        assert_eq!(pod.judge(&throttled, GRACE, at(50)), Step::Wait);
        assert!(matches!(
            pod.judge(&throttled, GRACE, at(70)),
            Step::Relax(_)
        ));
    }

    #[test]
    fn only_max_past_or_nothing_to_relax_goes_straight_to_eviction() {
        let at = |s: u64| s * SECOND_NS;
        let mut pod = PodPressure::default();
        let at_max = signals(reading(0, 0, 0), reading(10, 0, 100));
        assert_eq!(pod.judge(&at_max, GRACE, at(10)), Step::Wait);
        assert_eq!(
            pod.judge(&at_max, GRACE, at(30)),
            Step::Evict { worst_ratio: 5.0 }
        );
        // memory.high already at memory.max: raising it lifts nothing.
        let mut pod = PodPressure::default();
        let now = ContainerReading {
            memory_high: Some(64 * MIB),
            ..reading(10, 500, 0)
        };
        let unrelaxable = signals(reading(0, 0, 0), now);
        assert_eq!(pod.judge(&unrelaxable, GRACE, at(10)), Step::Wait);
        assert!(matches!(
            pod.judge(&unrelaxable, GRACE, at(30)),
            Step::Evict { .. }
        ));
    }

    #[test]
    fn no_memory_high_is_not_relaxable_and_no_memory_max_is() {
        let unset = ContainerReading {
            memory_high: None,
            ..reading(0, 0, 0)
        };
        assert!(!unset.relaxable());
        let unlimited = ContainerReading {
            memory_max: None,
            ..reading(0, 0, 0)
        };
        assert!(unlimited.relaxable());
    }
}
