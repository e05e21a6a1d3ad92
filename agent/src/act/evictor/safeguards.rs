//! What keeps evictd from a runaway or a loop: the eviction budget, the
//! back-off of a pod whose kill failed, the hold on a signal whose
//! pressure turned out to be outside the pods, and the hold on a disk
//! decision while the runtime cannot say what the pods use. Pure state
//! over the loop's clock (nanoseconds), so each rule is unit-tested with
//! made-up times.
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    fmt,
    str::FromStr,
    time::Duration,
};

use tracing::{debug, info, warn};

use crate::{
    decide::snapshot::PodSnapshot,
    decide::{engine::Assessment, thresholds::Signal},
    duration,
    metrics::Metrics,
};

/// The first back-off of a pod whose kill failed: kubelet's housekeeping
/// interval, the soonest kubelet itself would try again.
const BACKOFF_FIRST: Duration = Duration::from_secs(10);
/// Back-offs double up to this.
const BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);
/// How often a disk decision held for unknown disk usage is logged again.
const DISK_UNKNOWN_LOG_PERIOD: Duration = Duration::from_secs(60);

/// At most `count` evictions started per `period` (`--eviction-budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictionBudget {
    pub count: u32,
    pub period: Duration,
}

impl fmt::Display for EvictionBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:?}", self.count, self.period)
    }
}

impl FromStr for EvictionBudget {
    type Err = String;

    /// `COUNT/DURATION`, e.g. `10/1m`: COUNT at least 1, DURATION positive.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{text:?} is not COUNT/DURATION (e.g. 10/1m) with COUNT ≥ 1");
        let (count, period) = text.split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        let period = duration::parse(period.trim()).map_err(|e| format!("{text:?}: {e}"))?;
        if count == 0 || period.is_zero() {
            return Err(bad());
        }
        Ok(Self { count, period })
    }
}

#[derive(Debug, Clone, Copy)]
struct Backoff {
    until_ns: u64,
    delay: Duration,
}

#[derive(Debug)]
pub(super) struct Safeguards {
    budget: EvictionBudget,
    /// When each eviction in the budget's period started.
    spent: VecDeque<u64>,
    /// Until when the budget's exhaustion has been logged.
    budget_logged_until: u64,
    /// Until when a disk decision held for unknown disk usage has been
    /// logged.
    disk_unknown_logged_until: u64,
    backoff: HashMap<String, Backoff>,
    /// Signals held back, until when.
    holds: BTreeMap<Signal, u64>,
}

impl Safeguards {
    pub(super) fn new(budget: EvictionBudget) -> Self {
        Self {
            budget,
            spent: VecDeque::new(),
            budget_logged_until: 0,
            disk_unknown_logged_until: 0,
            backoff: HashMap::new(),
            holds: BTreeMap::new(),
        }
    }

    /// A disk decision for `signal` with the runtime configured but the
    /// pods' disk usage unknown (the runtime is down, or its last reading
    /// failed): held, counted, logged once a minute. Ranked on no usage,
    /// the lowest-priority pod would go whatever it writes; kubelet's own
    /// disk eviction stands in meanwhile.
    pub(super) fn hold_disk_unknown(&mut self, signal: Signal, now_ns: u64, metrics: &Metrics) {
        metrics
            .evictions_held
            .with_label_values(&["disk-usage-unknown"])
            .inc();
        if now_ns >= self.disk_unknown_logged_until {
            self.disk_unknown_logged_until = now_ns + DISK_UNKNOWN_LOG_PERIOD.as_nanos() as u64;
            warn!(signal = %signal,
                "disk threshold met but the container runtime cannot say what the pods use: no eviction for it until it can (kubelet's own disk eviction stands in)");
        }
    }

    /// How many evictions may start now; once the budget is spent, how long
    /// until the next may (counted and logged, once per period).
    pub(super) fn room(&mut self, now_ns: u64, metrics: &Metrics) -> Result<usize, Duration> {
        let period = self.budget.period.as_nanos() as u64;
        while self
            .spent
            .front()
            .is_some_and(|&at| now_ns.saturating_sub(at) >= period)
        {
            self.spent.pop_front();
        }
        let room = (self.budget.count as usize).saturating_sub(self.spent.len());
        if room > 0 {
            return Ok(room);
        }
        let oldest = self.spent.front().copied().unwrap_or(now_ns);
        let wait = Duration::from_nanos((oldest + period).saturating_sub(now_ns));
        metrics.evictions_held.with_label_values(&["budget"]).inc();
        if now_ns >= self.budget_logged_until {
            self.budget_logged_until = oldest + period;
            warn!(budget = %self.budget, next_in_ms = wait.as_millis() as u64,
                "eviction budget spent: no more evictions until the oldest leaves the period (--eviction-budget)");
        }
        Err(wait.max(Duration::from_millis(1)))
    }

    pub(super) fn spend(&mut self, now_ns: u64) {
        self.spent.push_back(now_ns);
    }

    /// Counts evictions a previous agent started `ago` before `now_ns`
    /// (oldest first), those within the budget's period, as if this agent
    /// had started them.
    pub(super) fn restore(&mut self, ago: &[Duration], now_ns: u64) {
        for ago in ago.iter().filter(|ago| **ago < self.budget.period) {
            let ago = u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX);
            self.spent.push_back(now_ns.saturating_sub(ago));
        }
    }

    /// How long before `now_ns` each eviction counted in the budget
    /// started, oldest first.
    pub(super) fn spent_ago(&self, now_ns: u64) -> impl Iterator<Item = Duration> + '_ {
        self.spent
            .iter()
            .map(move |&at| Duration::from_nanos(now_ns.saturating_sub(at)))
    }

    /// A kill of pod `uid` failed: it is left alone for a back-off that
    /// doubles with each failure. Returns the back-off.
    pub(super) fn failed(&mut self, uid: &str, now_ns: u64) -> Duration {
        let delay = self
            .backoff
            .get(uid)
            .map_or(BACKOFF_FIRST, |b| (b.delay * 2).min(BACKOFF_MAX));
        self.backoff.insert(
            uid.to_owned(),
            Backoff {
                until_ns: now_ns + delay.as_nanos() as u64,
                delay,
            },
        );
        delay
    }

    pub(super) fn succeeded(&mut self, uid: &str) {
        self.backoff.remove(uid);
    }

    /// Whether `pod` waits out a back-off now. Its failures are remembered
    /// past the back-off, so the next one lasts longer.
    pub(super) fn backing_off(&self, pod: &PodSnapshot, now_ns: u64) -> bool {
        let waiting = self
            .backoff
            .get(&pod.uid)
            .is_some_and(|b| now_ns < b.until_ns);
        if waiting {
            debug!(pod = %pod.key(), "skipped: backing off after a failed kill");
        }
        waiting
    }

    /// Holds evictions for `signal` for a budget period: the pressure is not
    /// in the pods. Returns the hold.
    pub(super) fn hold_outside(
        &mut self,
        signal: Signal,
        now_ns: u64,
        metrics: &Metrics,
    ) -> Duration {
        let hold = self.budget.period;
        self.holds.insert(signal, now_ns + hold.as_nanos() as u64);
        metrics
            .pressure_outside_pods
            .with_label_values(&[signal.as_str()])
            .set(1);
        metrics
            .evictions_held
            .with_label_values(&["outside-pods"])
            .inc();
        hold
    }

    /// Whether evictions for `signal` are held now.
    pub(super) fn held(&mut self, signal: Signal, now_ns: u64) -> bool {
        match self.holds.get(&signal) {
            Some(&until) if now_ns < until => true,
            Some(_) => {
                info!(%signal, "hold over: one more eviction may show whether the pods cause the pressure");
                self.holds.remove(&signal);
                false
            }
            None => false,
        }
    }

    /// Ends the holds of signals whose thresholds are no longer met.
    pub(super) fn release(&mut self, assessment: &Assessment, metrics: &Metrics) {
        let met = assessment.signals_met();
        self.holds.retain(|signal, _| {
            let keep = met.contains(signal);
            if !keep {
                metrics
                    .pressure_outside_pods
                    .with_label_values(&[signal.as_str()])
                    .set(0);
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn budget(text: &str) -> EvictionBudget {
        text.parse().unwrap()
    }

    #[test]
    fn a_budget_is_count_per_duration() {
        assert_eq!(
            budget("10/1m"),
            EvictionBudget {
                count: 10,
                period: Duration::from_secs(60)
            }
        );
        for bad in ["10", "0/1m", "10/0s", "x/1m", "10/soon"] {
            let err = bad.parse::<EvictionBudget>().unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn the_budget_refuses_once_spent_until_the_oldest_leaves_the_period() {
        let metrics = Metrics::new().unwrap();
        let mut guards = Safeguards::new(budget("2/10s"));
        assert_eq!(guards.room(0, &metrics), Ok(2));
        guards.spend(0);
        guards.spend(SECOND);
        assert_eq!(
            guards.room(2 * SECOND, &metrics),
            Err(Duration::from_secs(8))
        );
        assert_eq!(guards.room(10 * SECOND, &metrics), Ok(1));
        assert_eq!(
            metrics.evictions_held.with_label_values(&["budget"]).get(),
            1
        );
    }

    #[test]
    fn backoffs_double_up_to_the_bound_and_end_with_a_success() {
        let mut guards = Safeguards::new(budget("10/1m"));
        let pod = PodSnapshot {
            uid: "u".into(),
            ..crate::testing::fakes::pod("p", 1)
        };
        assert_eq!(guards.failed("u", 0), BACKOFF_FIRST);
        assert!(guards.backing_off(&pod, SECOND));
        assert!(!guards.backing_off(&pod, 11 * SECOND));
        assert_eq!(guards.failed("u", 11 * SECOND), BACKOFF_FIRST * 2);
        for _ in 0..10 {
            guards.failed("u", 0);
        }
        assert_eq!(guards.failed("u", 0), BACKOFF_MAX);
        guards.succeeded("u");
        assert!(!guards.backing_off(&pod, 0));
    }

    #[test]
    fn a_hold_lasts_a_budget_period_and_a_recovered_signal_ends_it() {
        let metrics = Metrics::new().unwrap();
        let mut guards = Safeguards::new(budget("10/1m"));
        let signal = Signal::MemoryAvailable;
        assert_eq!(
            guards.hold_outside(signal, 0, &metrics),
            Duration::from_secs(60)
        );
        assert!(guards.held(signal, 59 * SECOND));
        assert!(!guards.held(signal, 60 * SECOND), "one more try after it");
        guards.hold_outside(signal, 0, &metrics);
        let gauge = metrics
            .pressure_outside_pods
            .with_label_values(&[signal.as_str()]);
        assert_eq!(gauge.get(), 1);
        let recovered = Assessment {
            now: Duration::ZERO,
            observations: BTreeMap::new(),
            thresholds_met: Vec::new(),
            node_conditions: Vec::new(),
            starvation: None,
            starved: Vec::new(),
            layout: crate::decide::layout::DiskLayout::Shared,
        };
        guards.release(&recovered, &metrics);
        assert_eq!(gauge.get(), 0);
        assert!(!guards.held(signal, SECOND));
    }
}
