//! Fixtures for evictd's privileged integration tests: a private cgroup tree
//! that removes itself, a steerable workload process, and waiting on a
//! condition with a deadline (never a bare sleep).
//!
//! Everything lives under a private root (`evictd-test-<pid>-<n>`) in the
//! memory and pids hierarchies; nothing else on the machine is touched.
use std::{
    fs,
    io::{self, BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use evictd::cgroup::{CgroupFs, CgroupVersion};

/// Polls `condition` every few milliseconds until it holds or `deadline`
/// passes; the error names what was awaited.
pub fn wait_until(
    deadline: Duration,
    what: &str,
    mut condition: impl FnMut() -> bool,
) -> Result<(), String> {
    let start = Instant::now();
    while !condition() {
        if start.elapsed() > deadline {
            return Err(format!("timed out after {deadline:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// A private cgroup tree, removed (processes killed, children first) on drop.
pub struct CgroupTree {
    pub cgroupfs: CgroupFs,
    /// Name of the private root below each hierarchy root.
    name: String,
}

impl CgroupTree {
    pub fn new() -> io::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let cgroupfs = CgroupFs::discover().map_err(io::Error::other)?;
        let name = format!(
            "evictd-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let tree = Self { cgroupfs, name };
        if tree.cgroupfs.version == CgroupVersion::V2 {
            // Children get the controllers only if the root delegates them.
            let root = &tree.cgroupfs.memory_root;
            fs::write(root.join("cgroup.subtree_control"), "+memory +pids")?;
        }
        tree.create("")?;
        Ok(tree)
    }

    fn roots(&self) -> Vec<PathBuf> {
        let mut roots = vec![self.cgroupfs.memory_root.clone()];
        if let Some(pids) = &self.cgroupfs.pids_root
            && !roots.contains(pids)
        {
            roots.push(pids.clone());
        }
        roots
    }

    /// The cgroup path of `rel` as seen from a hierarchy root, e.g.
    /// `/evictd-test-1-0/node/kubepods`.
    pub fn path(&self, rel: &str) -> String {
        let rel = rel.trim_matches('/');
        if rel.is_empty() {
            format!("/{}", self.name)
        } else {
            format!("/{}/{rel}", self.name)
        }
    }

    pub fn memory_dir(&self, rel: &str) -> PathBuf {
        self.cgroupfs.memory_dir(&self.path(rel))
    }

    pub fn pids_dir(&self, rel: &str) -> io::Result<PathBuf> {
        self.cgroupfs
            .pids_dir(&self.path(rel))
            .map_err(io::Error::other)
    }

    /// Creates `rel` (and its parents) in every hierarchy.
    pub fn create(&self, rel: &str) -> io::Result<()> {
        for root in self.roots() {
            let dir = root.join(self.path(rel).trim_start_matches('/'));
            fs::create_dir_all(&dir)?;
            if self.cgroupfs.version == CgroupVersion::V2 && !rel.is_empty() {
                // Let `rel`'s own children have the controllers too.
                let _ = fs::write(dir.join("cgroup.subtree_control"), "+memory +pids");
            }
        }
        Ok(())
    }

    pub fn memory_id(&self, rel: &str) -> io::Result<u64> {
        CgroupFs::cgroup_id(&self.memory_dir(rel)).map_err(io::Error::other)
    }

    pub fn pids_id(&self, rel: &str) -> io::Result<u64> {
        CgroupFs::cgroup_id(&self.pids_dir(rel)?).map_err(io::Error::other)
    }

    pub fn set_memory_limit(&self, rel: &str, bytes: u64) -> io::Result<()> {
        let file = match self.cgroupfs.version {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        };
        fs::write(self.memory_dir(rel).join(file), bytes.to_string())
    }

    pub fn memory_usage(&self, rel: &str) -> io::Result<u64> {
        self.cgroupfs
            .read_memory(&self.path(rel))
            .map(|m| m.usage_bytes)
            .map_err(io::Error::other)
    }

    pub fn pids_current(&self, rel: &str) -> io::Result<u64> {
        self.cgroupfs
            .read_pids(&self.path(rel))
            .map_err(io::Error::other)
    }

    /// Kernel OOM kills inside `rel`.
    pub fn oom_kills(&self, rel: &str) -> io::Result<u64> {
        let file = match self.cgroupfs.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        let text = fs::read_to_string(self.memory_dir(rel).join(file))?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0))
    }

    /// Moves `pid` into `rel` in every hierarchy.
    pub fn move_pid(&self, rel: &str, pid: u32) -> io::Result<()> {
        for root in self.roots() {
            let dir = root.join(self.path(rel).trim_start_matches('/'));
            fs::write(dir.join("cgroup.procs"), pid.to_string())?;
        }
        Ok(())
    }

    /// Kills what runs in `rel` and removes it, children first.
    pub fn remove(&self, rel: &str) -> io::Result<()> {
        for root in self.roots() {
            remove_tree(&root.join(self.path(rel).trim_start_matches('/')))?;
        }
        Ok(())
    }
}

impl Drop for CgroupTree {
    fn drop(&mut self) {
        if let Err(e) = self.remove("") {
            eprintln!("cleanup of cgroup tree {} failed: {e}", self.name);
        }
    }
}

fn remove_tree(dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_type()?.is_dir() {
            remove_tree(&entry.path())?;
        }
    }
    // Only processes a test moved in live here.
    let procs = dir.join("cgroup.procs");
    let pids = || -> Vec<i32> {
        fs::read_to_string(&procs)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    for pid in pids() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    wait_until(Duration::from_secs(10), "killed processes to leave", || {
        pids().is_empty()
    })
    .map_err(io::Error::other)?;
    // rmdir can race with the last task's exit; retry briefly.
    let mut result = fs::remove_dir(dir);
    let _ = wait_until(Duration::from_secs(5), "cgroup removal", || {
        result = fs::remove_dir(dir);
        result.is_ok() || !dir.exists()
    });
    match result {
        Err(e) if dir.exists() => Err(e),
        _ => Ok(()),
    }
}

/// The `evictd-workload` process, steered line by line. Killed on drop.
pub struct Workload {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// How long one workload command may take (allocating hundreds of MiB on a
/// loaded 2-core machine included).
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);

impl Workload {
    /// Starts `binary` (pass `env!("CARGO_BIN_EXE_evictd-workload")`) and
    /// moves it into `rel` before it does anything.
    pub fn start_in(tree: &CgroupTree, rel: &str, binary: &str) -> io::Result<Self> {
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(io::Error::other("workload without pipes"));
        };
        let workload = Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        };
        tree.move_pid(rel, workload.pid())?;
        Ok(workload)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command and returns the number in its `ok N` reply.
    pub fn command(&mut self, command: &str) -> io::Result<u64> {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        // The reply comes once the effect is complete; a workload that stops
        // answering (killed, stuck) fails the read rather than hanging: the
        // child's death closes the pipe.
        let mut reply = String::new();
        let started = Instant::now();
        self.stdout.read_line(&mut reply)?;
        if started.elapsed() > COMMAND_DEADLINE {
            return Err(io::Error::other(format!(
                "{command:?} took {:?}",
                started.elapsed()
            )));
        }
        reply
            .trim()
            .strip_prefix("ok ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| io::Error::other(format!("{command:?} answered {reply:?}")))
    }

    pub fn alloc(&mut self, bytes: u64) -> io::Result<u64> {
        self.command(&format!("alloc {bytes}"))
    }

    pub fn free(&mut self, bytes: u64) -> io::Result<u64> {
        self.command(&format!("free {bytes}"))
    }

    pub fn fork(&mut self, count: u64) -> io::Result<u64> {
        self.command(&format!("fork {count}"))
    }

    pub fn reap(&mut self, count: u64) -> io::Result<u64> {
        self.command(&format!("reap {count}"))
    }

    /// Waits for the workload to exit (for example killed by the OOM killer).
    pub fn wait_exit(&mut self, deadline: Duration) -> io::Result<Option<ExitStatus>> {
        let mut status = None;
        let _ = wait_until(deadline, "workload exit", || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        Ok(status)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
