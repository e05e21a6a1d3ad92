//! A pod thrashing at its own memory limit, judged on two readings of its
//! counters ([`MemoryStalls`]) one window apart: kubelet never acts on it
//! (its memory signals are the node's), Android's lmkd kills on it.
//!
//! The rule: over the window the pod's cgroup met its own memory limit
//! (the kernel's count of charges that hit it grew: v1 `memory.failcnt`,
//! v2 memory.events `max`), and either
//! - its file refaults reached `refault_percent` of its file pages (lmkd's
//!   `thrashing_limit`: refaulted file pages × 100 / the file LRU, 100 by
//!   default), or
//! - all its tasks were stalled on memory (`full` PSI, cgroup v2 only) for
//!   at least `stall_percent` of the window (lmkd's complete stall, 700 ms
//!   a second, is 70).
//!
//! A pod without a memory limit is never judged: what it thrashes against
//! is the node's memory, which memory.available watches. A pod that streams
//! a file once refaults nothing (no page of it comes back), however much it
//! reads: refaults count pages reclaimed and needed again.
use std::time::Duration;

use crate::decide::snapshot::MemoryStalls;

/// What makes a pod at its limit thrashing; the defaults are lmkd's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThrashingLimits {
    /// File pages refaulted in a window, as a percentage of the pod's file
    /// pages.
    pub refault_percent: u64,
    /// The window's share, in percent, all of the pod's tasks stalled on
    /// memory.
    pub stall_percent: u64,
}

impl Default for ThrashingLimits {
    fn default() -> Self {
        Self {
            refault_percent: 100,
            stall_percent: 70,
        }
    }
}

/// A pod found thrashing, and what it was found on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Thrashing {
    pub window: Duration,
    /// File refaults in the window, percent of the file pages.
    pub refaulted_percent: u64,
    /// `full` stall in the window, percent of it (v2).
    pub stalled_percent: Option<u64>,
    pub usage_bytes: u64,
    pub limit_bytes: u64,
}

impl Thrashing {
    /// What a person is told: the numbers against their limits.
    pub(crate) fn describe(&self, limits: ThrashingLimits) -> String {
        let stalled = self.stalled_percent.map_or(String::new(), |stalled| {
            format!(
                ", all its tasks stalled on memory {stalled}% of the time (limit {}%)",
                limits.stall_percent
            )
        });
        format!(
            "Pod was thrashing at its memory limit: charged {}Mi of {}Mi; in {}s it refaulted {}% of its file pages (limit {}%){stalled}. ",
            self.usage_bytes >> 20,
            self.limit_bytes >> 20,
            self.window.as_secs(),
            self.refaulted_percent,
            limits.refault_percent,
        )
    }
}

/// Whether the pod read as `before` then `now` is thrashing over the
/// window between them. Counters that went backwards (a cgroup made again
/// under the same path) or a reading without a limit judge nothing.
pub(crate) fn judge(
    before: &MemoryStalls,
    now: &MemoryStalls,
    page_size: u64,
    limits: ThrashingLimits,
) -> Option<Thrashing> {
    let window_ns = now.read_at_ns.checked_sub(before.read_at_ns)?;
    let limit_bytes = now.limit_bytes?;
    let usage_bytes = now.usage_bytes?;
    let delta =
        |counter: fn(&MemoryStalls) -> Option<u64>| counter(now)?.checked_sub(counter(before)?);
    // Not its charge at the reading: reclaim at the limit takes back
    // megabytes at a time (2 MiB below a 32 MiB limit, measured).
    if window_ns == 0 || delta(|s| s.limit_hits)? == 0 {
        return None;
    }
    let refaulted_bytes = delta(|s| s.workingset_refault_file)?.saturating_mul(page_size);
    // One page's worth at least, so that a pod whose file pages were all
    // reclaimed does not divide by zero.
    let file_bytes = now.file_bytes?.max(page_size);
    let refaulted_percent = refaulted_bytes.saturating_mul(100) / file_bytes;
    let stalled_percent = delta(|s| s.pressure_full_us)
        .map(|stalled_us| stalled_us.saturating_mul(100_000) / window_ns.max(1));
    let thrashing = refaulted_percent >= limits.refault_percent
        || stalled_percent.is_some_and(|stalled| stalled >= limits.stall_percent);
    thrashing.then_some(Thrashing {
        window: Duration::from_nanos(window_ns),
        refaulted_percent,
        stalled_percent,
        usage_bytes,
        limit_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const PAGE: u64 = 4096;
    const SECOND_NS: u64 = 1_000_000_000;

    /// A pod at 64 MiB of a 64 MiB limit with 60 MiB of file pages, read
    /// `at_s` seconds in, having refaulted `refaults` file pages and
    /// stalled `full_us` in all.
    fn reading(at_s: u64, refaults: u64, full_us: Option<u64>) -> MemoryStalls {
        MemoryStalls {
            read_at_ns: at_s * SECOND_NS,
            workingset_refault_file: Some(refaults),
            pressure_full_us: full_us,
            file_bytes: Some(60 * MIB),
            usage_bytes: Some(64 * MIB),
            limit_bytes: Some(64 * MIB),
            limit_hits: Some(at_s * 100),
            ..MemoryStalls::default()
        }
    }

    fn judged(before: MemoryStalls, now: MemoryStalls) -> Option<Thrashing> {
        judge(&before, &now, PAGE, ThrashingLimits::default())
    }

    #[test]
    fn refaulting_its_whole_file_cache_in_a_window_at_its_limit_is_thrashing() {
        let pages = 60 * MIB / PAGE;
        let found = judged(reading(0, 1000, None), reading(10, 1000 + pages, None)).unwrap();
        assert_eq!(found.refaulted_percent, 100);
        assert_eq!(found.window, Duration::from_secs(10));
        assert_eq!(found.stalled_percent, None);
    }

    #[test]
    fn fewer_refaults_or_a_limit_not_met_in_the_window_are_not() {
        let pages = 60 * MIB / PAGE;
        assert_eq!(
            judged(reading(0, 0, None), reading(10, pages / 2, None)),
            None
        );
        // Refaults from the node's reclaim, not its own limit's.
        let roomy = MemoryStalls {
            limit_hits: Some(0),
            ..reading(10, 4 * pages, None)
        };
        assert_eq!(judged(reading(0, 0, None), roomy), None);
    }

    #[test]
    fn a_pod_without_a_limit_is_never_judged() {
        let unlimited = MemoryStalls {
            limit_bytes: None,
            ..reading(10, 1 << 30, Some(10_000_000))
        };
        assert_eq!(judged(reading(0, 0, Some(0)), unlimited), None);
    }

    #[test]
    fn a_full_stall_share_past_its_limit_is_thrashing_without_refaults() {
        let found = judged(reading(0, 0, Some(0)), reading(10, 0, Some(8_000_000))).unwrap();
        assert_eq!(found.stalled_percent, Some(80));
        assert_eq!(
            judged(reading(0, 0, Some(0)), reading(10, 0, Some(6_000_000))),
            None
        );
    }

    #[test]
    fn counters_that_went_backwards_judge_nothing() {
        assert_eq!(judged(reading(0, 5000, None), reading(10, 0, None)), None);
        assert_eq!(
            judged(reading(10, 0, None), reading(10, 1 << 30, None)),
            None
        );
    }

    #[test]
    fn the_description_names_each_figure_and_its_limit() {
        let found = judged(reading(0, 0, Some(0)), reading(10, 0, Some(8_000_000))).unwrap();
        let text = found.describe(ThrashingLimits::default());
        assert!(text.contains("charged 64Mi of 64Mi; in 10s"), "{text}");
        assert!(
            text.contains("refaulted 0% of its file pages (limit 100%)"),
            "{text}"
        );
        assert!(
            text.contains("stalled on memory 80% of the time (limit 70%)"),
            "{text}"
        );
    }
}
