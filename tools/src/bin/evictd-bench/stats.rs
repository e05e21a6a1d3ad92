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

/// A median and, from 6 values on, its 95 % confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub median: f64,
    /// The interval's lower and upper value.
    pub ci95: Option<(f64, f64)>,
}

/// The median of `values` with a distribution-free 95 % confidence
/// interval: from the k-th smallest to the k-th largest value
/// ([`interval_rank`]). It needs no assumption about the noise's shape,
/// which on a shared machine has a long tail.
pub fn median_with_ci(values: &[f64]) -> Option<Estimate> {
    let median = median(values)?;
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    Some(Estimate {
        median,
        ci95: interval_rank(n).map(|k| (sorted[k - 1], sorted[n - k])),
    })
}

/// The rank k of a 95 % interval of the median of `n` values, the k-th
/// smallest to the k-th largest: the largest k with P(Binomial(n, ½) < k)
/// ≤ 2.5 % (the 6th and 15th of 20). Below 6 values even the extremes
/// cover less than 95 %, so there is none.
pub fn interval_rank(n: usize) -> Option<usize> {
    // P(X = i) in logarithms, so that no factor under- or overflows.
    let mut ln_probability = -(n as f64) * std::f64::consts::LN_2;
    let mut below = 0.0;
    let mut k = 0;
    for i in 0..n / 2 {
        below += ln_probability.exp();
        if below > 0.025 {
            break;
        }
        k = i + 1;
        ln_probability += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
    }
    (k > 0).then_some(k)
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

    #[test]
    fn the_median_of_twenty_is_bracketed_by_the_sixth_and_fifteenth_value() {
        let twenty: Vec<f64> = (1..=20).rev().map(f64::from).collect();
        assert_eq!(
            median_with_ci(&twenty),
            Some(Estimate {
                median: 10.0,
                ci95: Some((6.0, 15.0))
            })
        );
        // Six values: P(all on one side) = 1/32, so only the extremes.
        let six = [3.0, 1.0, 2.0, 6.0, 5.0, 4.0];
        assert_eq!(median_with_ci(&six).unwrap().ci95, Some((1.0, 6.0)));
        // Five: no interval; none at all: no median.
        let five = [3.0, 1.0, 2.0, 5.0, 4.0];
        assert_eq!(median_with_ci(&five).unwrap().ci95, None);
        assert_eq!(median_with_ci(&[]), None);
        // A hundred: P(X ≤ 39) = 1.8 %, P(X ≤ 40) = 2.8 %.
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(median_with_ci(&hundred).unwrap().ci95, Some((40.0, 61.0)));
        // A hundred and one: P(X ≤ 40) = 2.3 %, P(X ≤ 41) = 3.6 %.
        assert_eq!(interval_rank(101), Some(41));
    }
}
