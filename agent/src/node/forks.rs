//! A pod's recent fork rate, for `--pid-ranking fork-rate`: how many of its
//! tasks (threads included) were born in the last [`FORK_RATE_WINDOW`],
//! read at the PID decision from each task's start time
//! (`/proc/<tid>/stat`, field 22, which the kernel sets at fork).
//!
//! One reading, no history: the rate is right at the moment of the
//! decision whatever woke it (a kernel crossing, a PSI trigger, a poll), and
//! it needs no kernel program. Counted from what the pod holds, so a pod
//! cannot make its rate look low where it matters: forks from a child
//! cgroup are counted (the pod's whole subtree is read); a task that exits
//! at once is not counted, but holds no PID either; a bomb that moves
//! (each task forks a successor and exits) keeps every task young.
use std::{
    fs, io,
    path::{Path, PathBuf},
    time::Duration,
};

use nix::time::{ClockId, clock_gettime};

use crate::node::{
    cgroupfs::{CgroupError, CgroupFs, CgroupVersion},
    snapshot::ForkRate,
};

/// Tasks born this long before the decision count as the pod's forks:
/// long enough to span a few clock ticks and the time from a crossing to
/// the decision under load, short enough that a pod that started its
/// workers minutes ago does not look like it is forking.
pub const FORK_RATE_WINDOW: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ForkRateError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("reading {path}: {source}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: no start time in {text:?}")]
    StartTime { path: PathBuf, text: String },
    #[error("reading the boot time clock: {0}")]
    Clock(#[source] nix::Error),
}

/// Reads fork rates against the clock `/proc/<tid>/stat` counts start
/// times in: clock ticks since boot.
#[derive(Debug, Clone, Copy)]
pub struct ForkClock {
    ticks_per_second: u64,
}

impl ForkClock {
    pub fn new() -> Self {
        // SAFETY: sysconf has no preconditions.
        let ticks = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
            ticks if ticks > 0 => ticks as u64,
            // USER_HZ on every architecture Kubernetes runs on.
            _ => 100,
        };
        Self {
            ticks_per_second: ticks,
        }
    }

    /// Pod cgroup `path`'s forks a second over the last
    /// [`FORK_RATE_WINDOW`].
    pub fn rate(&self, cgroupfs: &CgroupFs, path: &str) -> Result<ForkRate, ForkRateError> {
        let now = clock_gettime(ClockId::CLOCK_BOOTTIME).map_err(ForkRateError::Clock)?;
        let now_ticks = Duration::from(now).as_millis() as u64 * self.ticks_per_second / 1000;
        let window_ticks = FORK_RATE_WINDOW.as_millis() as u64 * self.ticks_per_second / 1000;
        let threads = match cgroupfs.version {
            CgroupVersion::V1 => "tasks",
            CgroupVersion::V2 => "cgroup.threads",
        };
        let born = tasks_born_since(
            &cgroupfs.memory_dir(path),
            threads,
            now_ticks.saturating_sub(window_ticks),
        )?;
        Ok(
            ForkRate::try_from(born as f64 / FORK_RATE_WINDOW.as_secs_f64())
                .unwrap_or(ForkRate::NONE),
        )
    }
}

impl Default for ForkClock {
    fn default() -> Self {
        Self::new()
    }
}

/// Tasks listed in `threads` of `dir` and every cgroup below it whose start
/// time is `since_ticks` or later. A task gone before its start time is
/// read, or a descendant removed meanwhile, counts nothing; `dir` itself
/// removed is [`CgroupError::Gone`].
fn tasks_born_since(dir: &Path, threads: &str, since_ticks: u64) -> Result<u64, ForkRateError> {
    let list = dir.join(threads);
    let text = fs::read_to_string(&list).map_err(|e| CgroupError::io(&list, e))?;
    let mut born = 0;
    for tid in text.split_whitespace() {
        if start_ticks(tid)?.is_some_and(|start| start >= since_ticks) {
            born += 1;
        }
    }
    let entries = fs::read_dir(dir).map_err(|e| CgroupError::io(dir, e))?;
    for entry in entries.filter_map(Result::ok) {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            match tasks_born_since(&entry.path(), threads, since_ticks) {
                Ok(n) => born += n,
                Err(ForkRateError::Cgroup(CgroupError::Gone(_))) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(born)
}

/// Task `tid`'s start time in clock ticks since boot; `None` once it has
/// exited.
fn start_ticks(tid: &str) -> Result<Option<u64>, ForkRateError> {
    let path = PathBuf::from(format!("/proc/{tid}/stat"));
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            return Ok(None);
        }
        Err(source) => return Err(ForkRateError::Stat { path, source }),
    };
    match parse_start_ticks(&text) {
        Some(ticks) => Ok(Some(ticks)),
        None => Err(ForkRateError::StartTime { path, text }),
    }
}

/// Field 22 of a `stat` line. The command name (field 2) is in
/// parentheses and may hold spaces and parentheses itself: the fields
/// after it start past the last `)`.
fn parse_start_ticks(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    // Field 3 (the state) is the first after the name.
    after_name.split_whitespace().nth(22 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    #[test]
    fn the_start_time_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 \
                    1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_start_ticks(stat), Some(98765));
        assert_eq!(parse_start_ticks("4242 (cut short) S 1 2"), None);
    }

    #[test]
    fn tasks_born_in_the_window_count_in_the_cgroup_and_below_it() {
        let dir = std::env::temp_dir().join(format!("evictd-forks-{}", std::process::id()));
        let child_dir = dir.join("container");
        fs::create_dir_all(&child_dir).unwrap();
        let mut fresh = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let fresh_start = start_ticks(&fresh.id().to_string()).unwrap().unwrap();
        // pid 1 was born at boot; the third task has exited (past any pid_max).
        fs::write(dir.join("tasks"), "1\n4194305\n").unwrap();
        fs::write(child_dir.join("tasks"), format!("{}\n", fresh.id())).unwrap();

        let since_fresh = tasks_born_since(&dir, "tasks", fresh_start);
        let since_boot = tasks_born_since(&dir, "tasks", 0);
        let _ = fresh.kill();
        let _ = fresh.wait();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(since_fresh.unwrap(), 1, "the child cgroup's fresh task");
        assert_eq!(since_boot.unwrap(), 2, "every living task");
    }

    #[test]
    fn a_removed_cgroup_is_gone() {
        let error = tasks_born_since(Path::new("/nonexistent/evictd-pod"), "tasks", 0);
        assert!(matches!(
            error,
            Err(ForkRateError::Cgroup(CgroupError::Gone(_)))
        ));
    }
}
