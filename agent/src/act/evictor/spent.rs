//! The eviction budget on disk (`budget.json` in `--state-dir`): when each
//! eviction of the budget's last period started, so that a restarted agent
//! (a crash-looping one above all) does not start with the whole budget
//! again. Wall-clock times, since CLOCK_MONOTONIC starts again at a reboot.
//!
//! Written after every eviction started, on a thread of its own: a write
//! and its fsyncs must not delay the kill they follow. At most
//! [`REMEMBERED`] evictions are kept, so the file stays small whatever the
//! budget's count. Read once, at startup, and validated: the node it
//! belongs to, its format, its length, and no time in the future past
//! [`CLOCK_SKEW`]; a file that fails is set aside with a warning. The
//! directory is made only by the first write: an agent that never evicts
//! leaves nothing behind.
use std::{
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError},
    thread::JoinHandle,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::state::StateDir;

const FILE: &str = "budget.json";
/// Bumped when the file's meaning changes; another version is set aside.
const FORMAT: u32 = 1;
/// Evictions kept at most. Budgets are a few evictions a minute; a budget
/// counting more per period is remembered only for its latest ones.
pub const REMEMBERED: usize = 1024;
/// How far in the future an eviction may seem to have started (a clock
/// stepped back since) before the file is taken as forged or corrupt.
const CLOCK_SKEW: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetFile {
    format: u32,
    /// The node whose evictions these were (`--node-name`; empty without
    /// it): a state directory moved to another node lends it nothing.
    node: String,
    /// When each eviction started, Unix milliseconds, oldest first.
    spent: Vec<u64>,
}

/// The budget's file and the thread that writes it. Dropping it writes
/// what is pending and stops the thread.
pub struct SpentBudget {
    writer: Arc<Writer>,
    thread: Option<JoinHandle<()>>,
}

struct Writer {
    dir: PathBuf,
    node: String,
    pending: Mutex<PendingWrite>,
    wake: Condvar,
}

#[derive(Default)]
struct PendingWrite {
    spent: Option<Vec<u64>>,
    stop: bool,
}

fn lock(pending: &Mutex<PendingWrite>) -> MutexGuard<'_, PendingWrite> {
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SpentBudget {
    /// The budget of node `node` in state directory `dir`; `None` (with a
    /// warning: evictions are then forgotten at a restart) when its
    /// writing thread cannot start.
    pub fn new(dir: &Path, node: &str) -> Option<Self> {
        let writer = Arc::new(Writer {
            dir: dir.to_owned(),
            node: node.to_owned(),
            pending: Mutex::default(),
            wake: Condvar::new(),
        });
        let thread_writer = Arc::clone(&writer);
        match std::thread::Builder::new()
            .name("evictd-budget".into())
            .spawn(move || thread_writer.serve())
        {
            Ok(thread) => Some(Self {
                writer,
                thread: Some(thread),
            }),
            Err(e) => {
                warn!(error = %e, "cannot start the thread that keeps the eviction budget on disk; a restart forgets it");
                None
            }
        }
    }

    /// How long ago each eviction a previous agent left in the file
    /// started, at wall-clock `now`; none when there is no file or it
    /// cannot be trusted.
    pub fn load(&self, now: SystemTime) -> Vec<Duration> {
        if !self.writer.dir.exists() {
            return Vec::new();
        }
        let dir = match StateDir::open(&self.writer.dir) {
            Ok(dir) => dir,
            Err(e) => {
                warn!(error = %e, "the eviction budget of the last agent cannot be read; starting with the whole budget");
                return Vec::new();
            }
        };
        let bytes = match dir.read(FILE) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Vec::new(),
            Err(e) => return set_aside(&dir, &e.to_string()),
        };
        let file: BudgetFile = match serde_json::from_slice(&bytes) {
            Ok(file) => file,
            Err(e) => return set_aside(&dir, &e.to_string()),
        };
        let now_ms = unix_ms(now);
        let skew_ms = u64::try_from(CLOCK_SKEW.as_millis()).unwrap_or(u64::MAX);
        let problem = if file.format != FORMAT {
            Some(format!(
                "format {} (this agent reads {FORMAT})",
                file.format
            ))
        } else if file.node != self.writer.node {
            Some(format!(
                "written on node {:?}, not this one ({:?})",
                file.node, self.writer.node
            ))
        } else if file.spent.len() > REMEMBERED {
            Some(format!(
                "{} evictions, more than the {REMEMBERED} kept",
                file.spent.len()
            ))
        } else if file
            .spent
            .iter()
            .any(|&at| at > now_ms.saturating_add(skew_ms))
        {
            Some("an eviction in the future".to_owned())
        } else {
            None
        };
        if let Some(problem) = problem {
            return set_aside(&dir, &problem);
        }
        let mut ago: Vec<Duration> = file
            .spent
            .iter()
            .map(|&at| Duration::from_millis(now_ms.saturating_sub(at)))
            .collect();
        ago.sort_unstable_by(|a, b| b.cmp(a));
        ago
    }

    /// Keeps that evictions started `ago` before wall-clock `now`, oldest
    /// first; written soon after, on the budget's thread.
    pub fn save(&self, ago: impl Iterator<Item = Duration>, now: SystemTime) {
        let now_ms = unix_ms(now);
        let mut spent: Vec<u64> = ago
            .map(|ago| now_ms.saturating_sub(u64::try_from(ago.as_millis()).unwrap_or(u64::MAX)))
            .collect();
        spent.sort_unstable();
        let drop = spent.len().saturating_sub(REMEMBERED);
        spent.drain(..drop);
        lock(&self.writer.pending).spent = Some(spent);
        self.writer.wake.notify_one();
    }
}

impl Drop for SpentBudget {
    fn drop(&mut self) {
        lock(&self.writer.pending).stop = true;
        self.writer.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Writer {
    /// Writes each new list, the latest only, until told to stop (after
    /// writing what is pending then).
    fn serve(&self) {
        let mut failing = false;
        loop {
            let (spent, stop) = {
                let mut pending = lock(&self.pending);
                while pending.spent.is_none() && !pending.stop {
                    pending = self
                        .wake
                        .wait(pending)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                (pending.spent.take(), pending.stop)
            };
            if let Some(spent) = spent {
                let file = BudgetFile {
                    format: FORMAT,
                    node: self.node.clone(),
                    spent,
                };
                let written = serde_json::to_vec(&file)
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| {
                        StateDir::open(&self.dir)
                            .and_then(|dir| dir.write(FILE, &bytes))
                            .map_err(|e| e.to_string())
                    });
                match written {
                    Ok(()) if failing => {
                        info!(path = %self.dir.join(FILE).display(), "eviction budget written again");
                        failing = false;
                    }
                    Ok(()) => {}
                    Err(error) if !failing => {
                        warn!(
                            error,
                            "cannot write the eviction budget; a restart would forget the evictions it counts"
                        );
                        failing = true;
                    }
                    Err(_) => {}
                }
            }
            if stop {
                return;
            }
        }
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

fn set_aside(dir: &StateDir, problem: &str) -> Vec<Duration> {
    match dir.set_aside(FILE) {
        Ok(kept) => warn!(problem, kept = %kept.display(),
            "the eviction budget of the last agent cannot be used; set aside, starting with the whole budget"),
        Err(e) => warn!(problem, error = %e,
            "the eviction budget of the last agent cannot be used; starting with the whole budget"),
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    /// Saves `ago` for `node` in `dir` and waits until the file is there.
    fn saved(dir: &Path, node: &str, ago: &[Duration]) {
        let budget = SpentBudget::new(dir, node).unwrap();
        budget.save(ago.iter().copied(), now());
        // Dropping it writes what is pending.
        drop(budget);
    }

    #[test]
    fn the_evictions_spent_survive_a_restart_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("evictd");
        let budget = SpentBudget::new(&state, "node-a").unwrap();
        assert!(budget.load(now()).is_empty(), "no file, no directory yet");
        assert!(!state.exists(), "nothing made before the first eviction");
        drop(budget);
        saved(
            &state,
            "node-a",
            &[Duration::from_secs(5), Duration::from_secs(50)],
        );
        let restarted = SpentBudget::new(&state, "node-a").unwrap();
        let later = now() + Duration::from_secs(1);
        assert_eq!(
            restarted.load(later),
            [Duration::from_secs(51), Duration::from_secs(6)]
        );
    }

    #[test]
    fn another_nodes_or_a_forged_budget_is_set_aside() {
        for (node, ago, loaded_on) in [
            ("node-b", vec![MINUTE], "node-a"),
            ("node-a", vec![MINUTE], "node-a"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            saved(dir.path(), node, &ago);
            // Read an hour earlier, the second one lies in the future.
            let at = if node == loaded_on {
                now() - 60 * MINUTE
            } else {
                now()
            };
            let budget = SpentBudget::new(dir.path(), loaded_on).unwrap();
            assert!(budget.load(at).is_empty(), "{node}");
            assert!(dir.path().join("budget.json.corrupt").exists(), "{node}");
        }
    }

    #[test]
    fn the_file_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let many: Vec<Duration> = (0..2 * REMEMBERED as u64)
            .map(Duration::from_millis)
            .collect();
        saved(dir.path(), "node-a", &many);
        let budget = SpentBudget::new(dir.path(), "node-a").unwrap();
        let loaded = budget.load(now());
        assert_eq!(loaded.len(), REMEMBERED);
        assert_eq!(loaded.last(), Some(&Duration::ZERO), "the latest kept");
        std::fs::write(
            dir.path().join(FILE),
            serde_json::to_vec(&BudgetFile {
                format: FORMAT,
                node: "node-a".into(),
                spent: vec![0; REMEMBERED + 1],
            })
            .unwrap(),
        )
        .unwrap();
        assert!(budget.load(now()).is_empty());
    }
}
