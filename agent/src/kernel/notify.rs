//! Memory pressure the kernel pushes without BPF, as the two non-eBPF modes
//! evictd's event mode is compared with (`cargo xtask bench`):
//!
//! - `--mode psi`: a PSI trigger, Android lmkd's mechanism: the kernel wakes
//!   a poller once tasks have stalled on memory for `stall` within `window`.
//! - `--mode memcg-threshold`: cgroup v1 usage thresholds on an eventfd,
//!   what kubelet's `--kernel-memcg-notification` arms: the kernel signals
//!   the eventfd when the node cgroup's usage crosses a level.
//!
//! Both only wake the engine; it reads cgroupfs and decides as in every mode.
use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::{
        fd::{AsFd as _, AsRawFd as _, OwnedFd},
        unix::fs::OpenOptionsExt as _,
    },
    path::{Path, PathBuf},
    time::Duration,
};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    kernel::bpf::monotonic_now_ns,
    node::{
        cgroupfs::{CgroupError, OpenValue},
        stats::SignalsError,
    },
};

/// The shortest and longest PSI window the kernel accepts.
const PSI_WINDOW_RANGE: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(10));

/// Without CAP_SYS_RESOURCE the kernel takes only windows that are
/// multiples of this (it rate-limits unprivileged triggers).
const UNPRIVILEGED_PSI_WINDOW: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("PSI trigger on {path}")]
    Psi { path: PathBuf, source: io::Error },
    #[error(
        "PSI trigger: the stall ({stall:?}) must be at most the window ({window:?}), \
         and the window between 500ms and 10s"
    )]
    PsiRange { stall: Duration, window: Duration },
    #[error(
        "PSI trigger on {path}: a {window:?} window needs CAP_SYS_RESOURCE; \
         without it the kernel takes only multiples of 2s"
    )]
    PsiWindowNeedsPrivilege { path: PathBuf, window: Duration },
    #[error("memory threshold on {path}")]
    Threshold { path: PathBuf, source: io::Error },
    #[error("memory threshold: {0}")]
    Registrar(String),
    #[error("memory threshold: reading the usage")]
    Usage(#[from] CgroupError),
    #[error("memory threshold: reading the machine's working set")]
    WorkingSet(#[source] SignalsError),
}

/// A PSI trigger: `some <stall> <window>` written to a pressure file, then
/// POLLPRI each time the kernel sees that much stall.
pub(crate) struct PsiTrigger {
    file: AsyncFd<File>,
    path: PathBuf,
}

impl PsiTrigger {
    /// `path` is a cgroup v2 `memory.pressure` or `/proc/pressure/memory`.
    pub(crate) fn open(
        path: &Path,
        stall: Duration,
        window: Duration,
    ) -> Result<Self, NotifyError> {
        if stall > window || window < PSI_WINDOW_RANGE.0 || window > PSI_WINDOW_RANGE.1 {
            return Err(NotifyError::PsiRange { stall, window });
        }
        let error = |source| NotifyError::Psi {
            path: path.to_owned(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(error)?;
        // The kernel takes the trigger from a single write and overwrites
        // its last byte with a NUL: send the NUL.
        let line = format!("{}\0", psi_trigger_line(stall, window));
        match file.write(line.as_bytes()) {
            Ok(_) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::EINVAL)
                    && !window
                        .as_micros()
                        .is_multiple_of(UNPRIVILEGED_PSI_WINDOW.as_micros()) =>
            {
                return Err(NotifyError::PsiWindowNeedsPrivilege {
                    path: path.to_owned(),
                    window,
                });
            }
            Err(e) => return Err(error(e)),
        }
        // SAFETY: the AsyncFd owns the file, so the fd stays open and
        // unchanged while registered.
        let file = unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) }
            .map_err(|e| error(e.into()))?;
        Ok(Self {
            file,
            path: path.to_owned(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the next trigger; returns CLOCK_MONOTONIC ns at wake-up.
    pub(crate) async fn wait(&mut self) -> Result<u64, NotifyError> {
        let mut ready = self
            .file
            .ready(Interest::PRIORITY)
            .await
            .map_err(|source| NotifyError::Psi {
                path: self.path.clone(),
                source,
            })?;
        let at_ns = monotonic_now_ns();
        // Polling the file consumed the event; wait for the next wake-up.
        ready.clear_ready();
        Ok(at_ns)
    }
}

/// The line that arms a PSI trigger: `some` stall and window in µs.
pub(crate) fn psi_trigger_line(stall: Duration, window: Duration) -> String {
    format!("some {} {}", stall.as_micros(), window.as_micros())
}

/// cgroup v1 memory thresholds of one cgroup on one eventfd, re-armed at
/// new levels as the engine asks (as kubelet re-arms on each sync).
pub struct MemcgThresholds {
    /// `cgroup.event_control` of the cgroup.
    control: PathBuf,
    /// `memory.usage_in_bytes`, kept open: registrations name its fd.
    usage: OpenValue,
    /// The eventfd of the current levels; closing it unregisters them.
    armed: Option<AsyncFd<EventFd>>,
    levels: Vec<u64>,
    /// The kernel signalled since the levels were registered.
    signalled: bool,
}

impl MemcgThresholds {
    /// `memory_dir` is the cgroup's directory in the v1 memory hierarchy.
    pub fn open(memory_dir: &Path) -> Result<Self, NotifyError> {
        let usage = OpenValue::open(memory_dir.join("memory.usage_in_bytes"))?;
        Ok(Self {
            control: memory_dir.join("cgroup.event_control"),
            usage,
            armed: None,
            levels: Vec::new(),
            signalled: false,
        })
    }

    /// Replaces the armed levels (usage in bytes) with `levels`; nothing is
    /// re-registered when they are unchanged.
    pub fn arm(&mut self, levels: &[u64]) -> Result<(), NotifyError> {
        if self.armed_at(levels) {
            return Ok(());
        }
        self.register(levels)
    }

    /// As [`arm`](Self::arm), but unchanged levels are registered again
    /// after a signal: the kernel then holds a level as passed until one of
    /// its checks sees usage below it, and the counter, which moves in
    /// per-CPU charge batches, can fall back below the level before anyone
    /// reads it with no check to see that; the node then climbs on with no
    /// second signal. Registering again takes usage as it is now. It costs
    /// an RCU grace period in the kernel (24 ms here, on the caller's
    /// thread), so a caller asks for it only when a reading is below a
    /// level it was signalled for.
    pub(crate) fn rearm(&mut self, levels: &[u64]) -> Result<(), NotifyError> {
        if self.armed.is_some() && self.levels == levels && !self.signalled {
            return Ok(());
        }
        self.register(levels)
    }

    fn register(&mut self, levels: &[u64]) -> Result<(), NotifyError> {
        let registered = self.registration(levels)?.write()?;
        self.install(registered)
    }

    /// `levels` on a new eventfd, to be written by a thread that can wait
    /// out the kernel's RCU grace period ([`Registration::write`]) and
    /// then [`install`](Self::install)ed here.
    pub(crate) fn registration(&self, levels: &[u64]) -> Result<Registration, NotifyError> {
        let error = |source| NotifyError::Threshold {
            path: self.control.clone(),
            source,
        };
        let eventfd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| error(e.into()))?;
        // Its own descriptor of the usage file, so that one closed here
        // meanwhile never lets the writer name another file.
        let usage = self.usage.as_fd().try_clone_to_owned().map_err(error)?;
        Ok(Registration {
            control: self.control.clone(),
            usage,
            eventfd,
            levels: levels.to_vec(),
        })
    }

    /// Arms the levels of a written registration; dropping the previous
    /// eventfd unregisters the previous levels (the kernel does it in a
    /// worker, not on this thread).
    pub(crate) fn install(&mut self, registered: Registered) -> Result<(), NotifyError> {
        // SAFETY: the AsyncFd owns the eventfd, so the fd stays open and
        // unchanged while registered.
        let armed =
            unsafe { AsyncFd::register_with_interest(registered.eventfd, Interest::READABLE) }
                .map_err(|e| NotifyError::Threshold {
                    path: self.control.clone(),
                    source: e.into(),
                })?;
        self.armed = Some(armed);
        self.levels = registered.levels;
        self.signalled = false;
        Ok(())
    }

    /// Whether exactly `levels` are armed.
    pub(crate) fn armed_at(&self, levels: &[u64]) -> bool {
        self.armed.is_some() && self.levels == levels
    }

    /// Whether usage is at or above `level` now. The kernel signals a
    /// crossing, not a level: one armed where usage already reaches it
    /// counts as crossed and stays silent, so a caller arming from a
    /// reading that may be stale asks this after.
    pub(crate) fn passed(&self, level: u64) -> Result<bool, NotifyError> {
        Ok(self.usage()? >= level)
    }

    /// Whether usage reached an armed level after it was `read_usage`, the
    /// reading the levels were set from: such a level was passed before
    /// the kernel had it and will not be signalled. One already reached at
    /// the reading is not counted; whoever read it saw it passed.
    pub(crate) fn reached_since(&self, read_usage: u64) -> Result<bool, NotifyError> {
        let usage = self.usage()?;
        Ok(self
            .levels
            .iter()
            .any(|&level| read_usage < level && level <= usage))
    }

    /// Usage now, in bytes.
    pub(crate) fn usage(&self) -> Result<u64, NotifyError> {
        Ok(self.usage.read_u64()?)
    }

    /// The levels armed now.
    pub(crate) fn levels(&self) -> &[u64] {
        &self.levels
    }

    /// Waits until usage crosses an armed level, either way; returns
    /// CLOCK_MONOTONIC ns at wake-up. Pending while nothing is armed.
    pub(crate) async fn wait(&mut self) -> Result<u64, NotifyError> {
        let Some(armed) = self.armed.as_mut() else {
            return std::future::pending().await;
        };
        let mut ready = armed
            .readable()
            .await
            .map_err(|source| NotifyError::Threshold {
                path: self.control.clone(),
                source,
            })?;
        let at_ns = monotonic_now_ns();
        // Reading resets the counter; EAGAIN means another wake-up took it.
        let _ = ready.get_inner().read();
        ready.clear_ready();
        self.signalled = true;
        Ok(at_ns)
    }
}

/// Levels not yet registered, on their eventfd
/// ([`MemcgThresholds::registration`]).
#[derive(Debug)]
pub(crate) struct Registration {
    control: PathBuf,
    usage: OwnedFd,
    eventfd: EventFd,
    levels: Vec<u64>,
}

impl Registration {
    /// Registers each level with the kernel. Blocks: the kernel waits out
    /// an RCU grace period per level (4–32 ms on a quiet machine, seconds
    /// on a busy virtual one).
    pub(crate) fn write(self) -> Result<Registered, NotifyError> {
        for level in &self.levels {
            let line = format!(
                "{} {} {level}",
                self.eventfd.as_raw_fd(),
                self.usage.as_raw_fd()
            );
            fs::write(&self.control, line).map_err(|source| NotifyError::Threshold {
                path: self.control.clone(),
                source,
            })?;
        }
        Ok(Registered {
            eventfd: self.eventfd,
            levels: self.levels,
        })
    }
}

/// Levels the kernel has, on the eventfd it signals.
#[derive(Debug)]
pub(crate) struct Registered {
    eventfd: EventFd,
    levels: Vec<u64>,
}

/// The push mechanism of a non-eBPF mode.
pub(crate) enum Notifier {
    Psi(PsiTrigger),
    MemcgThresholds(MemcgThresholds),
}

impl Notifier {
    pub(crate) async fn wait(&mut self) -> Result<u64, NotifyError> {
        match self {
            Self::Psi(trigger) => trigger.wait().await,
            Self::MemcgThresholds(thresholds) => thresholds.wait().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_usage_already_reaches_is_passed() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("memory.usage_in_bytes"), "1000\n").unwrap();
        let thresholds = MemcgThresholds::open(dir.path()).unwrap();
        assert!(thresholds.passed(1000).unwrap());
        assert!(!thresholds.passed(1001).unwrap());
        fs::write(dir.path().join("memory.usage_in_bytes"), "not a number").unwrap();
        assert!(thresholds.passed(1).is_err());
    }

    /// What the kernel does at a crossing: a count on the eventfd.
    async fn signal(thresholds: &mut MemcgThresholds) {
        let armed = thresholds.armed.as_ref().unwrap();
        armed.get_ref().write(1).unwrap();
        thresholds.wait().await.unwrap();
    }

    #[tokio::test]
    async fn rearming_registers_unchanged_levels_again_only_after_a_signal() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("memory.usage_in_bytes"), "1000\n").unwrap();
        let control = dir.path().join("cgroup.event_control");
        let registered = || fs::read_to_string(&control).unwrap();
        let mut thresholds = MemcgThresholds::open(dir.path()).unwrap();
        thresholds.rearm(&[1500]).unwrap();
        assert!(registered().ends_with(" 1500"), "{}", registered());
        fs::write(&control, "").unwrap();
        thresholds.rearm(&[1500]).unwrap();
        assert_eq!(registered(), "", "unchanged, no signal: kept");
        signal(&mut thresholds).await;
        thresholds.rearm(&[1500]).unwrap();
        assert!(
            registered().ends_with(" 1500"),
            "signalled: registered again"
        );
        fs::write(&control, "").unwrap();
        thresholds.rearm(&[1500]).unwrap();
        assert_eq!(registered(), "", "once");
        signal(&mut thresholds).await;
        thresholds.arm(&[1500]).unwrap();
        assert_eq!(registered(), "", "arming leaves unchanged levels alone");
    }

    #[test]
    fn the_trigger_line_is_in_microseconds() {
        assert_eq!(
            psi_trigger_line(Duration::from_millis(70), Duration::from_secs(1)),
            "some 70000 1000000"
        );
    }

    #[test]
    fn a_stall_longer_than_its_window_is_refused_before_the_kernel_sees_it() {
        for (stall, window) in [
            (Duration::from_secs(2), Duration::from_secs(1)),
            (Duration::from_millis(10), Duration::from_millis(100)),
            (Duration::from_millis(10), Duration::from_secs(11)),
        ] {
            let refused = PsiTrigger::open(Path::new("/nonexistent"), stall, window);
            assert!(
                matches!(refused, Err(NotifyError::PsiRange { .. })),
                "{stall:?} in {window:?}"
            );
        }
    }
}
