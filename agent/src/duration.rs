//! Durations written as Go's `time.ParseDuration` writes them ("10s", "5m",
//! "1m30s", "250ms"), since kubelet's flags and config use that form.
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("duration {text:?}: {reason}")]
pub struct DurationError {
    pub text: String,
    pub reason: &'static str,
}

/// Parses a non-negative Go duration. "0" alone is allowed, as in Go.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let fail = |reason| DurationError {
        text: text.to_owned(),
        reason,
    };
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.starts_with('-') {
        return Err(fail("must not be negative"));
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.is_empty() {
        return Err(fail("empty"));
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or(fail("missing unit (ns, us, ms, s, m, h)"))?;
        let (number, tail) = rest.split_at(number_len);
        let value: f64 = number.parse().map_err(|_| fail("malformed number"))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(fail("unknown unit (use ns, us, ms, s, m, h)")),
        };
        total += value * seconds;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| fail("out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_quoting_the_text() {
        for (text, reason) in [
            ("10", "missing unit"),
            ("-1s", "negative"),
            ("5x", "unknown unit"),
            ("", "empty"),
            ("1..2s", "malformed"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
            assert!(err.reason.contains(reason), "{text}: {err}");
        }
    }
}
