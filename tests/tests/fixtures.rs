//! The fixtures themselves on the real kernel: the private cgroup tree, the
//! workload, and their cleanup. Run as root, one at a time:
//! `cargo test -p evictd-integration --test fixtures -- --ignored --test-threads=1`.
use std::{
    io,
    os::unix::{fs::MetadataExt as _, process::ExitStatusExt as _},
    path::PathBuf,
    sync::Mutex,
    time::{Duration, Instant},
};

use evictd_integration::{
    CgroupVersion, Controller, PrivateCgroupTree, TREE_MEMORY_LIMIT, TREE_PIDS_LIMIT, Workload,
    wait_until,
};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const DEADLINE: Duration = Duration::from_secs(10);
const SIGKILL: i32 = 9;

/// The private root's directory in every hierarchy.
fn roots(tree: &PrivateCgroupTree) -> Vec<PathBuf> {
    vec![
        tree.dir(Controller::Memory, ""),
        tree.dir(Controller::Pids, ""),
    ]
}

/// Whether `pid` still runs: gone, or a zombie waiting for its (new) parent
/// to reap it, both count as not running.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn tree_has_one_shape_in_every_hierarchy_and_vanishes_on_drop() {
    let tree = PrivateCgroupTree::new().unwrap();
    let name = tree.name().to_owned();
    assert!(name.starts_with(&format!("evictd-test-{}-", std::process::id())));
    tree.create("node/kubepods/pod1").unwrap();
    tree.create("node/kubepods/pod1").unwrap(); // idempotent, like mkdir -p

    assert_eq!(
        tree.relative_path("node/kubepods"),
        format!("/{name}/node/kubepods")
    );
    assert_eq!(tree.relative_path(""), format!("/{name}"));
    for controller in [Controller::Memory, Controller::Pids] {
        let hierarchy = match controller {
            Controller::Memory => &tree.layout().memory,
            Controller::Pids => &tree.layout().pids,
            Controller::Freezer => unreachable!("not in the list"),
        };
        let dir = tree.dir(controller, "node/kubepods/pod1");
        assert_eq!(
            dir,
            hierarchy.mount_point.join(&name).join("node/kubepods/pod1")
        );
        assert!(dir.join("cgroup.procs").exists(), "{}", dir.display());
        let id = tree.cgroup_id(controller, "node/kubepods/pod1").unwrap();
        assert_eq!(id, std::fs::metadata(&dir).unwrap().ino());
        assert_ne!(id, tree.cgroup_id(controller, "node/kubepods").unwrap());
    }
    if tree.layout().memory.version == CgroupVersion::V2 {
        assert_eq!(
            tree.dir(Controller::Memory, "node"),
            tree.dir(Controller::Pids, "node")
        );
    }
    // The safety ceilings on the private root.
    let limit_file = match tree.layout().memory.version {
        CgroupVersion::V1 => "memory.limit_in_bytes",
        CgroupVersion::V2 => "memory.max",
    };
    let limit = std::fs::read_to_string(tree.dir(Controller::Memory, "").join(limit_file)).unwrap();
    assert_eq!(limit.trim(), TREE_MEMORY_LIMIT.to_string());
    let pids_max =
        std::fs::read_to_string(tree.dir(Controller::Pids, "").join("pids.max")).unwrap();
    assert_eq!(pids_max.trim(), TREE_PIDS_LIMIT.to_string());
    let err = tree.set_memory_limit("../..", MIB).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);

    let roots = roots(&tree);
    drop(tree);
    for root in roots {
        assert!(!root.exists(), "{} left behind", root.display());
    }
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn memory_is_charged_to_the_leaf_and_its_ancestors_and_returned_on_free() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("node/pod").unwrap();
    let mut workload = Workload::spawn_in(&tree, "node/pod", WORKLOAD).unwrap();
    let scopes = ["node/pod", "node", ""];
    let usage = |tree: &PrivateCgroupTree| scopes.map(|rel| tree.memory_usage(rel).unwrap());
    let before = usage(&tree);
    // Twice: a glibc that raised its mmap threshold after the first free
    // would keep the second round's chunks in its heap.
    for round in 0..2 {
        assert_eq!(workload.alloc(64 * MIB).unwrap(), 64 * MIB);
        let allocated = usage(&tree);
        for ((rel, was), now) in scopes.iter().zip(before).zip(allocated) {
            assert!(
                now >= was + 60 * MIB,
                "round {round}, {rel:?}: {was} -> {now} after allocating 64 MiB"
            );
        }
        eprintln!(
            "round {round}: usage before/after alloc of 64 MiB: {:?}",
            before
                .iter()
                .zip(allocated)
                .map(|(b, a)| (b / MIB, a / MIB))
                .collect::<Vec<_>>()
        );
        assert_eq!(workload.free(64 * MIB).unwrap(), 0);
        // munmap uncharges before it returns: no waiting needed.
        let freed = usage(&tree);
        for ((rel, was), now) in scopes.iter().zip(allocated).zip(freed) {
            assert!(
                now + 60 * MIB <= was,
                "round {round}, {rel:?}: {was} -> {now} after freeing 64 MiB"
            );
        }
    }
    assert_eq!(tree.oom_kill_count("node/pod").unwrap(), 0);
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn touch_unmap_and_kill_large_charge_and_return_what_they_say() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    let before = tree.memory_usage("pod").unwrap();
    let faults = workload.touch(32 * MIB).unwrap();
    let touched = tree.memory_usage("pod").unwrap();
    // Within 2 MiB: what the workload held at start (its stack, libc's
    // pages) may be uncharged meanwhile (seen: 31.8 MiB more).
    assert!(
        touched + 2 * MIB >= before + 32 * MIB,
        "{before} -> {touched}"
    );
    assert!(faults > Duration::ZERO);
    // One mapping at a time: the bench times each on its own.
    let err = workload.touch(MIB).unwrap_err();
    assert!(err.to_string().contains("unmap"), "{err}");

    workload.unmap().unwrap();
    let unmapped = tree.memory_usage("pod").unwrap();
    assert!(unmapped + 30 * MIB <= touched, "{touched} -> {unmapped}");
    assert!(workload.unmap().is_err(), "nothing left to unmap");

    // The child held its memory in the pod, and is reaped with it freed.
    workload.kill_large(32 * MIB).unwrap();
    assert_eq!(
        tree.procs(Controller::Pids, "pod").unwrap(),
        [workload.pid()]
    );
    let after_kill = tree.memory_usage("pod").unwrap();
    assert!(after_kill < before + 8 * MIB, "{before} -> {after_kill}");
    assert_eq!(tree.oom_kill_count("pod").unwrap(), 0);
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn pids_current_counts_the_workload_and_each_child() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    assert_eq!(workload.reported_pid().unwrap(), workload.pid());
    assert_eq!(
        tree.procs(Controller::Pids, "pod").unwrap(),
        [workload.pid()]
    );
    assert_eq!(tree.pids_current("pod").unwrap(), 1);

    assert_eq!(workload.fork(10).unwrap(), 10);
    assert_eq!(tree.pids_current("pod").unwrap(), 11);
    assert_eq!(tree.pids_current("").unwrap(), 11, "hierarchical");
    assert_eq!(tree.procs(Controller::Memory, "pod").unwrap().len(), 11);

    // A reaped child is uncharged before wait() returns.
    assert_eq!(workload.reap(4).unwrap(), 6);
    assert_eq!(tree.pids_current("pod").unwrap(), 7);
    assert_eq!(workload.reap(10).unwrap(), 0);
    assert_eq!(tree.pids_current("pod").unwrap(), 1);

    // pids.max stops a fork; the workload says so and keeps answering.
    tree.set_pids_limit("pod", 5).unwrap();
    let err = workload.fork(10).unwrap_err();
    assert!(err.to_string().contains("fork"), "{err}");
    assert_eq!(tree.pids_current("pod").unwrap(), 5);
    assert_eq!(workload.reap(10).unwrap(), 0);
    assert_eq!(workload.reported_pid().unwrap(), workload.pid());
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn children_die_with_the_workload() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.fork(5).unwrap();
    let children: Vec<u32> = tree
        .procs(Controller::Pids, "pod")
        .unwrap()
        .into_iter()
        .filter(|&pid| pid != workload.pid())
        .collect();
    assert_eq!(children.len(), 5);
    drop(workload);
    wait_until(DEADLINE, "the children to die with the workload", || {
        children.iter().all(|&pid| !running(pid))
    })
    .unwrap();
    assert!(tree.procs(Controller::Pids, "pod").unwrap().is_empty());
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn an_allocation_past_the_limit_is_oom_killed() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("node/pod").unwrap();
    tree.set_memory_limit("node/pod", 32 * MIB).unwrap();
    let mut workload = Workload::spawn_in(&tree, "node/pod", WORKLOAD).unwrap();

    let started = Instant::now();
    let err = workload.alloc(64 * MIB).unwrap_err();
    let failed = started.elapsed();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
    let status = workload.wait_exit(DEADLINE).unwrap();
    assert_eq!(status.and_then(|s| s.signal()), Some(SIGKILL), "{status:?}");
    let reaped = started.elapsed();
    wait_until(DEADLINE, "oom_kill in the limited cgroup", || {
        tree.oom_kill_count("node/pod").unwrap() >= 1
    })
    .unwrap();
    eprintln!(
        "OOM kill: command failed after {failed:?}, workload reaped after {reaped:?}; \
         oom_kill counts: pod {}, node {}, private root {}",
        tree.oom_kill_count("node/pod").unwrap(),
        tree.oom_kill_count("node").unwrap(),
        tree.oom_kill_count("").unwrap(),
    );
    assert!(tree.memory_usage("node/pod").unwrap() <= 32 * MIB);
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn a_workload_killed_from_outside_is_observable() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(8 * MIB).unwrap();
    // What the agent does to a victim.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(workload.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = workload.wait_exit(DEADLINE).unwrap();
    assert_eq!(status.and_then(|s| s.signal()), Some(SIGKILL));
    let started = Instant::now();
    assert!(workload.alloc(MIB).is_err());
    assert!(started.elapsed() < Duration::from_secs(1), "fails at once");
    assert_eq!(tree.oom_kill_count("pod").unwrap(), 0);
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn remove_kills_and_removes_a_subtree_and_keeps_its_siblings() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("node/pod-a/container").unwrap();
    tree.create("node/pod-b").unwrap();
    let mut a = Workload::spawn_in(&tree, "node/pod-a/container", WORKLOAD).unwrap();
    let mut b = Workload::spawn_in(&tree, "node/pod-b", WORKLOAD).unwrap();
    a.fork(3).unwrap();

    tree.remove("node/pod-a").unwrap();
    for controller in [Controller::Memory, Controller::Pids] {
        assert!(!tree.dir(controller, "node/pod-a").exists());
        assert!(tree.dir(controller, "node/pod-b").exists());
    }
    let status = a.wait_exit(DEADLINE).unwrap();
    assert_eq!(status.and_then(|s| s.signal()), Some(SIGKILL));
    assert_eq!(b.reported_pid().unwrap(), b.pid(), "the sibling still runs");
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn dropping_the_tree_first_kills_what_runs_in_it() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("node/pod").unwrap();
    let mut workload = Workload::spawn_in(&tree, "node/pod", WORKLOAD).unwrap();
    workload.fork(3).unwrap();
    workload.alloc(16 * MIB).unwrap();
    let roots = roots(&tree);
    // The workload is this process's child and stays an unreaped zombie
    // until wait_exit below: the tree must not wait for that.
    let started = Instant::now();
    drop(tree);
    eprintln!(
        "tree with a running workload removed in {:?}",
        started.elapsed()
    );
    for root in roots {
        assert!(!root.exists(), "{} left behind", root.display());
    }
    let status = workload.wait_exit(DEADLINE).unwrap();
    assert_eq!(status.and_then(|s| s.signal()), Some(SIGKILL));
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn a_panicking_test_still_cleans_up() {
    let seen = Mutex::new((Vec::new(), 0));
    let result = std::panic::catch_unwind(|| {
        let tree = PrivateCgroupTree::new().unwrap();
        tree.create("node/pod").unwrap();
        let mut workload = Workload::spawn_in(&tree, "node/pod", WORKLOAD).unwrap();
        workload.fork(2).unwrap();
        *seen.lock().unwrap() = (roots(&tree), workload.pid());
        panic!("a test failing half-way");
    });
    assert!(result.is_err());
    let (roots, pid) = seen.into_inner().unwrap();
    for root in roots {
        assert!(!root.exists(), "{} left behind", root.display());
    }
    assert!(!running(pid));
}

/// Running `evictd-workload` processes whose parent is this test process.
fn running_workloads() -> io::Result<Vec<u32>> {
    let me = std::process::id().to_string();
    Ok(std::fs::read_dir("/proc")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // pid (comm) state ppid ...
            let Some((head, tail)) = stat.rsplit_once(") ") else {
                return false;
            };
            let ppid = tail.split(' ').nth(1);
            head.ends_with("(evictd-workload") && ppid == Some(me.as_str()) && running(pid)
        })
        .collect())
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn a_workload_that_cannot_be_placed_is_not_left_running() {
    let tree = PrivateCgroupTree::new().unwrap();
    assert!(running_workloads().unwrap().is_empty());
    let err = Workload::spawn_in(&tree, "no-such-cgroup", WORKLOAD).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("no-such-cgroup"), "{err}");
    assert!(
        running_workloads().unwrap().is_empty(),
        "killed on the error path"
    );
    let err = Workload::spawn_in(&tree, "", "/no/such/binary").unwrap_err();
    assert!(err.to_string().contains("/no/such/binary"), "{err}");
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn a_workload_that_stops_answering_times_out() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    let pid = nix::unistd::Pid::from_raw(workload.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    workload.set_command_deadline(Duration::from_millis(200));
    let started = Instant::now();
    let err = workload.alloc(MIB).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // Its late reply would answer the next command: refused instead.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(workload.reported_pid().is_err());
    // Drop SIGKILLs it; the tree's drop finds the cgroup empty.
}
