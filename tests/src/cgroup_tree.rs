//! A private cgroup tree below the memory and pids (and v1 freezer)
//! hierarchy roots, removed with everything running in it when it drops.
//!
//! Everything happens below `<mount>/evictd-test-<pid>-<n>`: the fixture
//! never writes to a hierarchy root or to a cgroup it did not create.
use std::{
    fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::{
    layout::{CgroupLayout, CgroupVersion, Hierarchy},
    wait::wait_until,
};

/// A ceiling on the whole private tree, so a runaway test hits its own
/// limit (and the OOM killer inside it) long before the machine's 24 GiB.
pub const TREE_MEMORY_LIMIT: u64 = 4 << 30;
/// A ceiling on tasks in the private tree: a fork loop stops here.
pub const TREE_PIDS_LIMIT: u64 = 2048;
/// The pods' cgroup of kubelet's cgroupfs driver, below the root.
pub const KUBEPODS: &str = "kubepods";
/// How long killed processes may take to leave a cgroup, and a busy cgroup
/// to become removable.
const CLEANUP_DEADLINE: Duration = Duration::from_secs(5);

/// Which controller's hierarchy a path or id refers to. On cgroup v2 memory
/// and pids name the same directory, and there is no freezer hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Memory,
    Pids,
    /// The v1 freezer, where mounted ([`CgroupLayout::freezer`]).
    Freezer,
}

/// A uniquely named private cgroup in the memory and pids hierarchies, with
/// the sub-cgroups a test creates below it. Paths given to its methods
/// (`rel`) are relative to the private root: `""` is the root itself,
/// `"node/kubepods/pod1"` a descendant.
///
/// Dropping it SIGKILLs every process in the tree (only processes a test
/// moved in can be there) and removes the directories, children first; this
/// also runs when a test panics.
#[derive(Debug)]
pub struct PrivateCgroupTree {
    layout: CgroupLayout,
    name: String,
}

impl PrivateCgroupTree {
    /// Creates `evictd-test-<pid>-<n>` in every hierarchy (one on v2, memory
    /// and pids on v1), capped at [`TREE_MEMORY_LIMIT`] and
    /// [`TREE_PIDS_LIMIT`].
    pub fn new() -> io::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "evictd-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let tree = Self::created(name)?;
        tree.set_memory_limit("", TREE_MEMORY_LIMIT)?;
        tree.set_pids_limit("", TREE_PIDS_LIMIT)?;
        Ok(tree)
    }

    /// `kubepods` at the hierarchy root, where kubelet's cgroupfs driver
    /// puts the pods of a real node, with no limit: the node is the whole
    /// machine. Only for a throwaway machine (the bench's VM guest), never
    /// a host: it refuses when a `kubepods` is already there (dropping the
    /// tree removes it with everything in it).
    pub fn kubepods_at_root() -> io::Result<Self> {
        for hierarchy in CgroupLayout::discover()?.hierarchies() {
            let existing = hierarchy.mount_point.join(KUBEPODS);
            if existing.exists() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists: a real node's pods", existing.display()),
                ));
            }
        }
        Self::created(KUBEPODS.to_owned())
    }

    /// Creates `name` in every hierarchy, with the memory and pids
    /// controllers delegated to its children.
    fn created(name: String) -> io::Result<Self> {
        let tree = Self {
            layout: CgroupLayout::discover()?,
            name,
        };
        // From here on a failure drops `tree`, which removes what was made.
        for hierarchy in tree.layout.hierarchies() {
            let root = hierarchy.mount_point.join(&tree.name);
            fs::create_dir(&root).map_err(|e| context("creating", &root, e))?;
            if hierarchy.version == CgroupVersion::V2 {
                // The hierarchy root's own cgroup.subtree_control is not ours
                // to change: it must already delegate both controllers.
                let available = read(&root.join("cgroup.controllers"))?;
                for controller in ["memory", "pids"] {
                    if !available.split_whitespace().any(|c| c == controller) {
                        return Err(io::Error::new(
                            io::ErrorKind::Unsupported,
                            format!(
                                "{} does not get the {controller} controller: enable it in {}/cgroup.subtree_control",
                                root.display(),
                                hierarchy.mount_point.display()
                            ),
                        ));
                    }
                }
                enable_controllers(&root)?;
            }
        }
        Ok(tree)
    }

    /// The private root's directory name, `evictd-test-<pid>-<n>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    /// `mkdir -p` of `rel` in every hierarchy. On v2 each new cgroup's parent
    /// first delegates memory and pids to its children, which fails (EBUSY)
    /// if that parent has processes: v2 runs processes in leaves only.
    pub fn create(&self, rel: &str) -> io::Result<()> {
        let parts = components(rel)?;
        for hierarchy in self.layout.hierarchies() {
            let mut dir = hierarchy.mount_point.join(&self.name);
            for part in &parts {
                if hierarchy.version == CgroupVersion::V2 {
                    enable_controllers(&dir)?;
                }
                dir.push(part);
                match fs::create_dir(&dir) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                        return Err(context("creating", &dir, e));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The directory of `rel` in `controller`'s hierarchy.
    ///
    /// # Panics
    /// If `rel` leaves the private tree (`..`), or the controller has no
    /// hierarchy (the freezer on v2): a bug in the test.
    pub fn dir(&self, controller: Controller, rel: &str) -> PathBuf {
        let hierarchy = match self.hierarchy(controller) {
            Ok(hierarchy) => hierarchy,
            Err(e) => panic!("{e}"),
        };
        match components(rel) {
            Ok(parts) => parts
                .iter()
                .fold(hierarchy.mount_point.join(&self.name), |dir, part| {
                    dir.join(part)
                }),
            Err(e) => panic!("{e}"),
        }
    }

    /// The cgroup's path as the kernel and the agent name it, from the
    /// hierarchy root: `"node"` is `"/evictd-test-123-0/node"`. (Relative to
    /// the mount point, which is the hierarchy root everywhere except in a
    /// container that bind-mounts a subtree.)
    ///
    /// # Panics
    /// If `rel` leaves the private tree (`..`).
    pub fn relative_path(&self, rel: &str) -> String {
        match components(rel) {
            Ok(parts) => std::iter::once(self.name.as_str())
                .chain(parts)
                .fold(String::new(), |path, part| path + "/" + part),
            Err(e) => panic!("{e}"),
        }
    }

    /// The kernel's cgroup id: the inode number of the cgroup's directory
    /// (kernfs uses the cgroup's 64-bit id as the inode number).
    pub fn cgroup_id(&self, controller: Controller, rel: &str) -> io::Result<u64> {
        let dir = self.checked_dir(controller, rel)?;
        fs::metadata(&dir)
            .map(|m| m.ino())
            .map_err(|e| context("reading", &dir, e))
    }

    /// The hard memory limit: v1 `memory.limit_in_bytes`, v2 `memory.max`.
    pub fn set_memory_limit(&self, rel: &str, bytes: u64) -> io::Result<()> {
        let file = match self.layout.memory.version {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        };
        write(
            &self.checked_dir(Controller::Memory, rel)?.join(file),
            &bytes.to_string(),
        )
    }

    /// `pids.max`: forks beyond it fail with EAGAIN.
    pub fn set_pids_limit(&self, rel: &str, tasks: u64) -> io::Result<()> {
        write(
            &self.checked_dir(Controller::Pids, rel)?.join("pids.max"),
            &tasks.to_string(),
        )
    }

    /// Bytes charged to the cgroup and its descendants: v1
    /// `memory.usage_in_bytes`, v2 `memory.current`.
    pub fn memory_usage(&self, rel: &str) -> io::Result<u64> {
        read_u64(&self.memory_usage_file(rel)?)
    }

    /// The file [`PrivateCgroupTree::memory_usage`] reads.
    pub fn memory_usage_file(&self, rel: &str) -> io::Result<PathBuf> {
        let file = match self.layout.memory.version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        };
        Ok(self.checked_dir(Controller::Memory, rel)?.join(file))
    }

    /// `pids.current`: tasks (threads, not just processes) in the cgroup and
    /// its descendants, including exited ones not yet reaped.
    pub fn pids_current(&self, rel: &str) -> io::Result<u64> {
        read_u64(
            &self
                .checked_dir(Controller::Pids, rel)?
                .join("pids.current"),
        )
    }

    /// Kernel OOM kills: the `oom_kill` line of v1 `memory.oom_control`
    /// (victims in this cgroup only) or v2 `memory.events` (this cgroup and
    /// its descendants).
    pub fn oom_kill_count(&self, rel: &str) -> io::Result<u64> {
        let file = match self.layout.memory.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        let path = self.checked_dir(Controller::Memory, rel)?.join(file);
        let text = read(&path)?;
        keyed_value(&text, "oom_kill").ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no oom_kill line in {text:?}", path.display()),
            )
        })
    }

    /// The processes (thread group ids) in the cgroup itself, not its
    /// descendants.
    pub fn procs(&self, controller: Controller, rel: &str) -> io::Result<Vec<u32>> {
        read_procs(&self.checked_dir(controller, rel)?)
    }

    /// Moves process `pid` (all its threads) into `rel` in every hierarchy.
    /// Only move processes the test started.
    pub fn move_pid(&self, rel: &str, pid: u32) -> io::Result<()> {
        let parts = components(rel)?;
        for hierarchy in self.layout.hierarchies() {
            let dir = parts
                .iter()
                .fold(hierarchy.mount_point.join(&self.name), |d, p| d.join(p));
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Moves thread `tid` alone into `rel` in every hierarchy (v1 `tasks`;
    /// v2 moves whole processes only, outside threaded cgroups). The
    /// thread's process then shows in the cgroup's `cgroup.procs`; the
    /// thread leaves the cgroup when it exits. Only move threads the test
    /// started.
    pub fn move_thread(&self, rel: &str, tid: u32) -> io::Result<()> {
        if self.layout.memory.version == CgroupVersion::V2 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "cgroup v2 moves single threads only within threaded subtrees",
            ));
        }
        let parts = components(rel)?;
        for hierarchy in self.layout.hierarchies() {
            let dir = parts
                .iter()
                .fold(hierarchy.mount_point.join(&self.name), |d, p| d.join(p));
            write(&dir.join("tasks"), &tid.to_string())?;
        }
        Ok(())
    }

    /// `freezer.state` of `rel`: `THAWED`, `FREEZING` or `FROZEN`.
    pub fn freezer_state(&self, rel: &str) -> io::Result<String> {
        let path = self
            .checked_dir(Controller::Freezer, rel)?
            .join("freezer.state");
        Ok(read(&path)?.trim().to_owned())
    }

    /// SIGKILLs every process in `rel` and its descendants and removes the
    /// cgroups, children first, in every hierarchy. `""` removes the whole
    /// tree (drop does that).
    ///
    /// Where a freezer hierarchy exists the subtree is first frozen, every
    /// process in it SIGKILLed, and thawed: a process that keeps forking
    /// successors (the workload's `hop`) cannot outrun the kill by pid, and
    /// a cgroup a failed test left frozen is thawed so its tasks can die.
    pub fn remove(&self, rel: &str) -> io::Result<()> {
        let parts = components(rel)?;
        if let Some(freezer) = &self.layout.freezer {
            let dir = parts
                .iter()
                .fold(freezer.mount_point.join(&self.name), |d, p| d.join(p));
            kill_frozen(&dir)?;
        }
        let mut first_error = None;
        for hierarchy in self.layout.hierarchies() {
            let dir = parts
                .iter()
                .fold(hierarchy.mount_point.join(&self.name), |d, p| d.join(p));
            if let Err(e) = remove_tree(&dir) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn hierarchy(&self, controller: Controller) -> io::Result<&Hierarchy> {
        match controller {
            Controller::Memory => Ok(&self.layout.memory),
            Controller::Pids => Ok(&self.layout.pids),
            Controller::Freezer => self.layout.freezer.as_ref().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "no v1 freezer hierarchy is mounted",
                )
            }),
        }
    }

    fn checked_dir(&self, controller: Controller, rel: &str) -> io::Result<PathBuf> {
        components(rel)?;
        self.hierarchy(controller)?;
        Ok(self.dir(controller, rel))
    }
}

impl Drop for PrivateCgroupTree {
    fn drop(&mut self) {
        if let Err(e) = self.remove("") {
            eprintln!(
                "evictd-integration: cleaning up cgroup tree {}: {e}",
                self.name
            );
        }
    }
}

/// The components of a path relative to the private root; `..` would leave
/// it, so it is refused.
fn components(rel: &str) -> io::Result<Vec<&str>> {
    let parts: Vec<&str> = rel
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cgroup path {rel:?} leaves the private tree"),
        ));
    }
    Ok(parts)
}

/// Lets the children of v2 cgroup `dir` have the memory and pids
/// controllers (writing an already enabled controller is a no-op).
fn enable_controllers(dir: &Path) -> io::Result<()> {
    write(&dir.join("cgroup.subtree_control"), "+memory +pids")
}

/// Kills what runs in `dir` and below, then removes the directories
/// bottom-up. A directory that is already gone is fine.
fn remove_tree(dir: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(context("listing", dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| context("listing", dir, e))?;
        if entry.file_type()?.is_dir() {
            remove_tree(&entry.path())?;
        }
    }
    kill_all(dir)?;
    // rmdir can briefly fail with EBUSY right after the last task left.
    let mut outcome = Ok(());
    let _ = wait_until(CLEANUP_DEADLINE, "rmdir", || {
        outcome = match fs::remove_dir(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        };
        !matches!(&outcome, Err(e) if e.kind() == io::ErrorKind::ResourceBusy)
    });
    outcome.map_err(|e| context("removing", dir, e))
}

/// Freezes v1 freezer cgroup `dir`, SIGKILLs every process in it and its
/// descendants, and thaws them all so the killed tasks exit. Frozen tasks
/// cannot fork, so no process escapes by changing its pid. A cgroup that
/// does not freeze in time (a task in uninterruptible sleep) is killed
/// anyway; [`kill_all`] then catches what is left.
fn kill_frozen(dir: &Path) -> io::Result<()> {
    let state = dir.join("freezer.state");
    match fs::write(&state, "FROZEN") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other.map_err(|e| context("writing FROZEN to", &state, e))?,
    }
    let _ = wait_until(CLEANUP_DEADLINE, "the cgroup to freeze", || {
        fs::read_to_string(&state).is_ok_and(|s| s.trim() == "FROZEN")
    });
    let killed = kill_subtree_once(dir);
    let thawed = thaw_subtree(dir);
    killed.and(thawed)
}

fn kill_subtree_once(dir: &Path) -> io::Result<()> {
    for pid in read_procs(dir)? {
        signal_listed(pid);
    }
    for child in child_dirs(dir)? {
        kill_subtree_once(&child)?;
    }
    Ok(())
}

/// Thaws `dir` and each descendant: thawing a parent leaves a child that
/// was frozen on its own frozen.
fn thaw_subtree(dir: &Path) -> io::Result<()> {
    let state = dir.join("freezer.state");
    fs::write(&state, "THAWED").map_err(|e| context("writing THAWED to", &state, e))?;
    for child in child_dirs(dir)? {
        thaw_subtree(&child)?;
    }
    Ok(())
}

fn child_dirs(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| context("listing", dir, e))? {
        let entry = entry.map_err(|e| context("listing", dir, e))?;
        if entry.file_type()?.is_dir() {
            dirs.push(entry.path());
        }
    }
    Ok(dirs)
}

/// SIGKILLs the processes in cgroup `dir` (not its descendants) until none
/// is left, re-reading the list so a process forked meanwhile is caught.
/// Only processes a test moved into the private tree, or their children,
/// can be there. An exited process leaves `cgroup.procs` at once, even while
/// it waits as a zombie for its parent.
fn kill_all(dir: &Path) -> io::Result<()> {
    let mut last_error = None;
    let emptied = wait_until(
        CLEANUP_DEADLINE,
        "killed processes to leave",
        || match read_procs(dir) {
            Ok(pids) if pids.is_empty() => true,
            Ok(pids) => {
                for pid in pids {
                    signal_listed(pid);
                }
                false
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => {
                last_error = Some(e);
                false
            }
        },
    );
    match (emptied, last_error) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(e)) => Err(e),
        (Err(timeout), None) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{}: {timeout}", dir.display()),
        )),
    }
}

/// SIGKILLs process `pid` as a `cgroup.procs` lists it. A 0 there is a
/// process this pid namespace cannot name (one exiting, past the release of
/// its pid): kill(0) would take this test's own process group instead, as
/// it once did in a guest (the test and its `timeout` SIGKILLed by the
/// test's thread).
fn signal_listed(pid: u32) {
    let Ok(raw) = i32::try_from(pid) else {
        return;
    };
    if raw > 0 {
        // ESRCH: it exited between the read and the kill.
        let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
    }
}

fn read_procs(dir: &Path) -> io::Result<Vec<u32>> {
    let path = dir.join("cgroup.procs");
    read(&path)?
        .lines()
        .map(|line| {
            line.trim().parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not a pid: {line:?}", path.display()),
                )
            })
        })
        .collect()
}

/// The value of `key` in a `key value` per line file (memory.oom_control,
/// memory.events).
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read(path: &Path) -> io::Result<String> {
    fs::read_to_string(path).map_err(|e| context("reading", path, e))
}

fn read_u64(path: &Path) -> io::Result<u64> {
    let text = read(path)?;
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a number: {text:?}", path.display()),
        )
    })
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| context(&format!("writing {value:?} to"), path, e))
}

/// Keeps the error kind and adds what was done to which file.
fn context(action: &str, path: &Path, error: io::Error) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("{action} {}: {error}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_stay_inside_the_tree() {
        assert_eq!(components("").unwrap(), Vec::<&str>::new());
        assert_eq!(components("/a//b/./c/").unwrap(), ["a", "b", "c"]);
        let err = components("a/../../process_api").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn finds_oom_kill_in_v1_and_v2_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed_value(v1, "oom_kill"), Some(3));
        assert_eq!(keyed_value(v2, "oom_kill"), Some(2));
        assert_eq!(keyed_value(v2, "oom"), Some(2));
        assert_eq!(keyed_value("under_oom 0\n", "oom_kill"), None);
    }

    /// Were the 0 signalled, kill(0) would SIGKILL this test's own process
    /// group, and the run would end here.
    #[test]
    fn a_pid_listed_as_0_is_not_signalled() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("cgroup.procs"), "0\n").unwrap();
        kill_subtree_once(dir.path()).unwrap();
        assert_eq!(read_procs(dir.path()).unwrap(), [0]);
    }
}
