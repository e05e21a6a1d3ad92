//! The cgroup files the agent reads and writes, checked against the
//! fixtures' own reading of them on whichever cgroup version the kernel runs
//! (`cargo xtask test` covers v1 on the host, `cargo xtask test --vm` v2 in
//! the guest): usage and working set (`memory.current` and `memory.stat`
//! on v2), the node root (`/proc/meminfo` on v2, which has no root
//! `memory.current`), kernel OOM kills (`memory.events` on v2), pods of the
//! systemd driver (`kubepods.slice`), and task counts (`pids.current`).
//! `cgroup.kill` is covered by `kill.rs`, which expects it on v2.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::{fs, process::Command};

use evictd::node::cgroupfs::{CgroupError, CgroupFs};
use evictd_integration::{
    AGENT_DEADLINE, Agent, CgroupVersion, Controller, PodSpec, PrivateCgroupTree, SandboxNode,
    Workload, agent_binary, http_get, run_evictd, systemd_path, wait_until,
};
use serde_json::{Value, json};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;

/// `key value` lines (memory.stat, memory.events).
fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|line| {
            let (k, v) = line.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {key} in {text:?}"))
}

/// kubelet's working set of `rel`, read by the fixture from the files of
/// the cgroup version the kernel runs.
fn working_set(tree: &PrivateCgroupTree, rel: &str) -> (u64, u64) {
    let dir = tree.dir(Controller::Memory, rel);
    let stat = fs::read_to_string(dir.join("memory.stat")).unwrap();
    let inactive_file = match tree.layout().memory.version {
        CgroupVersion::V1 => keyed(&stat, "total_inactive_file"),
        CgroupVersion::V2 => keyed(&stat, "inactive_file"),
    };
    let usage = tree.memory_usage(rel).unwrap();
    (usage, usage.saturating_sub(inactive_file))
}

/// Runs `evictd ARGS` to completion: its stdout as JSON.
fn evictd_json(args: &[String]) -> Value {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stdout) = run_evictd(&args).unwrap();
    assert!(status.success(), "evictd {args:?}: {stdout}");
    serde_json::from_str(&stdout).unwrap()
}

/// Reads `file` from inside cgroup `rel`, so its page cache is charged
/// there: the file's cached pages are dropped first (page cache stays
/// charged to whoever read it first).
fn read_file_in(tree: &PrivateCgroupTree, rel: &str, file: &std::path::Path) {
    let opened = fs::File::open(file).unwrap();
    // Written back first: DONTNEED leaves dirty pages cached (and charged to
    // whoever wrote them), as they are right after cargo built the file.
    opened.sync_all().unwrap();
    nix::fcntl::posix_fadvise(
        &opened,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .unwrap();
    let procs = tree.dir(Controller::Memory, rel).join("cgroup.procs");
    let status = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1" && exec cat "$2" > /dev/null"#)
        .args(["sh", procs.to_str().unwrap(), file.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn a_pods_usage_and_working_set_are_read_from_the_versions_own_files() {
    let pods = vec![PodSpec::new(
        "reader",
        "00000000-0000-4000-8000-0000000000c1",
        "kubepods/besteffort/pod00000000-0000-4000-8000-0000000000c1/ctr".into(),
        0,
        json!({}),
    )];
    let mut node = SandboxNode::new(pods, 512 * MIB, WORKLOAD).unwrap();
    let container = format!("node/{}", node.pods[0].container);
    node.workload("reader").unwrap().alloc(48 * MIB).unwrap();
    // Page cache, which lands on the inactive file list first: the agent's
    // library archive, tens of MiB that nothing else touches meanwhile (a
    // binary would be, when it runs, and its pages would turn active).
    let archive = agent_binary().with_file_name("libevictd.rlib");
    read_file_in(&node.tree, &container, &archive);
    // The comparison below needs the cache on the inactive list before the
    // agent reads: a CI run once saw the agent's working set equal to the
    // usage (no inactive file yet) and the fixture's, a moment later, not.
    wait_until(AGENT_DEADLINE, "the page cache counted as inactive", || {
        let (usage, working_set) = working_set(&node.tree, &container);
        usage - working_set >= 16 * MIB
    })
    .unwrap();

    let mut args = vec!["snapshot".to_owned()];
    args.extend(node.agent_args());
    let snapshot = evictd_json(&args);
    let (usage, expected) = working_set(&node.tree, &container);
    let pod = &snapshot["pods"][0];
    let reported = pod["usage"]["memory_working_set_bytes"].as_u64().unwrap();
    eprintln!("usage {usage}, working set {expected}, agent {reported}");
    assert!(expected >= 48 * MIB, "the workload's memory is working set");
    assert!(
        usage - expected >= 16 * MIB,
        "the file's page cache is charged to the pod and is not working set"
    );
    // Both reads are of a live cgroup a moment apart: equal up to the
    // kernel's per-CPU stat batching.
    assert!(
        reported.abs_diff(expected) < 4 * MIB,
        "agent {reported}, fixture {expected} (usage {usage})"
    );
    // The agent's own CgroupFs agrees on the version and the mount.
    let cgroupfs = CgroupFs::discover().unwrap();
    assert_eq!(cgroupfs.memory_root, node.tree.layout().memory.mount_point);
    assert_eq!(
        cgroupfs.version == evictd::node::cgroupfs::CgroupVersion::V2,
        node.tree.layout().memory.version == CgroupVersion::V2
    );
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn the_node_root_is_the_whole_machine() {
    // No --node-cgroup: the hierarchy root, which on v2 has no
    // memory.current and is read from /proc/meminfo instead.
    let snapshot = evictd_json(&[
        "snapshot".into(),
        "--nodefs-path".into(),
        "/nonexistent".into(),
        "--imagefs-path".into(),
        "/nonexistent".into(),
    ]);
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap();
    let kib = |key: &str| {
        meminfo
            .lines()
            .find_map(|l| {
                l.strip_prefix(key)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .unwrap()
            * 1024
    };
    let memory = &snapshot["node"]["memory"];
    assert_eq!(memory["capacity_bytes"], kib("MemTotal:"));
    let working_set = memory["working_set_bytes"].as_u64().unwrap();
    assert!(
        working_set > 0 && working_set < kib("MemTotal:"),
        "{snapshot:#}"
    );
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn pods_of_the_systemd_driver_are_found_by_their_slices() {
    let uid = "00000000-0000-4000-8000-0000000000d1";
    let pods = vec![
        PodSpec::new(
            "slice-burstable",
            uid,
            systemd_path(Some("burstable"), uid),
            0,
            json!({"requests": {"memory": "16Mi"}}),
        ),
        PodSpec::new(
            "slice-guaranteed",
            "00000000-0000-4000-8000-0000000000d2",
            systemd_path(None, "00000000-0000-4000-8000-0000000000d2"),
            0,
            json!({"requests": {"cpu": "100m", "memory": "32Mi"},
                   "limits": {"cpu": "100m", "memory": "32Mi"}}),
        ),
    ];
    let mut node = SandboxNode::new(pods, 512 * MIB, WORKLOAD).unwrap();
    node.workload("slice-burstable")
        .unwrap()
        .alloc(24 * MIB)
        .unwrap();
    node.workload("slice-burstable").unwrap().fork(2).unwrap();
    let mut args = vec!["snapshot".to_owned()];
    args.extend(node.agent_args());
    let snapshot = evictd_json(&args);
    let pods = snapshot["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 2, "{snapshot:#}");
    let burstable = pods.iter().find(|p| p["uid"] == uid).unwrap();
    assert_eq!(burstable["name"], "slice-burstable");
    assert!(
        burstable["cgroup"].as_str().unwrap().ends_with(&format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        )),
        "{burstable:#}"
    );
    assert!(
        burstable["usage"]["memory_working_set_bytes"]
            .as_u64()
            .unwrap()
            >= 24 * MIB
    );
    // pids.current of the pod: the workload and its two children.
    assert_eq!(burstable["usage"]["pids"], 3);
    let guaranteed = pods
        .iter()
        .find(|p| p["name"] == "slice-guaranteed")
        .unwrap();
    assert_eq!(guaranteed["cgroup_qos"], "Guaranteed");
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn a_kernel_oom_kill_is_counted_by_the_kernel_and_reported_by_the_agent() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    tree.set_memory_limit("pod", 32 * MIB).unwrap();
    let scope = tree.relative_path("pod");
    let mut agent = Agent::start(&["--watch-memory", &format!("{scope}=16Mi")]).unwrap();
    let address = agent.log.metrics_address();
    agent
        .log
        .expect("trigger", &[("resource", "oom_kills"), ("trigger", "bpf")]);
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    let pid = workload.pid();
    assert!(workload.alloc(64 * MIB).is_err(), "the OOM killer ends it");
    let victim = agent.log.expect("kernel OOM killer chose a victim", &[]);
    assert_eq!(victim["pid"], pid);
    assert_eq!(victim["scope"], scope.as_str());
    assert_eq!(
        victim["memory_cgroup_id"],
        tree.cgroup_id(Controller::Memory, "pod").unwrap()
    );
    // The kernel's own count: memory.events on v2, memory.oom_control on v1.
    wait_until(AGENT_DEADLINE, "oom_kill counted by the kernel", || {
        tree.oom_kill_count("pod").unwrap_or(0) == 1
    })
    .unwrap();
    let metrics = http_get(&address, "/metrics").unwrap();
    assert!(
        metrics.contains("evictd_kernel_oom_kills_total 1"),
        "{metrics}"
    );
    assert!(agent.stop().unwrap().0.success());
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn open_memory_files_read_afresh_and_say_when_their_cgroup_is_gone() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let cgroupfs = CgroupFs::discover().unwrap();
    // What a memory listing keeps open for each pod.
    let path = tree.relative_path("pod");
    let memory = cgroupfs.open_memory(&path).unwrap().unwrap();
    assert_eq!(memory.charged().unwrap(), tree.memory_usage("pod").unwrap());
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(32 * MIB).unwrap();
    let grown = memory.charged().unwrap();
    assert!(grown >= 32 * MIB, "read again: {grown} bytes");
    // A quiet cgroup read twice a moment apart: equal up to the kernel's
    // per-CPU batching.
    let by_path = tree.memory_usage("pod").unwrap();
    assert!(
        grown.abs_diff(by_path) < MIB,
        "open {grown}, by path {by_path}"
    );
    // The working set, as a decision's exact read takes it.
    let open = memory.read().unwrap().working_set_bytes();
    let by_path = cgroupfs.read_memory(&path).unwrap().working_set_bytes();
    assert!(open >= 32 * MIB, "working set {open} bytes");
    assert!(
        open.abs_diff(by_path) < MIB,
        "open {open}, by path {by_path}"
    );
    assert!(cgroupfs.has_processes(&path).unwrap());
    drop(workload);
    assert!(!cgroupfs.has_processes(&path).unwrap());
    tree.remove("pod").unwrap();
    assert!(
        matches!(memory.charged(), Err(CgroupError::Gone(_))),
        "{:?}",
        memory.charged()
    );
    assert!(
        matches!(memory.read(), Err(CgroupError::Gone(_))),
        "{:?}",
        memory.read()
    );
}
