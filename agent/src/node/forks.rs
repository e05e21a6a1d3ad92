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
//!
//! Bounded, since the pods ranked are the ones holding the node's PIDs: at
//! most `STAT_READS_PER_POD` start times are read per pod (past that its
//! tasks are sampled evenly and the count scaled), and a pod whose subtree
//! holds more than `CGROUPS_PER_POD` cgroups gets no rate at all (the
//! decision then ranks in kubelet's order) rather than one from the part
//! walked, which the pod could keep quiet.
use std::{
    fs, io,
    path::{Path, PathBuf},
    time::Duration,
};

use nix::time::{ClockId, clock_gettime};

use crate::{
    decide::snapshot::ForkRate,
    node::cgroupfs::{CgroupError, CgroupFs, CgroupVersion},
};

/// Tasks born this long before the decision count as the pod's forks:
/// long enough to span a few clock ticks and the time from a crossing to
/// the decision under load, short enough that a pod that started its
/// workers minutes ago does not look like it is forking.
pub const FORK_RATE_WINDOW: Duration = Duration::from_secs(2);

/// Task start times read per pod at a decision (a few ms): a fork bomb
/// with 100,000 tasks must not make the decision that would stop it read
/// 100,000 files first. Sampled evenly, 2,048 reads put a pod's share of
/// young tasks within a few percent.
pub(crate) const STAT_READS_PER_POD: usize = 2048;

/// Cgroups walked per pod; kubelet makes one per container.
pub(crate) const CGROUPS_PER_POD: usize = 256;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ForkRateError {
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
    #[error("{path}: more than {CGROUPS_PER_POD} cgroups below the pod")]
    TooManyCgroups { path: PathBuf },
}

/// Reads fork rates against the clock `/proc/<tid>/stat` counts start
/// times in: clock ticks since boot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForkClock {
    ticks_per_second: u64,
}

impl ForkClock {
    pub(crate) fn new() -> Self {
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
    pub(crate) fn rate(&self, cgroupfs: &CgroupFs, path: &str) -> Result<ForkRate, ForkRateError> {
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
            STAT_READS_PER_POD,
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
/// time is `since_ticks` or later: every one's read if there are at most
/// `reads`, else `reads` of them evenly spaced and the count scaled. A task
/// gone before its start time is read, or a descendant removed meanwhile,
/// counts nothing; `dir` itself removed is [`CgroupError::Gone`].
fn tasks_born_since(
    dir: &Path,
    threads: &str,
    since_ticks: u64,
    reads: usize,
) -> Result<u64, ForkRateError> {
    let mut tids = Vec::new();
    list_subtree(dir, threads, &mut tids, &mut 0)?;
    let (step, sampled) = match tids.len() {
        0 => return Ok(0),
        listed if listed <= reads => (1, listed),
        listed => (
            listed.div_ceil(reads),
            listed.div_ceil(listed.div_ceil(reads)),
        ),
    };
    let mut born = 0u64;
    for tid in tids.iter().step_by(step) {
        if start_ticks(*tid)?.is_some_and(|start| start >= since_ticks) {
            born += 1;
        }
    }
    Ok(born * tids.len() as u64 / sampled as u64)
}

/// Appends the tasks of `dir` and of every cgroup below it to `tids`,
/// counting the cgroups walked in `walked`.
fn list_subtree(
    dir: &Path,
    threads: &str,
    tids: &mut Vec<u32>,
    walked: &mut usize,
) -> Result<(), ForkRateError> {
    *walked += 1;
    if *walked > CGROUPS_PER_POD {
        return Err(ForkRateError::TooManyCgroups {
            path: dir.to_owned(),
        });
    }
    let list = dir.join(threads);
    let text = fs::read_to_string(&list).map_err(|e| CgroupError::io(&list, e))?;
    // Four bytes a task: the list is as long as the PIDs the pod holds.
    tids.extend(
        text.split_whitespace()
            .filter_map(|tid| tid.parse::<u32>().ok()),
    );
    let entries = fs::read_dir(dir).map_err(|e| CgroupError::io(dir, e))?;
    for entry in entries.filter_map(Result::ok) {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            match list_subtree(&entry.path(), threads, tids, walked) {
                Ok(()) | Err(ForkRateError::Cgroup(CgroupError::Gone(_))) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Task `tid`'s start time in clock ticks since boot; `None` once it has
/// exited.
fn start_ticks(tid: u32) -> Result<Option<u64>, ForkRateError> {
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
        let fresh_start = start_ticks(fresh.id()).unwrap().unwrap();
        // pid 1 was born at boot; the third task has exited (past any pid_max).
        fs::write(dir.join("tasks"), "1\n4194305\n").unwrap();
        fs::write(child_dir.join("tasks"), format!("{}\n", fresh.id())).unwrap();

        let since_fresh = tasks_born_since(&dir, "tasks", fresh_start, STAT_READS_PER_POD);
        let since_boot = tasks_born_since(&dir, "tasks", 0, STAT_READS_PER_POD);
        let _ = fresh.kill();
        let _ = fresh.wait();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(since_fresh.unwrap(), 1, "the child cgroup's fresh task");
        assert_eq!(since_boot.unwrap(), 2, "every living task");
    }

    #[test]
    fn a_removed_cgroup_is_gone() {
        let error = tasks_born_since(
            Path::new("/nonexistent/evictd-pod"),
            "tasks",
            0,
            STAT_READS_PER_POD,
        );
        assert!(matches!(
            error,
            Err(ForkRateError::Cgroup(CgroupError::Gone(_)))
        ));
    }

    #[test]
    fn past_its_reads_a_pod_is_sampled_evenly_and_its_count_scaled() {
        let dir = std::env::temp_dir().join(format!("evictd-forks-sample-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let my_start = start_ticks(me).unwrap().unwrap();
        // The first 750 listed were born at boot (pid 1), the last 250 with
        // this test (a cgroup lists its tasks about in the order they joined
        // it): 1,000 listed, 100 read.
        let list: String = (0..1000)
            .map(|i| {
                if i >= 750 {
                    format!("{me}\n")
                } else {
                    "1\n".to_owned()
                }
            })
            .collect();
        fs::write(dir.join("tasks"), list).unwrap();
        let sampled = tasks_born_since(&dir, "tasks", my_start, 100);
        let every = tasks_born_since(&dir, "tasks", my_start, 1000);
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(every.unwrap(), 250);
        let sampled = sampled.unwrap();
        assert!((200..=300).contains(&sampled), "{sampled}");
    }

    #[test]
    fn a_pod_with_more_cgroups_than_the_bound_gets_no_rate() {
        let dir = std::env::temp_dir().join(format!("evictd-forks-wide-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("tasks"), "").unwrap();
        for n in 0..CGROUPS_PER_POD {
            let child = dir.join(format!("c{n}"));
            fs::create_dir_all(&child).unwrap();
            fs::write(child.join("tasks"), "").unwrap();
        }
        let error = tasks_born_since(&dir, "tasks", 0, STAT_READS_PER_POD);
        let _ = fs::remove_dir_all(&dir);
        assert!(
            matches!(error, Err(ForkRateError::TooManyCgroups { .. })),
            "{error:?}"
        );
    }
}
