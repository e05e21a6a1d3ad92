//! Waiting for a condition with a deadline, never a bare sleep.
use std::{
    fmt, io,
    time::{Duration, Instant},
};

/// How often [`wait_until`] re-checks: short against the kernel's own
/// latencies (RCU grace periods, OOM kills), cheap for cgroupfs reads.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// A condition did not hold within its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeout {
    /// What was awaited, as the caller described it.
    pub what: String,
    pub waited: Duration,
}

impl fmt::Display for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}",
            self.waited, self.what
        )
    }
}

impl std::error::Error for Timeout {}

impl From<Timeout> for io::Error {
    fn from(timeout: Timeout) -> Self {
        io::Error::new(io::ErrorKind::TimedOut, timeout)
    }
}

/// Polls `condition` every [`POLL_INTERVAL`] until it holds or `deadline`
/// has passed. The condition is checked at least once, and once more at the
/// deadline, so a zero deadline means "is it true now".
pub fn wait_until(
    deadline: Duration,
    what: &str,
    mut condition: impl FnMut() -> bool,
) -> Result<(), Timeout> {
    let start = Instant::now();
    loop {
        if condition() {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= deadline {
            return Err(Timeout {
                what: what.to_owned(),
                waited,
            });
        }
        std::thread::sleep(POLL_INTERVAL.min(deadline - waited));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_as_soon_as_the_condition_holds() {
        let mut calls = 0;
        wait_until(Duration::from_secs(5), "the third call", || {
            calls += 1;
            calls == 3
        })
        .unwrap();
        assert_eq!(calls, 3);
    }

    #[test]
    fn times_out_naming_what_was_awaited() {
        let err = wait_until(Duration::from_millis(20), "pigs to fly", || false).unwrap_err();
        assert_eq!(err.what, "pigs to fly");
        assert!(err.waited >= Duration::from_millis(20));
        assert!(err.to_string().contains("pigs to fly"));
        assert_eq!(io::Error::from(err).kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn a_zero_deadline_checks_once() {
        let mut calls = 0;
        let result = wait_until(Duration::ZERO, "nothing", || {
            calls += 1;
            false
        });
        assert!(result.is_err());
        assert_eq!(calls, 1);
    }
}
