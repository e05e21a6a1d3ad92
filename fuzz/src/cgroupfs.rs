//! cgroupfs files as the kernel, or anything that can write where evictd
//! reads, may leave them, through the readers the agent decides on: a pod's
//! memory by path, through kept-open files and through its open memory
//! files; `pids.current`; the processes of `cgroup.procs` below a pod; the
//! node's limits; and a whole [`NodeSignals::observe`] of a node cgroup, on
//! a cgroup v1 and a cgroup v2 layout.
use std::{fs, path::Path};

use evictd::node::{
    cgroupfs::{CgroupError, CgroupFs, CgroupVersion, KeptOpen, MemoryReading},
    cold_cache::ColdCache,
    stats::{self, NodeSignals},
};

use crate::scratch_dir;

/// The files an input holds, in order, separated by NUL bytes (which no
/// cgroup file the agent reads contains); a file the input does not reach
/// is left empty.
const FILES: [&str; 7] = [
    "memory.stat",
    "usage",
    "limit",
    "pids.current",
    "pids.max",
    "cgroup.procs",
    "child cgroup.procs",
];

/// The node cgroup, the pods' cgroup below it, a pod, and a container of
/// the pod (relative to the hierarchy roots).
const NODE: &str = "/node";
const KUBEPODS: &str = "/node/kubepods";
const POD: &str = "/node/kubepods/pod1";
const CONTAINER: &str = "/node/kubepods/pod1/c1";

/// kubelet's `isMemoryUnlimited`: a limit above 2^62 bytes is none.
const UNLIMITED_MEMORY: u64 = 1 << 62;

pub fn cgroupfs(data: &[u8]) {
    let mut parts = data.split(|b| *b == 0);
    let files: [&[u8]; FILES.len()] = std::array::from_fn(|_| parts.next().unwrap_or_default());
    for version in [CgroupVersion::V1, CgroupVersion::V2] {
        let dir = scratch_dir("cgroupfs");
        let cgroupfs = layout(dir.path(), version, &files);
        check_pod(&cgroupfs, &files);
        check_node(&cgroupfs, dir.path());
        if version == CgroupVersion::V2 {
            check_v2_root(&cgroupfs);
        }
    }
}

/// A hierarchy under `root` whose node, pods' cgroup and pod carry the
/// input's files, as `version` names them.
fn layout(root: &Path, version: CgroupVersion, files: &[&[u8]; FILES.len()]) -> CgroupFs {
    let cgroupfs = match version {
        CgroupVersion::V1 => CgroupFs {
            version,
            memory_root: root.join("memory"),
            pids_root: Some(root.join("pids")),
            freezer_root: None,
        },
        CgroupVersion::V2 => CgroupFs {
            version,
            memory_root: root.join("unified"),
            pids_root: Some(root.join("unified")),
            freezer_root: None,
        },
    };
    let [
        stat,
        usage,
        limit,
        pids_current,
        pids_max,
        procs,
        child_procs,
    ] = *files;
    let (usage_file, limit_file) = match version {
        CgroupVersion::V1 => ("memory.usage_in_bytes", "memory.limit_in_bytes"),
        CgroupVersion::V2 => ("memory.current", "memory.max"),
    };
    let write = |dir: &Path, name: &str, contents: &[u8]| {
        let path = dir.join(name);
        if let Err(e) = fs::write(&path, contents) {
            panic!("writing {}: {e}", path.display());
        }
    };
    let memory_dir = |path: &str| {
        let dir = cgroupfs.memory_dir(path);
        if let Err(e) = fs::create_dir_all(&dir) {
            panic!("creating {}: {e}", dir.display());
        }
        dir
    };
    // The v2 root has only its memory.stat, which the agent reads for it.
    write(&memory_dir("/"), "memory.stat", stat);
    for path in [NODE, KUBEPODS, POD] {
        let dir = memory_dir(path);
        write(&dir, "memory.stat", stat);
        write(&dir, usage_file, usage);
        write(&dir, limit_file, limit);
    }
    for path in [NODE, POD] {
        let dir = match cgroupfs.pids_dir(path) {
            Ok(dir) => dir,
            Err(e) => panic!("{e}"),
        };
        if let Err(e) = fs::create_dir_all(&dir) {
            panic!("creating {}: {e}", dir.display());
        }
        write(&dir, "pids.current", pids_current);
        write(&dir, "pids.max", pids_max);
    }
    write(&memory_dir(POD), "cgroup.procs", procs);
    write(&memory_dir(CONTAINER), "cgroup.procs", child_procs);
    cgroupfs
}

/// Every way the agent reads a pod's memory reads the same; what one
/// reads, written back as the kernel writes it, reads back the same; and
/// the processes counted are lines of the pod's `cgroup.procs` files.
fn check_pod(cgroupfs: &CgroupFs, files: &[&[u8]; FILES.len()]) {
    let by_path = cgroupfs.read_memory(POD);
    let kept = cgroupfs.read_memory_kept(&KeptOpen::default(), POD);
    let open = cgroupfs
        .open_memory(POD)
        .map(|open| open.map(|memory| memory.read()));
    let usage = cgroupfs.read_memory_usage(POD);
    match (&by_path, &kept, &open) {
        (Ok(reading), Ok(kept), Ok(Some(Ok(open)))) => {
            assert_eq!(reading, kept, "{files:?}");
            assert_eq!(reading, open, "{files:?}");
            assert_eq!(usage.ok(), Some(reading.usage_bytes), "{files:?}");
            assert!(reading.working_set_bytes() <= reading.usage_bytes);
            reads_back(cgroupfs, *reading);
        }
        (Err(by_path), Err(kept), Ok(Some(Err(_))) | Err(_)) => {
            assert!(!by_path.to_string().is_empty() && !kept.to_string().is_empty());
        }
        _ => panic!(
            "the pod's memory reads differently by path, kept open and open: \
             {by_path:?} / {kept:?} / {open:?} from {files:?}"
        ),
    }

    let pids = cgroupfs.read_pids(POD);
    let pids_kept = cgroupfs.read_pids_kept(&KeptOpen::default(), POD);
    match (&pids, &pids_kept) {
        (Ok(tasks), Ok(kept)) => {
            assert_eq!(tasks, kept, "{files:?}");
            let path = pids_current(cgroupfs, POD);
            rewrite(&path, &format!("{tasks}\n"));
            assert_eq!(cgroupfs.read_pids(POD).ok(), Some(*tasks), "{files:?}");
        }
        (Err(_), Err(_)) => {}
        _ => panic!("pids.current reads {pids:?} by path, {pids_kept:?} kept open"),
    }

    let lines = |text: &[u8]| text.split(|b| *b == b'\n').count() as u64;
    let [.., procs, child_procs] = *files;
    if let Ok(count) = cgroupfs.count_processes(POD) {
        assert!(count <= lines(procs) + lines(child_procs), "{files:?}");
        if count > 0 {
            assert!(
                cgroupfs.has_processes(POD).is_ok_and(|any| any),
                "{count} processes counted and none seen: {files:?}"
            );
        }
    }
    let _ = cgroupfs.has_processes(POD);
}

/// A reading written back as the kernel writes it reads back the same.
fn reads_back(cgroupfs: &CgroupFs, reading: MemoryReading) {
    let dir = cgroupfs.memory_dir(POD);
    let (usage_file, inactive) = match cgroupfs.version {
        CgroupVersion::V1 => ("memory.usage_in_bytes", "total_inactive_file"),
        CgroupVersion::V2 => ("memory.current", "inactive_file"),
    };
    rewrite(&dir.join(usage_file), &format!("{}\n", reading.usage_bytes));
    rewrite(
        &dir.join("memory.stat"),
        &format!("cache 0\n{inactive} {}\n", reading.inactive_file_bytes),
    );
    match cgroupfs.read_memory(POD) {
        Ok(again) => assert_eq!(again, reading),
        Err(e) => panic!("{reading:?} written back does not read: {e}"),
    }
}

/// The node's signals from its cgroups: what a limit bounds, it bounds.
fn check_node(cgroupfs: &CgroupFs, scratch: &Path) {
    let limit = stats::memory_limit(cgroupfs, NODE);
    if let Ok(Some(limit)) = limit {
        assert!(limit <= UNLIMITED_MEMORY, "{limit}");
    }
    let signals = NodeSignals {
        cgroupfs: cgroupfs.clone(),
        node: NODE.to_owned(),
        nodefs: scratch.to_owned(),
        imagefs: scratch.to_owned(),
        containerfs: None,
        files: KeptOpen::default(),
        root_band: false,
        // Its file cache is read too (--memory-signal reclaimable).
        cold_cache: Some(ColdCache::default()),
    };
    let observation = match signals.observe() {
        Ok(observation) => observation,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let stats = &observation.stats;
    if let Ok(Some(limit)) = limit {
        assert!(stats.memory.capacity_bytes <= limit, "{observation:?}");
    }
    if let Some(allocatable) = &stats.allocatable {
        assert!(
            allocatable.capacity_bytes <= stats.memory.capacity_bytes,
            "{observation:?}"
        );
    }
    match cgroupfs.read_memory(NODE) {
        Ok(node) => assert_eq!(node, observation.node_memory),
        Err(e) => panic!("the node's memory observed, and then not read: {e}"),
    }
    assert_eq!(
        observation.node_band_value,
        Some(observation.node_memory.usage_bytes)
    );
}

/// The v2 root, which has no usage file: its usage is `anon + file` of its
/// memory.stat.
fn check_v2_root(cgroupfs: &CgroupFs) {
    match cgroupfs.read_memory("/") {
        Ok(root) => {
            assert!(root.working_set_bytes() <= root.usage_bytes);
            assert_eq!(cgroupfs.read_memory_usage("/").ok(), Some(root.usage_bytes));
        }
        Err(CgroupError::Parse { .. } | CgroupError::Io { .. }) => {}
        Err(e) => panic!("the v2 root's memory.stat is there: {e}"),
    }
    assert!(cgroupfs.open_memory("/").is_ok_and(|open| open.is_none()));
}

fn pids_current(cgroupfs: &CgroupFs, path: &str) -> std::path::PathBuf {
    match cgroupfs.pids_dir(path) {
        Ok(dir) => dir.join("pids.current"),
        Err(e) => panic!("{e}"),
    }
}

fn rewrite(path: &Path, text: &str) {
    if let Err(e) = fs::write(path, text) {
        panic!("writing {}: {e}", path.display());
    }
}
