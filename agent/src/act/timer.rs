//! A timerfd the loop waits on: tokio's timer wheel ticks every
//! millisecond, so a shorter sleep lasts one to two of them, and a sleep
//! longer than 64 ms wakes the runtime more than once.
use std::{
    io,
    os::fd::{AsFd as _, AsRawFd, RawFd},
    time::Duration,
};

use nix::sys::{
    time::TimeSpec,
    timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags},
};
use tokio::io::{Interest, unix::AsyncFd};
use tracing::warn;

/// A one-shot CLOCK_MONOTONIC timerfd registered with the runtime.
pub(crate) struct PreciseTimer(AsyncFd<OwnedTimer>);

impl PreciseTimer {
    /// Must be called within a runtime whose I/O driver is enabled (tokio
    /// panics otherwise).
    pub(crate) fn new() -> io::Result<Self> {
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        // SAFETY: the AsyncFd owns the timer, so its fd stays open and
        // unchanged while registered.
        let registered =
            unsafe { AsyncFd::register_with_interest(OwnedTimer(timer), Interest::READABLE) }?;
        Ok(Self(registered))
    }

    /// Waits until `after` has passed.
    pub(crate) async fn sleep(&mut self, after: Duration) -> io::Result<()> {
        // A zero expiration would disarm the timer, not expire it at once.
        let after = after.max(Duration::from_nanos(1));
        self.0.get_ref().0.set(
            Expiration::OneShot(TimeSpec::from_duration(after)),
            TimerSetTimeFlags::empty(),
        )?;
        loop {
            let mut ready = self.0.readable_mut().await?;
            // Reading the expiration count resets it; EAGAIN: not yet.
            if let Ok(read) = ready.try_io(|timer| Ok(timer.get_ref().0.wait()?)) {
                return read;
            }
        }
    }
}

/// Waits on a [`PreciseTimer`], or on tokio's timer where none could be
/// made or one failed: the kill's short polls, and the zone's backstop
/// reads, where a tokio sleep longer than 64 ms wakes the runtime once
/// early (its timer wheel's coarser slot) and again at the deadline, and
/// one made while the runtime runs wakes it once more: three wake-ups per
/// read instead of one, which was about a tenth of the idle agent's CPU
/// (docs/design.md, agent footprint).
pub struct Pacer(Option<PreciseTimer>);

impl Pacer {
    /// As [`PreciseTimer::new`].
    pub(crate) fn new() -> Self {
        Self(PreciseTimer::new().ok())
    }

    /// On tokio's clock alone, which tests pause and advance.
    #[cfg(test)]
    pub(crate) fn tokio() -> Self {
        Self(None)
    }

    /// Whether it waits on a timerfd.
    pub(crate) fn is_precise(&self) -> bool {
        self.0.is_some()
    }

    pub(crate) async fn sleep(&mut self, after: Duration) {
        if let Some(timer) = &mut self.0 {
            match timer.sleep(after).await {
                Ok(()) => return,
                Err(e) => {
                    warn!(error = %e, "a timerfd failed: tokio's timer from now on");
                    self.0 = None;
                }
            }
        }
        tokio::time::sleep(after).await;
    }
}

impl Default for Pacer {
    fn default() -> Self {
        Self::new()
    }
}

/// A timerfd as tokio's [`AsyncFd`] takes it.
struct OwnedTimer(TimerFd);

impl AsRawFd for OwnedTimer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[tokio::test]
    async fn a_sleep_shorter_than_tokios_tick_ends_once_its_time_has_passed() {
        let mut timer = PreciseTimer::new().unwrap();
        for after in [Duration::from_micros(100), Duration::ZERO] {
            let started = Instant::now();
            tokio::time::timeout(Duration::from_secs(10), timer.sleep(after))
                .await
                .expect("the timerfd never expired")
                .unwrap();
            assert!(started.elapsed() >= after);
        }
    }

    #[tokio::test]
    async fn a_pacer_waits_on_its_timerfd_until_its_time_has_passed() {
        let mut pacer = Pacer::new();
        assert!(pacer.is_precise(), "no timerfd");
        for after in [
            Duration::from_millis(20),
            Duration::from_millis(5),
            Duration::ZERO,
        ] {
            let started = Instant::now();
            tokio::time::timeout(Duration::from_secs(10), pacer.sleep(after))
                .await
                .expect("the timerfd never expired");
            assert!(
                started.elapsed() >= after,
                "woke after {:?}",
                started.elapsed()
            );
        }
        assert!(pacer.is_precise(), "fell back to tokio's timer");
    }
}
