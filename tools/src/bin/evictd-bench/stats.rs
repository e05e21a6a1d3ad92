//! Percentiles as bench.md states them: nearest rank, a run that never got
//! there ranking above every other.

/// The rank (1-based) of the `q` quantile among `n` values: the ⌈q·n⌉-th
/// smallest, at least the first.
pub fn rank(n: usize, q: f64) -> usize {
    ((q * n as f64).ceil() as usize).clamp(1, n.max(1))
}

/// The `q` quantile (nearest rank) of `values`, a missing value ranking
/// above every other (`None` when the quantile falls on one).
pub fn percentile(values: &[Option<f64>], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(b),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    sorted[rank(sorted.len(), q) - 1]
}

/// The median (nearest rank: the lower middle of an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    let values: Vec<Option<f64>> = values.iter().copied().map(Some).collect();
    percentile(&values, 0.5)
}

/// Milliseconds from µs; `never` for a missing value.
pub fn format_ms(us: Option<f64>) -> String {
    match us {
        Some(us) if us.abs() < 10_000.0 => format!("{:.2}", us / 1e3),
        Some(us) => format!("{:.0}", us / 1e3),
        None => "never".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_never_decided_counts_as_later_than_any() {
        let values = [Some(3.0), None, Some(1.0), Some(2.0)];
        assert_eq!(percentile(&values, 0.5), Some(2.0));
        assert_eq!(percentile(&values, 0.75), Some(3.0));
        assert_eq!(percentile(&values, 0.99), None);
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn with_twenty_runs_p90_is_the_third_largest_and_p99_the_largest() {
        let values: Vec<Option<f64>> = (1..=20).map(|v| Some(f64::from(v))).collect();
        assert_eq!(rank(20, 0.5), 10);
        assert_eq!(percentile(&values, 0.5), Some(10.0));
        assert_eq!(percentile(&values, 0.9), Some(18.0));
        assert_eq!(percentile(&values, 0.99), Some(20.0));
        // From 100 runs on, p99 is no longer the maximum.
        assert_eq!(rank(100, 0.99), 99);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.0));
    }
}
