//! The node's page counter crossing a level, as the kernel reports it: the
//! bench's own instrument, the same for every mode and for the oracle, and
//! independent of the agent's code.
//!
//! cgroup v1: a memory threshold on an eventfd (`cgroup.event_control`),
//! which the kernel signals when the level is crossed, upward or downward,
//! checked every 128 pages charged or freed per CPU (at most 512 KiB late;
//! a level crossed and crossed back between two checks is not signalled).
//! A thread at real-time priority blocks on it, timestamps each wake-up
//! and reads the counter to tell which way it went, so the time is not
//! queued behind the bomb, the agent or a kill on a 2-CPU machine. cgroup
//! v2 has no thresholds: one thread reads `memory.current` every
//! millisecond instead (about 1 % of a CPU, in every run alike) and
//! compares it with every level. On the machine's root (`--node root`) the
//! counter is the machine's working set as kubelet computes it, from
//! /proc/vmstat, read the same way.
use std::{
    fs::{self, File},
    io::Read as _,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::fs::FileExt as _,
    },
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use anyhow::{Context as _, Result};
use evictd::{kernel::bpf::monotonic_now_ns, node::cgroupfs::CgroupVersion};
use evictd_integration::{VMSTAT, read_working_set};

/// How often the v2 fallback reads the counter.
const V2_POLL_INTERVAL: Duration = Duration::from_millis(1);

/// One crossing of a level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crossing {
    /// Which of the watch's levels (its index).
    pub level: usize,
    /// CLOCK_MONOTONIC ns when the bench learnt of it.
    pub at_ns: u64,
    /// Whether the counter was at or above the level then.
    pub upward: bool,
}

/// What a watch compares with its levels.
#[derive(Debug, Clone)]
pub enum Counter {
    /// A cgroup's page counter; the path is its memory directory.
    Cgroup(CgroupVersion, PathBuf),
    /// The machine's working set as kubelet computes it on the root
    /// (`evictd_integration::read_working_set`): no threshold to arm
    /// there, read every millisecond as on v2.
    Machine,
}

/// Levels on a counter and the crossings seen so far.
pub struct LevelWatch {
    crossings: mpsc::Receiver<Crossing>,
    seen: Vec<Crossing>,
    stop: Arc<AtomicBool>,
    /// Whether the watching threads got real-time priority.
    pub realtime: bool,
}

impl LevelWatch {
    /// Watches `levels` (bytes) on `counter`, which must be below each now.
    pub fn start(counter: &Counter, levels: &[u64]) -> Result<Self> {
        let (sender, crossings) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (started, realtime) = mpsc::channel();
        let mut threads = 0;
        match counter {
            Counter::Cgroup(CgroupVersion::V1, memory_dir) => {
                let usage_path = memory_dir.join("memory.usage_in_bytes");
                for (index, &level) in levels.iter().enumerate() {
                    let usage = File::open(&usage_path)
                        .with_context(|| format!("{}", usage_path.display()))?;
                    let eventfd = arm_v1(memory_dir, &usage, level)?;
                    let (sender, started) = (sender.clone(), started.clone());
                    threads += 1;
                    std::thread::spawn(move || {
                        let _ = started.send(make_realtime());
                        let mut count = [0u8; 8];
                        let mut file = File::from(eventfd);
                        // Blocks until the next crossing; the kernel also
                        // signals it once when the cgroup is removed, and by
                        // then nobody listens.
                        while file.read_exact(&mut count).is_ok() {
                            let at_ns = monotonic_now_ns();
                            let Some(now) = read_counter(&usage) else {
                                break;
                            };
                            let crossing = Crossing {
                                level: index,
                                at_ns,
                                upward: now >= level,
                            };
                            if sender.send(crossing).is_err() {
                                break;
                            }
                        }
                    });
                }
            }
            Counter::Cgroup(CgroupVersion::V2, memory_dir) => {
                let path = memory_dir.join("memory.current");
                let current = File::open(&path).with_context(|| format!("{}", path.display()))?;
                threads += 1;
                poll(
                    move || read_counter(&current),
                    levels.to_vec(),
                    sender,
                    started,
                    stop.clone(),
                );
            }
            Counter::Machine => {
                let vmstat = File::open(VMSTAT).with_context(|| VMSTAT.to_owned())?;
                threads += 1;
                poll(
                    move || read_working_set(&vmstat),
                    levels.to_vec(),
                    sender,
                    started,
                    stop.clone(),
                );
            }
        }
        let mut realtime_all = true;
        for _ in 0..threads {
            realtime_all &= realtime
                .recv()
                .context("the watching thread did not start")?;
        }
        Ok(Self {
            crossings,
            seen: Vec::new(),
            stop,
            realtime: realtime_all,
        })
    }

    /// Every crossing so far, in order.
    pub fn crossings(&mut self) -> &[Crossing] {
        self.seen.extend(self.crossings.try_iter());
        &self.seen
    }

    /// The first downward crossing of level `level` after `after_ns`.
    pub fn first_down_after(&mut self, level: usize, after_ns: u64) -> Option<u64> {
        self.crossings()
            .iter()
            .find(|c| c.level == level && !c.upward && c.at_ns > after_ns)
            .map(|c| c.at_ns)
    }

    /// Whether level `level` was crossed downward at all.
    pub fn went_down(&mut self, level: usize) -> bool {
        self.crossings()
            .iter()
            .any(|c| c.level == level && !c.upward)
    }

    /// The first upward crossing of level `level`.
    pub fn first_up(&mut self, level: usize) -> Option<u64> {
        self.crossings()
            .iter()
            .find(|c| c.level == level && c.upward)
            .map(|c| c.at_ns)
    }
}

/// One thread at real-time priority reading `read` every
/// [`V2_POLL_INTERVAL`] and reporting each level's crossings, until `stop`.
fn poll(
    read: impl Fn() -> Option<u64> + Send + 'static,
    levels: Vec<u64>,
    sender: mpsc::Sender<Crossing>,
    started: mpsc::Sender<bool>,
    stop: Arc<AtomicBool>,
) {
    std::thread::spawn(move || {
        let _ = started.send(make_realtime());
        let mut above = vec![false; levels.len()];
        while !stop.load(Ordering::Relaxed) {
            let Some(value) = read() else {
                break;
            };
            for (index, &level) in levels.iter().enumerate() {
                if (value >= level) != above[index] {
                    above[index] = value >= level;
                    let crossing = Crossing {
                        level: index,
                        at_ns: monotonic_now_ns(),
                        upward: above[index],
                    };
                    if sender.send(crossing).is_err() {
                        return;
                    }
                }
            }
            std::thread::sleep(V2_POLL_INTERVAL);
        }
    });
}

impl Drop for LevelWatch {
    fn drop(&mut self) {
        // The polling thread ends at its next reading; the v1 threads when
        // the cgroup goes (the kernel signals the eventfd then).
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A counter file's number, read afresh.
fn read_counter(file: &File) -> Option<u64> {
    let mut text = [0u8; 32];
    let read = file.read_at(&mut text, 0).ok()?;
    std::str::from_utf8(&text[..read]).ok()?.trim().parse().ok()
}

/// Registers `level` on the cgroup's `memory.usage_in_bytes` (open as
/// `usage`) with a new (blocking) eventfd.
fn arm_v1(memory_dir: &Path, usage: &File, level: u64) -> Result<OwnedFd> {
    // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error()).context("eventfd");
    }
    // SAFETY: the descriptor was just created and nothing else owns it.
    let eventfd = unsafe { OwnedFd::from_raw_fd(raw) };
    let control = memory_dir.join("cgroup.event_control");
    fs::write(
        &control,
        format!("{} {} {level}", eventfd.as_raw_fd(), usage.as_raw_fd()),
    )
    .with_context(|| format!("arming {level} in {}", control.display()))?;
    Ok(eventfd)
}

/// SCHED_FIFO at the lowest real-time priority for the calling thread:
/// above every normal task, so a wake-up runs at once. False if refused.
pub fn make_realtime() -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: pid 0 is the calling thread; param is a valid struct.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
}
