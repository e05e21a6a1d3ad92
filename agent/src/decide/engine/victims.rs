//! Which ranked pods one decision evicts: kubelet's one pod per round, or
//! (--evict-set) the smallest set that covers the deficit at once.
use std::time::Duration;

use crate::decide::{rank::Ranked, reason::KillReason};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum VictimPolicy {
    /// kubelet's: the first evictable pod in the ranking, then observe
    /// again.
    #[default]
    One,
    /// The fewest evictable pods whose combined usage of the starved
    /// resource covers the deficit to threshold + minimum reclaim.
    CoveringSet,
}

/// A decision: every pod in eviction order, and who goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Choice {
    pub ranking: Vec<Ranked>,
    /// In ranking order.
    pub victims: Vec<Victim>,
    /// What must come back to reach threshold + minimum reclaim; `None`
    /// when nothing is starved.
    pub deficit: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Victim {
    /// `namespace/name`.
    pub pod: String,
    /// Index of the pod in the slice given to `choose`.
    pub index: usize,
    /// Usage of the starved resource, as ranked.
    pub usage: i64,
    /// How long the pod gets between SIGTERM and SIGKILL.
    pub grace_period: Duration,
    pub reason: KillReason,
}

/// Positions in `ranking` of the pods to evict, in ranking order.
pub(super) fn select(ranking: &[Ranked], deficit: i64, policy: VictimPolicy) -> Vec<usize> {
    let evictable = ranking
        .iter()
        .enumerate()
        .filter(|(_, ranked)| ranked.evictable);
    match policy {
        VictimPolicy::One => evictable.map(|(position, _)| position).take(1).collect(),
        VictimPolicy::CoveringSet => {
            let candidates: Vec<(usize, i64)> = evictable
                .map(|(position, ranked)| (position, ranked.usage.max(0)))
                .collect();
            covering_set(&candidates, deficit)
        }
    }
}

/// Of `(position, usage)` candidates in ranking order, the fewest whose
/// usages sum to at least `deficit`; among sets that small, the earliest in
/// ranking order (lexicographically by position). No set covers: all.
fn covering_set(candidates: &[(usize, i64)], deficit: i64) -> Vec<usize> {
    let mut largest: Vec<i64> = candidates.iter().map(|&(_, usage)| usage).collect();
    largest.sort_unstable_by(|a, b| b.cmp(a));
    // The fewest pods that can cover are the largest ones.
    let size = if deficit <= 0 {
        0
    } else {
        let mut sum = 0i64;
        let last = largest.iter().position(|&usage| {
            sum = sum.saturating_add(usage);
            sum >= deficit
        });
        match last {
            Some(last) => last + 1,
            None => return candidates.iter().map(|&(position, _)| position).collect(),
        }
    };
    // Greedy in ranking order: take a candidate if the set can still be
    // completed with the largest usages after it.
    let mut chosen = Vec::with_capacity(size);
    let mut needed = deficit;
    for (at, &(position, usage)) in candidates.iter().enumerate() {
        let slots = size - chosen.len();
        if slots == 0 {
            break;
        }
        let mut rest: Vec<i64> = candidates[at + 1..].iter().map(|&(_, u)| u).collect();
        rest.sort_unstable_by(|a, b| b.cmp(a));
        let best_rest = rest
            .iter()
            .take(slots - 1)
            .fold(0i64, |sum, &u| sum.saturating_add(u));
        if usage.saturating_add(best_rest) >= needed {
            chosen.push(position);
            needed = needed.saturating_sub(usage);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn candidates(usages: &[i64]) -> Vec<(usize, i64)> {
        usages.iter().copied().enumerate().collect()
    }

    #[test]
    fn one_big_pod_beats_two_earlier_small_ones() {
        assert_eq!(covering_set(&candidates(&[3, 3, 7]), 6), vec![2]);
    }

    #[test]
    fn the_earliest_of_equally_small_sets_wins() {
        assert_eq!(covering_set(&candidates(&[1, 5, 4, 5]), 9), vec![1, 2]);
        assert_eq!(covering_set(&candidates(&[5, 1, 5]), 10), vec![0, 2]);
    }

    #[test]
    fn nothing_covers_so_everyone_goes() {
        assert_eq!(covering_set(&candidates(&[1, 2]), 10), vec![0, 1]);
    }

    #[test]
    fn no_deficit_needs_no_victim() {
        assert!(covering_set(&candidates(&[1, 2]), 0).is_empty());
    }

    fn sum(usages: &[i64], chosen: &[usize]) -> i64 {
        chosen.iter().map(|&i| usages[i]).sum()
    }

    proptest! {
        /// The set covers, nothing smaller does, and no equally small set
        /// comes earlier in ranking order.
        #[test]
        fn covering_set_is_minimal_and_earliest(
            usages in prop::collection::vec(0i64..100, 0..9),
            deficit in 1i64..400,
        ) {
            let chosen = covering_set(&candidates(&usages), deficit);
            let n = usages.len();
            let covers = |mask: u32| {
                (0..n).filter(|i| mask & (1 << i) != 0).map(|i| usages[i]).sum::<i64>() >= deficit
            };
            let best = (0u32..1 << n)
                .filter(|&mask| covers(mask))
                .map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).collect::<Vec<_>>())
                .min_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
            match best {
                Some(best) => {
                    prop_assert!(sum(&usages, &chosen) >= deficit);
                    prop_assert_eq!(chosen, best);
                }
                None => prop_assert_eq!(chosen, (0..n).collect::<Vec<_>>()),
            }
        }
    }
}
