//! Keeping a reaper off the CPU its victim last ran on.
//!
//! A victim thawed after its SIGKILL wakes on the CPU it was frozen on;
//! a reaper thread placed there too would share that CPU with the victim's
//! exit, and the two would free its memory one after the other instead of
//! side by side.
use nix::{
    sched::{CpuSet, sched_getaffinity, sched_setaffinity},
    unistd::Pid,
};

/// The calling thread's CPU affinity while it reaps, without the victim's
/// CPU; the thread's own affinity comes back on drop (blocking threads are
/// reused).
pub(super) struct OffVictimCpu {
    restore: CpuSet,
}

impl OffVictimCpu {
    /// `None` when there is nothing to move away from: the victim is gone,
    /// or its CPU is the only one this thread may run on.
    pub(super) fn enter(victim: u32) -> Option<Self> {
        let cpu = last_cpu(victim)?;
        let this_thread = Pid::from_raw(0);
        let restore = sched_getaffinity(this_thread).ok()?;
        let mut away = restore;
        away.unset(cpu).ok()?;
        if away == CpuSet::new() {
            return None;
        }
        sched_setaffinity(this_thread, &away).ok()?;
        Some(Self { restore })
    }
}

impl Drop for OffVictimCpu {
    fn drop(&mut self) {
        // Best effort: a thread left off one CPU only runs on the others.
        let _ = sched_setaffinity(Pid::from_raw(0), &self.restore);
    }
}

/// The CPU `pid` last ran on: field 39 of `/proc/<pid>/stat`, counted
/// after the command, which may itself hold spaces and parentheses.
fn last_cpu(pid: u32) -> Option<usize> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_command = &stat[stat.rfind(')')? + 1..];
    // Fields from the third (state) on: the processor is the 37th of them.
    after_command.split_whitespace().nth(36)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::{
        os::unix::process::CommandExt as _,
        process::{Command, Stdio},
        time::{Duration, Instant},
    };

    use super::*;

    fn allowed_cpus(set: &CpuSet) -> Vec<usize> {
        (0..CpuSet::count())
            .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
            .collect()
    }

    #[test]
    fn the_last_cpu_of_this_process_is_one_it_may_run_on() {
        let cpu = last_cpu(std::process::id()).expect("own stat");
        let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
        assert!(allowed.is_set(cpu).unwrap(), "cpu {cpu}");
    }

    #[test]
    fn a_process_that_cannot_exist_has_no_cpu() {
        assert_eq!(last_cpu(u32::MAX), None);
    }

    #[test]
    fn a_reaper_leaves_its_victims_cpu_while_it_reaps_and_gets_its_cpus_back() {
        let own = sched_getaffinity(Pid::from_raw(0)).unwrap();
        let cpus = allowed_cpus(&own);
        let victim_cpu = *cpus.last().unwrap();
        let mut only_there = CpuSet::new();
        only_there.set(victim_cpu).unwrap();
        let mut command = Command::new("sleep");
        command.arg("30").stdin(Stdio::null());
        // SAFETY: sched_setaffinity is async-signal-safe, and nothing else
        // runs between fork and exec.
        unsafe {
            command.pre_exec(move || {
                sched_setaffinity(Pid::from_raw(0), &only_there).map_err(std::io::Error::from)
            });
        }
        let mut victim = command.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while last_cpu(victim.id()) != Some(victim_cpu) {
            assert!(
                Instant::now() < deadline,
                "the victim never ran on {victim_cpu}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }

        let (during, after) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let off = OffVictimCpu::enter(victim.id());
                    let during = sched_getaffinity(Pid::from_raw(0)).unwrap();
                    let moved = off.is_some();
                    drop(off);
                    (
                        moved.then_some(during),
                        sched_getaffinity(Pid::from_raw(0)).unwrap(),
                    )
                })
                .join()
                .unwrap()
        });
        victim.kill().unwrap();
        victim.wait().unwrap();

        if cpus.len() == 1 {
            assert!(during.is_none(), "moved off the only cpu");
        } else {
            let during = allowed_cpus(&during.expect("not moved off the victim's cpu"));
            let others: Vec<usize> = cpus.iter().copied().filter(|&c| c != victim_cpu).collect();
            assert_eq!(during, others);
        }
        assert_eq!(allowed_cpus(&after), cpus);
    }
}
