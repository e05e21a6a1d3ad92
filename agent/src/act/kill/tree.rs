//! The files of a pod's cgroup subtree the executor reads and writes:
//! path checks, the processes in the subtree, and the v1 freezer.
use std::{
    collections::BTreeSet,
    fs, io,
    io::Write as _,
    path::{Path, PathBuf},
};

use super::KillError;
use crate::node::cgroupfs::is_gone;

/// Refuses cgroup paths that would reach beyond one pod: empty, the
/// hierarchy root, or anything with `..` in it.
pub(super) fn validate(cgroup: &str) -> Result<(), KillError> {
    let reason = if cgroup.trim_matches('/').is_empty() {
        "it is empty or the hierarchy root"
    } else if cgroup.contains("..") {
        "it contains \"..\""
    } else {
        return Ok(());
    };
    Err(KillError::UnsafePath {
        cgroup: cgroup.to_owned(),
        reason,
    })
}

/// Adds every pid in `cgroup.procs` of `dir` and of all its descendants to
/// `pids`. A cgroup removed meanwhile (the pod's processes exited and
/// something cleaned up) holds nothing.
pub(super) fn subtree_pids(dir: &Path, pids: &mut BTreeSet<u32>) -> Result<(), KillError> {
    let procs = dir.join("cgroup.procs");
    let text = read_if_present(&procs)?.unwrap_or_default();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let pid = line.parse().map_err(|_| KillError::Parse {
            path: procs.clone(),
            text: line.to_owned(),
        })?;
        // 0: a process outside this pid namespace, which cannot be signalled.
        if pid != 0 {
            pids.insert(pid);
        }
    }
    for child in child_dirs(dir)? {
        subtree_pids(&child, pids)?;
    }
    Ok(())
}

/// Writes `value` to an existing cgroup file. Never creates the file: a
/// missing one is `NotFound` (cgroupfs would refuse the create anyway, with
/// a less telling error).
pub(super) fn write_existing(path: &Path, value: &str) -> io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?
        .write_all(value.as_bytes())
}

/// A pod's cgroup in the v1 freezer hierarchy.
#[derive(Debug)]
pub(super) struct Freezer {
    dir: PathBuf,
}

impl Freezer {
    /// The freezer cgroup at `dir`, if it exists (kubelet creates a pod's
    /// cgroup in every mounted hierarchy, but a freezer mounted later or by
    /// hand may lack it).
    pub(super) fn at(dir: PathBuf) -> Option<Self> {
        dir.join("freezer.state").is_file().then_some(Self { dir })
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Asks the kernel to freeze the subtree (v1 freezing is hierarchical);
    /// it reads `FROZEN` once every task in it is stopped. `Ok(false)` if
    /// the cgroup is gone: its tasks exited and it was removed (kubelet
    /// cleaning up a pod that ended on its own), so nothing is left to stop.
    pub(super) fn freeze(&self) -> Result<bool, KillError> {
        let path = self.dir.join("freezer.state");
        match write_existing(&path, "FROZEN") {
            Ok(()) => Ok(true),
            Err(e) if is_gone(&e) => Ok(false),
            Err(e) => Err(KillError::io(&path, e)),
        }
    }

    /// Whether every task is stopped; `None` once the cgroup is gone.
    pub(super) fn is_frozen(&self) -> Result<Option<bool>, KillError> {
        let path = self.dir.join("freezer.state");
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim() == "FROZEN")),
            Err(e) if is_gone(&e) => Ok(None),
            Err(e) => Err(KillError::io(&path, e)),
        }
    }

    /// Thaws the cgroup and every descendant. Thawing the pod alone would
    /// leave a container someone froze on its own (a paused container,
    /// `freezer.self_freezing`) frozen, and its SIGKILLed tasks would never
    /// get to exit.
    pub(super) fn thaw_subtree(&self) -> Result<(), KillError> {
        thaw(&self.dir)
    }

    /// Whether this cgroup itself was asked to freeze (`freezer.self_freezing`),
    /// rather than frozen through an ancestor.
    pub(super) fn is_self_frozen(&self) -> Result<bool, KillError> {
        let path = self.dir.join("freezer.self_freezing");
        match fs::read_to_string(&path) {
            Ok(text) => Ok(text.trim() == "1"),
            Err(e) if is_gone(&e) => Ok(false),
            Err(e) => Err(KillError::io(&path, e)),
        }
    }

    /// Thaws this cgroup only: a descendant frozen on its own (a paused
    /// container) stays so.
    pub(super) fn thaw(&self) -> Result<(), KillError> {
        let path = self.dir.join("freezer.state");
        match write_existing(&path, "THAWED") {
            Err(e) if is_gone(&e) => Ok(()),
            other => other.map_err(|e| KillError::io(&path, e)),
        }
    }
}

fn thaw(dir: &Path) -> Result<(), KillError> {
    let path = dir.join("freezer.state");
    match write_existing(&path, "THAWED") {
        Err(e) if is_gone(&e) => return Ok(()),
        other => other.map_err(|e| KillError::io(&path, e))?,
    }
    for child in child_dirs(dir)? {
        thaw(&child)?;
    }
    Ok(())
}

/// The sub-cgroups of `dir`; none if it is gone.
pub(super) fn child_dirs(dir: &Path) -> Result<Vec<PathBuf>, KillError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if is_gone(&e) => return Ok(Vec::new()),
        Err(e) => return Err(KillError::io(dir, e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| KillError::io(dir, e))?;
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => dirs.push(entry.path()),
            Ok(_) => {}
            Err(e) if is_gone(&e) => {}
            Err(e) => return Err(KillError::io(&entry.path(), e)),
        }
    }
    Ok(dirs)
}

fn read_if_present(path: &Path) -> Result<Option<String>, KillError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if is_gone(&e) => Ok(None),
        Err(e) => Err(KillError::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::kill::tests::Fixture;

    #[test]
    fn refuses_paths_beyond_one_pod() {
        for bad in ["", "/", "//", "/kubepods/../system.slice", "/a/..", ".."] {
            let err = validate(bad).unwrap_err();
            assert!(matches!(err, KillError::UnsafePath { .. }), "{bad:?}");
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        validate("/sandbox/kubepods/burstable/pod1234").unwrap();
        validate("kubepods/pod1").unwrap();
    }

    #[test]
    fn lists_the_pids_of_a_cgroup_and_all_its_descendants() {
        let fixture = Fixture::new("list");
        let pod = fixture.cgroup("memory/pod", "10\n11\n");
        fixture.cgroup("memory/pod/c1", "20\n");
        fixture.cgroup("memory/pod/c2", "");
        fixture.cgroup("memory/pod/c2/nested", "30\n0\n");
        fixture.cgroup("memory/other", "99\n");
        let mut pids = BTreeSet::new();
        subtree_pids(&pod, &mut pids).unwrap();
        assert_eq!(pids.into_iter().collect::<Vec<_>>(), [10, 11, 20, 30]);

        let mut none = BTreeSet::new();
        subtree_pids(&fixture.path("memory/gone"), &mut none).unwrap();
        assert!(none.is_empty());

        let bad = fixture.cgroup("memory/bad", "12\nnot-a-pid\n");
        let err = subtree_pids(&bad, &mut none).unwrap_err();
        assert!(err.to_string().contains("\"not-a-pid\""), "{err}");
    }

    #[test]
    fn thaws_every_descendant_and_never_creates_files() {
        let fixture = Fixture::new("thaw");
        let pod = fixture.cgroup("freezer/pod", "");
        fixture.cgroup("freezer/pod/c1", "");
        fs::write(pod.join("freezer.state"), "THAWED\n").unwrap();
        fs::write(pod.join("c1/freezer.state"), "FROZEN\n").unwrap();
        let freezer = Freezer::at(pod.clone()).unwrap();
        assert!(freezer.freeze().unwrap());
        assert_eq!(freezer.is_frozen().unwrap(), Some(true));
        freezer.thaw_subtree().unwrap();
        assert_eq!(freezer.is_frozen().unwrap(), Some(false));
        assert_eq!(
            fs::read_to_string(pod.join("c1/freezer.state")).unwrap(),
            "THAWED"
        );
        assert!(Freezer::at(fixture.path("freezer/none")).is_none());
        let err = write_existing(&pod.join("cgroup.kill"), "1").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(!pod.join("cgroup.kill").exists());
    }
}
