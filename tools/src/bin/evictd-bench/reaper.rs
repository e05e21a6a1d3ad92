//! The bench as the pods' shim. On a node, containerd's shim is a child
//! subreaper: when a pod's processes are killed, the ones whose parent died
//! first are re-parented to it and reaped at once. Here they would go to
//! this machine's PID 1, which reaps orphans up to ~2 s late; until then
//! they are zombies that `pids.current` still counts, so after the fork
//! bomb's kill the node's pid.available would come back seconds late and
//! the agent would conclude the pressure was outside the pods. While a
//! fork bomb runs, the bench is that subreaper, reaping at real-time
//! priority so that the zombies are gone by the time the kill reports the
//! pod empty.
use std::{
    fs,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};
use nix::{
    sys::{
        prctl,
        wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid},
    },
    unistd::Pid,
};

use crate::watch::make_realtime;

/// How often the reaper looks for orphans: short against the agent's kill.
const INTERVAL: Duration = Duration::from_millis(1);

pub struct Reaper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Makes this process a child subreaper and reaps every child that
    /// exits, except `ours` (the processes the bench started and reaps
    /// itself: the pods' workloads, the agent).
    pub fn start(ours: Vec<u32>) -> Result<Self> {
        prctl::set_child_subreaper(true).context("PR_SET_CHILD_SUBREAPER")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            make_realtime();
            while !stopped.load(Ordering::Relaxed) {
                if !reap(&ours) {
                    std::thread::sleep(INTERVAL);
                }
            }
            while reap(&ours) {}
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

/// Reaps exited children that are not `ours`; false if there was none.
fn reap(ours: &[u32]) -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    let pid = match waitid(Id::All, flags) {
        Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)) => pid,
        _ => return false,
    };
    if !ours.contains(&(pid.as_raw() as u32)) {
        // Only this process can reap its own child: the pid is still it.
        return waitpid(pid, None).is_ok();
    }
    // One of ours (the bomb, until the bench reaps it) is first in line
    // and hides the rest: try each other child by pid. Orphans become
    // children of this process's main thread.
    let children = fs::read_to_string(format!("/proc/self/task/{}/children", std::process::id()))
        .unwrap_or_default();
    let mut reaped = false;
    for child in children
        .split_whitespace()
        .filter_map(|pid| pid.parse::<u32>().ok())
        .filter(|pid| !ours.contains(pid))
    {
        let status = waitpid(Pid::from_raw(child as i32), Some(WaitPidFlag::WNOHANG));
        reaped |= !matches!(status, Ok(WaitStatus::StillAlive) | Err(_));
    }
    reaped
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // Orphans from now on go to PID 1 again.
        let _ = prctl::set_child_subreaper(false);
    }
}
