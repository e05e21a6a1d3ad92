//! Why the engine woke, and the clock the loop keeps time with.
use std::time::Duration;

use nix::{
    sys::resource::{UsageWho, getrusage},
    time::{ClockId, clock_gettime},
};

use crate::kernel::bpf::monotonic_now_ns;

/// What woke the engine: the `trigger` label of logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WakeCause {
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
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) struct Wake {
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
pub(crate) struct Clock {
    origin_ns: u64,
    origin: tokio::time::Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
            origin_ns: monotonic_now_ns(),
        }
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.origin_ns + self.origin.elapsed().as_nanos() as u64
    }

    /// The engine's time: a duration since an arbitrary epoch.
    pub(crate) fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns())
    }

    /// A wake-up for `cause` now.
    pub(crate) fn wake(&self, cause: WakeCause) -> Wake {
        Wake {
            cause,
            at_ns: self.now_ns(),
        }
    }

    /// Time since `at_ns` on this clock.
    pub(crate) fn since(&self, at_ns: u64) -> Duration {
        Duration::from_nanos(self.now_ns().saturating_sub(at_ns))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// The calling thread's CPU time, context switches and page faults. Over a
/// slow decision they say where its thread was: working (CPU time),
/// waiting for a CPU (involuntary switches), blocked (voluntary ones), or
/// off the CPU with neither, which is time the hypervisor took (steal: a
/// guest's task clock leaves it out); and whether its CPU time went on
/// faulting pages in (each one reclaiming, under the node's pressure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThreadUsage {
    pub cpu: Duration,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    pub page_faults: u64,
}

impl ThreadUsage {
    /// `None` where the kernel refuses a read (a seccomp profile without
    /// `getrusage`): the decision is logged without it.
    pub(crate) fn now() -> Option<Self> {
        let cpu = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
        let usage = getrusage(UsageWho::RUSAGE_THREAD).ok()?;
        Some(Self {
            cpu: Duration::from(cpu),
            voluntary_switches: usage.voluntary_context_switches().max(0) as u64,
            involuntary_switches: usage.involuntary_context_switches().max(0) as u64,
            page_faults: (usage.minor_page_faults().max(0) + usage.major_page_faults().max(0))
                as u64,
        })
    }

    /// What the thread spent since `earlier`.
    pub(crate) fn since(&self, earlier: &Self) -> Self {
        Self {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            voluntary_switches: self
                .voluntary_switches
                .saturating_sub(earlier.voluntary_switches),
            involuntary_switches: self
                .involuntary_switches
                .saturating_sub(earlier.involuntary_switches),
            page_faults: self.page_faults.saturating_sub(earlier.page_faults),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_works_is_charged_cpu_time_up_to_the_time_passed() {
        // The clock first, so that its span holds the whole CPU time read.
        let began = std::time::Instant::now();
        let start = ThreadUsage::now().unwrap();
        let mut x = 0u64;
        loop {
            let spent = ThreadUsage::now().unwrap().since(&start);
            if spent.cpu >= Duration::from_millis(2) {
                assert!(spent.cpu <= began.elapsed(), "{spent:?}");
                break;
            }
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "no CPU time charged: {spent:?}"
            );
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    #[test]
    fn a_thread_that_sleeps_switches_voluntarily_without_cpu_time() {
        let start = ThreadUsage::now().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let spent = ThreadUsage::now().unwrap().since(&start);
        assert!(spent.voluntary_switches >= 1, "{spent:?}");
        assert!(spent.cpu < Duration::from_millis(20), "{spent:?}");
    }
}
