//! Thresholds of one scope, the level a value is at, and the band the kernel
//! watches around that level.
use evictd_common::Band;

/// Most thresholds one scope carries (kubelet has a hard and a soft
/// threshold per signal; two more leave room for tiered alerts).
pub const MAX_THRESHOLDS: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    /// Ascending, without duplicates.
    thresholds: Vec<u64>,
    /// A level is left only once the value is this far below its threshold
    /// (at most half the threshold, so a small threshold can still be left).
    hysteresis: u64,
}

impl Levels {
    /// `thresholds` in any order; duplicates are merged.
    pub fn new(mut thresholds: Vec<u64>, hysteresis: u64) -> Self {
        thresholds.sort_unstable();
        thresholds.dedup();
        Self {
            thresholds,
            hysteresis,
        }
    }

    pub(crate) fn thresholds(&self) -> &[u64] {
        &self.thresholds
    }

    /// Below this value a crossed `threshold` counts as left.
    fn release(&self, threshold: u64) -> u64 {
        threshold - self.hysteresis.min(threshold / 2)
    }

    /// The level `value` is at, coming from `current`: the number of
    /// thresholds crossed. Rising past threshold `i` needs `value >= t[i]`;
    /// falling back below it needs `value < t[i] - hysteresis`. Between the
    /// two the level does not move, so a value hovering at a line is one
    /// crossing, not a stream.
    pub(crate) fn next_level(&self, current: usize, value: u64) -> usize {
        let current = current.min(self.thresholds.len());
        let reached = self.thresholds.iter().filter(|t| value >= **t).count();
        let held = self
            .thresholds
            .iter()
            .filter(|t| value >= self.release(**t))
            .count();
        if reached > current {
            reached
        } else if held < current {
            held
        } else {
            current
        }
    }

    /// The threshold a move from `old` to `new` crossed: the highest one
    /// reached when rising, the lowest one left when falling.
    pub(crate) fn crossed(&self, old: usize, new: usize) -> u64 {
        let index = if new > old { new - 1 } else { new };
        self.thresholds.get(index).copied().unwrap_or(0)
    }

    /// The band a value at `level` stays in until `next_level` would move:
    /// what the kernel compares against.
    pub fn band(&self, level: usize, last_value: u64) -> Band {
        Band {
            rise_at: self.thresholds.get(level).copied().unwrap_or(u64::MAX),
            fall_below: match level.checked_sub(1).and_then(|i| self.thresholds.get(i)) {
                Some(threshold) => self.release(*threshold),
                None => 0,
            },
            last_value,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn rises_through_every_threshold_reached_at_once() {
        let levels = Levels::new(vec![300, 100, 200], 10);
        assert_eq!(levels.thresholds(), [100, 200, 300]);
        assert_eq!(levels.next_level(0, 99), 0);
        assert_eq!(levels.next_level(0, 100), 1);
        assert_eq!(levels.next_level(0, 250), 2);
        assert_eq!(levels.next_level(1, 1000), 3);
    }

    #[test]
    fn falls_only_past_the_hysteresis_band() {
        let levels = Levels::new(vec![100, 200], 10);
        assert_eq!(levels.next_level(1, 95), 1, "inside the band: stays");
        assert_eq!(
            levels.next_level(1, 90),
            1,
            "exactly at the band edge: stays"
        );
        assert_eq!(levels.next_level(1, 89), 0);
        assert_eq!(levels.next_level(2, 150), 1);
        assert_eq!(levels.next_level(2, 0), 0);
    }

    #[test]
    fn hovering_at_the_line_changes_level_once() {
        let levels = Levels::new(vec![1000], 50);
        let mut level = 0;
        let mut changes = 0;
        for value in [999, 1000, 990, 1001, 960, 1000, 955, 1002] {
            let next = levels.next_level(level, value);
            changes += usize::from(next != level);
            level = next;
        }
        assert_eq!((changes, level), (1, 1));
    }

    #[test]
    fn hysteresis_is_at_most_half_the_threshold() {
        let levels = Levels::new(vec![10], 16);
        assert_eq!(levels.next_level(1, 5), 1);
        assert_eq!(levels.next_level(1, 4), 0);
        assert_eq!(levels.band(1, 0).fall_below, 5);
    }

    #[test]
    fn crossed_names_the_line() {
        let levels = Levels::new(vec![100, 200, 300], 0);
        assert_eq!(levels.crossed(0, 2), 200);
        assert_eq!(levels.crossed(2, 1), 200);
        assert_eq!(levels.crossed(1, 0), 100);
    }

    #[test]
    fn bands_bracket_each_level() {
        let levels = Levels::new(vec![100, 200], 10);
        assert_eq!(
            (levels.band(0, 5).fall_below, levels.band(0, 5).rise_at),
            (0, 100)
        );
        assert_eq!(
            (levels.band(1, 5).fall_below, levels.band(1, 5).rise_at),
            (90, 200)
        );
        assert_eq!(
            (levels.band(2, 5).fall_below, levels.band(2, 5).rise_at),
            (190, u64::MAX)
        );
    }

    proptest! {
        /// The kernel's band and the agent's levels agree: a value inside the
        /// band of a level keeps that level, one outside it moves it.
        #[test]
        fn band_matches_next_level(
            mut thresholds in prop::collection::vec(0u64..10_000, 0..=MAX_THRESHOLDS),
            hysteresis in 0u64..500,
            level in 0usize..=MAX_THRESHOLDS,
            value in 0u64..12_000,
        ) {
            thresholds.sort_unstable();
            thresholds.dedup();
            let levels = Levels::new(thresholds, hysteresis);
            let level = level.min(levels.thresholds().len());
            let inside = levels.band(level, 0).contains(value);
            prop_assert_eq!(inside, levels.next_level(level, value) == level);
        }
    }
}
