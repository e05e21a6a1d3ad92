//! Waiting for a condition with a deadline, never a bare sleep.
use std::{
    fmt, io,
    process::Child,
    time::{Duration, Instant},
};

/// How often [`wait_until`] re-checks: short against the kernel's own
/// latencies (RCU grace periods, OOM kills), cheap for cgroupfs reads.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Environment variable holding a whole factor (at least 1) by which every
/// deadline of the fixtures is stretched. `cargo xtask test --vm` sets it
/// when the guest is emulated (TCG), where everything runs several times
/// slower. Deadlines only bound how long a test may hang; no test asserts
/// speed, so stretching them changes no outcome.
pub const TIME_SCALE_ENV: &str = "EVICTD_TEST_TIME_SCALE";

/// `deadline` stretched by [`TIME_SCALE_ENV`] (unchanged when it is unset
/// or not a whole number of at least 1).
pub fn scaled(deadline: Duration) -> Duration {
    deadline.saturating_mul(time_scale(std::env::var(TIME_SCALE_ENV).ok().as_deref()))
}

fn time_scale(value: Option<&str>) -> u32 {
    value
        .and_then(|text| text.trim().parse::<u32>().ok())
        .filter(|factor| *factor >= 1)
        .unwrap_or(1)
}

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
/// (stretched by [`scaled`]) has passed. The condition is checked at least
/// once, and once more at the deadline, so a zero deadline means "is it
/// true now".
pub fn wait_until(
    deadline: Duration,
    what: &str,
    mut condition: impl FnMut() -> bool,
) -> Result<(), Timeout> {
    let deadline = scaled(deadline);
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

/// Ends a child this process started, `what` by name: SIGTERM, a wait of
/// at most `deadline`, then SIGKILL.
pub(crate) fn stop_child(process: &mut Child, what: &str, deadline: Duration) -> io::Result<()> {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(process.id()).map_err(io::Error::other)?);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let mut exited = false;
    let _ = wait_until(deadline, &format!("{what} to exit"), || {
        exited = !matches!(process.try_wait(), Ok(None));
        exited
    });
    if !exited {
        process.kill()?;
        process.wait()?;
    }
    Ok(())
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
    fn deadlines_are_stretched_by_a_whole_factor_only() {
        assert_eq!(time_scale(Some("3")), 3);
        assert_eq!(time_scale(Some(" 12\n")), 12);
        for ignored in [None, Some("0"), Some("-2"), Some("1.5"), Some("fast")] {
            assert_eq!(time_scale(ignored), 1, "{ignored:?}");
        }
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
