//! Why the engine woke, and the clock the loop keeps time with.
use std::time::Duration;

use crate::kernel::bpf::monotonic_now_ns;

/// What woke the engine: the `trigger` label of logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeCause {
    /// The first run, as soon as the agent is armed.
    Startup,
    /// A kernel record: an engine scope crossed a band.
    Kernel,
    /// The timer behind the kernel programs, or records a full ring buffer
    /// dropped.
    Resync,
    /// The polling timer, where no kernel program watches.
    Poll,
    /// A look again soon after a run that found a threshold close.
    CloseWatch,
    /// A PSI trigger (`--mode psi`).
    Psi,
    /// A cgroup v1 memcg eventfd threshold (`--mode memcg-threshold`).
    MemcgThreshold,
    /// An eviction ended: the engine decides again on fresh numbers.
    EvictionEnded,
    /// The node crossed the edge of the zone where the precise memory
    /// hooks run (a cgroup v1 eventfd threshold), either way.
    Zone,
}

impl WakeCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Startup => "startup",
            Self::Kernel => "kernel",
            Self::Resync => "resync",
            Self::Poll => "poll",
            Self::CloseWatch => "close-watch",
            Self::Psi => "psi",
            Self::MemcgThreshold => "memcg-threshold",
            Self::EvictionEnded => "eviction-ended",
            Self::Zone => "zone",
        }
    }
}

/// A wake-up of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    pub cause: WakeCause,
    /// CLOCK_MONOTONIC nanoseconds: the kernel record's timestamp, or when
    /// the notification or timer fired.
    pub at_ns: u64,
}

/// CLOCK_MONOTONIC, the clock of kernel records (`bpf_ktime_get_ns`), read
/// through tokio's clock so that a test with paused time (tokio's
/// `time::pause`) drives grace periods and deadlines without sleeping.
/// Unpaused, tokio's clock is the system's monotonic clock, so the two
/// differ by the constant taken at creation.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin_ns: u64,
    origin: tokio::time::Instant,
}

impl Clock {
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
            origin_ns: monotonic_now_ns(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.origin_ns + self.origin.elapsed().as_nanos() as u64
    }

    /// The engine's time: a duration since an arbitrary epoch.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns())
    }

    /// A wake-up for `cause` now.
    pub fn wake(&self, cause: WakeCause) -> Wake {
        Wake {
            cause,
            at_ns: self.now_ns(),
        }
    }

    /// Time since `at_ns` on this clock.
    pub fn since(&self, at_ns: u64) -> Duration {
        Duration::from_nanos(self.now_ns().saturating_sub(at_ns))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
