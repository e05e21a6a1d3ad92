//! `--memory-signal reclaimable`: the node's active file pages counted as
//! available memory while its file refaults show them cold.
//!
//! kubelet's working set (usage less inactive file) keeps active file
//! pages as used, though the kernel reclaims them under pressure like any
//! cache (kubernetes#43916): a pod that read a large file twice can push
//! memory.available past a threshold while nothing is short of memory.
//! The rule: over the last `COLD_WINDOW`, the node refaulted at most
//! [`COLD_REFAULT_PERCENT`] % of its active file pages (the kernel's
//! `workingset_refault_file`: evicted file pages read back while still in
//! the working set's reach). Then the active file is counted available
//! and left out of the working set (the node's, and each pod's for its
//! rank: `ColdCache::counted`); otherwise, and until a whole window has
//! been seen, nothing is (kubelet's signal).
//!
//! Its limit: a refault needs a reclaim first, so active pages the node
//! has never had to reclaim read as cold however hot they are, until
//! reclaim takes some and they come back; from then on, a window later,
//! they count as used again. The kernel's lines move with the reading,
//! so a switch from cold to hot is seen at the next engine run (at most
//! a resync away), not by the kernel.
use std::{
    collections::VecDeque,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use tracing::info;

use crate::{
    logs,
    node::{cgroupfs::FileCache, stats::page_size},
};

/// How far back the refaults are counted.
pub(crate) const COLD_WINDOW: Duration = Duration::from_secs(10);

/// The refaults in a window, as a percentage of the active file pages, at
/// or below which those pages are cold. Not 0: any node refaults some
/// pages (a binary's text evicted by an earlier reclaim, read back as it
/// runs: 1,024 pages in 10 s beside a 384 MiB file in
/// `tests/tests/reclaimable.rs`, which 1 % took for a hot cache).
pub const COLD_REFAULT_PERCENT: u64 = 10;

/// The node's refault counter over the last window.
#[derive(Debug, Default)]
pub struct ColdCache {
    state: Mutex<History>,
}

#[derive(Debug, Default)]
struct History {
    /// Readings of the refault counter, oldest first.
    samples: VecDeque<(Instant, u64)>,
    /// What the last reading decided, for the log's transitions.
    cold: Option<bool>,
}

/// A copy keeps no history: it reads its own windows.
impl Clone for ColdCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl ColdCache {
    /// The bytes of active file pages to count as available, given the
    /// node's file cache read at `now`.
    pub(crate) fn reclaimable(&self, now: Instant, cache: FileCache) -> u64 {
        let mut history = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let refaulted = history.refaulted_in_window(now, cache.refaulted_file_pages);
        let active_pages = cache.active_file_bytes / page_size();
        let cold = refaulted.map(|pages| pages * 100 <= active_pages * COLD_REFAULT_PERCENT);
        if cold != history.cold && cold.is_some() {
            info!(
                cold,
                active_file = logs::bytes(cache.active_file_bytes).logged(),
                refaulted_pages = refaulted,
                window = ?COLD_WINDOW,
                "memory.available: the node's active file pages {}",
                if cold == Some(true) {
                    "count as available (--memory-signal reclaimable)"
                } else {
                    "count as used: they refault"
                }
            );
        }
        history.cold = cold;
        match cold {
            Some(true) => cache.active_file_bytes,
            _ => 0,
        }
    }

    /// Whether the last reading counted the node's active file as
    /// available: then a pod's own active file is left out of its working
    /// set too, so that a pod is not ranked first for cache the node
    /// counts as free (killing it would not give that cache back: page
    /// cache stays charged to a pod's cgroup after its processes end).
    pub(crate) fn counted(&self) -> bool {
        let history = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        history.cold == Some(true)
    }
}

impl History {
    /// Takes a reading of the counter; the pages refaulted since the
    /// newest reading at least a window old, `None` while there is none
    /// (or the counter went back: a node cgroup made again).
    fn refaulted_in_window(&mut self, now: Instant, counter: u64) -> Option<u64> {
        if self.samples.back().is_some_and(|&(_, last)| last > counter) {
            self.samples.clear();
        }
        self.samples.push_back((now, counter));
        let window_start = now.checked_sub(COLD_WINDOW)?;
        // Drop what a newer reading at least a window old makes useless.
        while self
            .samples
            .get(1)
            .is_some_and(|&(at, _)| at <= window_start)
        {
            self.samples.pop_front();
        }
        let &(at, then) = self.samples.front()?;
        (at <= window_start).then(|| counter - then)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn cache(active_file_bytes: u64, refaulted_file_pages: u64) -> FileCache {
        FileCache {
            active_file_bytes,
            refaulted_file_pages,
        }
    }

    #[test]
    fn nothing_counts_until_a_whole_window_is_seen_then_cold_active_file_does() {
        let cold = ColdCache::default();
        let start = Instant::now();
        assert_eq!(cold.reclaimable(start, cache(400 * MIB, 1000)), 0);
        let almost = start + COLD_WINDOW - Duration::from_millis(1);
        assert_eq!(cold.reclaimable(almost, cache(400 * MIB, 1000)), 0);
        let whole = start + COLD_WINDOW;
        assert!(!cold.counted());
        assert_eq!(cold.reclaimable(whole, cache(400 * MIB, 1000)), 400 * MIB);
        assert!(cold.counted());
    }

    #[test]
    fn refaults_past_the_limit_in_the_window_make_it_used_again() {
        let cold = ColdCache::default();
        let start = Instant::now();
        let active = 400 * MIB;
        let limit = active / page_size() * COLD_REFAULT_PERCENT / 100;
        cold.reclaimable(start, cache(active, 0));
        let at = |s| start + COLD_WINDOW + Duration::from_secs(s);
        assert_eq!(cold.reclaimable(at(0), cache(active, limit)), active);
        assert_eq!(cold.reclaimable(at(1), cache(active, limit + 1)), 0);
        // A window after the refaults stopped, cold again.
        assert_eq!(cold.reclaimable(at(2), cache(active, limit + 1)), 0);
        assert_eq!(
            cold.reclaimable(at(1) + COLD_WINDOW, cache(active, limit + 1)),
            active
        );
    }

    #[test]
    fn a_counter_that_goes_back_starts_a_new_window() {
        let cold = ColdCache::default();
        let start = Instant::now();
        cold.reclaimable(start, cache(400 * MIB, 5000));
        let later = start + COLD_WINDOW;
        assert_eq!(cold.reclaimable(later, cache(400 * MIB, 10)), 0);
        assert_eq!(
            cold.reclaimable(later + COLD_WINDOW, cache(400 * MIB, 10)),
            400 * MIB
        );
    }
}
