//! What keeps a pod from freezing: the tasks the v1 freezer has not
//! stopped yet, and the kernel function each waits in. A task stops on its
//! way back to user mode, so one blocked in the kernel (uninterruptible
//! sleep on a lock, I/O) holds the whole freeze for as long, and the kill
//! names it rather than leave a slow kill unexplained.
use std::{fmt, fs};

/// Where the v1 freezer parks each task it stops.
const REFRIGERATOR: &str = "__refrigerator";
/// Tasks named at most: a pod that will not freeze mostly has one blocked
/// task, and a fork bomb thousands.
const MAX_HOLDOUTS: usize = 8;
/// Tasks looked at at most (three small reads each), so that a fork bomb
/// freezing slowly does not cost its kill milliseconds more.
const MAX_EXAMINED: usize = 64;

/// A task of a freezing pod that the freezer has not stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holdout {
    /// The process (as `cgroup.procs` lists it) and the thread.
    pub pid: u32,
    pub tid: u32,
    /// Its state in `/proc/PID/task/TID/stat`: `R` running, `S` sleeping,
    /// `D` in uninterruptible sleep...
    pub state: char,
    /// The kernel function it waits in (`wchan`); none while it runs.
    pub waits_in: Option<String>,
}

impl fmt::Display for Holdout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.pid)?;
        if self.tid != self.pid {
            write!(f, "/{}", self.tid)?;
        }
        write!(f, " {}", self.state)?;
        if let Some(function) = &self.waits_in {
            write!(f, " {function}")?;
        }
        Ok(())
    }
}

/// The holdouts for a log line: `pid[/tid] state [function]`, comma
/// separated.
pub fn describe_holdouts(holdouts: &[Holdout]) -> String {
    holdouts
        .iter()
        .map(Holdout::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The threads of the processes `pids` that are not in the freezer's
/// refrigerator, at most `MAX_HOLDOUTS` among the first `MAX_EXAMINED`;
/// a process or thread gone meanwhile is left out.
pub fn freeze_holdouts(pids: impl IntoIterator<Item = u32>) -> Vec<Holdout> {
    let threads = pids.into_iter().flat_map(|pid| {
        let tids = fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        tids.filter_map(move |entry| Some((pid, entry.ok()?.file_name().to_str()?.parse().ok()?)))
    });
    threads
        .take(MAX_EXAMINED)
        .filter_map(|(pid, tid)| holdout(pid, tid))
        .take(MAX_HOLDOUTS)
        .collect()
}

fn holdout(pid: u32, tid: u32) -> Option<Holdout> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let waits_in = fs::read_to_string(format!("{dir}/wchan")).ok()?;
    if waits_in == REFRIGERATOR {
        return None;
    }
    let stat = fs::read_to_string(format!("{dir}/stat")).ok()?;
    Some(Holdout {
        pid,
        tid,
        state: stat_state(&stat)?,
        // The kernel writes 0 for a task on a CPU.
        waits_in: (!waits_in.is_empty() && waits_in != "0").then_some(waits_in),
    })
}

/// The state field of a `stat` file. It follows the command, which is in
/// parentheses and may itself hold any character, so the last `)` ends it.
fn stat_state(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    #[test]
    fn the_state_follows_the_last_parenthesis_of_the_command() {
        assert_eq!(stat_state("42 (a) b) S 1 42 42 0"), Some('S'));
        assert_eq!(stat_state("42 (sleep) D 1"), Some('D'));
        assert_eq!(stat_state("42 (truncated"), None);
    }

    #[test]
    fn a_sleeping_task_outside_any_freezer_is_named_with_where_it_waits() {
        let mut child = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Until it sleeps, the child runs (and may still be exec'ing); the
        // two files are read one after the other, so a look as it falls
        // asleep may find it on a CPU in the first.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let found = loop {
            let found = freeze_holdouts([pid]);
            let asleep = |task: &Holdout| task.state == 'S' && task.waits_in.is_some();
            if found.first().is_some_and(asleep) || std::time::Instant::now() >= deadline {
                break found;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].pid, found[0].tid, found[0].state),
            (pid, pid, 'S')
        );
        assert!(
            found[0]
                .waits_in
                .as_deref()
                .is_some_and(|f| f.contains("sleep")),
            "{found:?}"
        );
        assert_eq!(
            describe_holdouts(&found),
            format!("{pid} S {}", found[0].waits_in.as_ref().unwrap())
        );
    }

    #[test]
    fn a_process_gone_is_left_out() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(freeze_holdouts([pid]), []);
    }
}
