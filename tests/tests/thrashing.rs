//! A pod thrashing at its own memory limit: it cycles through a file 12 %
//! larger than its limit, so every pass finds the pages it needs reclaimed
//! by the pass before and refaults its whole file cache; a pod beside it
//! with the same limit cycles through a file that fits and refaults
//! nothing. No node threshold is anywhere near. Without an option the
//! thrashing pod is reported (warning, `evictd_pod_memory_thrashing`) and
//! kept, as kubelet keeps it; with `--thrashing-eviction` it alone is
//! evicted, reason `thrashing`, by the agent confined as the DaemonSet
//! runs it (its capabilities, its seccomp profile, the cgroup filesystem
//! read-only but the pods'): every counter the rule reads is the pod's own.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::{path::Path, time::Duration};

use evictd_integration::{
    Agent, ColdFile, Controller, PodSpec, SandboxNode, cgroupfs_path, http_get, metric, wait_until,
};
use serde_json::json;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const SECCOMP: &str = env!("CARGO_BIN_EXE_evictd-seccomp");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// Each pod's memory limit, on its pod cgroup as kubelet sets it.
const POD_LIMIT: u64 = 32 * MIB;
/// The working sets cycled: one past the limit by 12 %, one well inside.
const THRASHING_FILE: u64 = 36 * MIB;
const FITTING_FILE: u64 = 16 * MIB;
/// Two readings of the pods' counters, 10 s apart, once the thrashing is
/// steady, with room for a slow machine.
const FOUND_WITHIN: Duration = Duration::from_secs(90);

struct Scenario {
    node: SandboxNode,
    agent: Agent,
    /// Where the thrasher's process runs.
    thrasher_container: String,
    _files: [ColdFile; 2],
}

/// The scenario, with the agent run as root or, `confined`, as the
/// DaemonSet runs it.
fn start(extra: &[&str], confined: bool) -> Scenario {
    let uid = |n: u32| format!("00000000-0000-4000-8000-0000000000f{n}");
    let pods = vec![
        PodSpec::new(
            "fits",
            uid(1),
            cgroupfs_path("besteffort/", &uid(1)),
            0,
            json!({}),
        ),
        PodSpec::new(
            "thrasher",
            uid(2),
            cgroupfs_path("besteffort/", &uid(2)),
            0,
            json!({}),
        ),
    ];
    let pod_cgroup = |pod: &PodSpec| {
        let container = format!("node/{}", pod.container);
        Path::new(&container)
            .parent()
            .unwrap()
            .display()
            .to_string()
    };
    let cgroups: Vec<String> = pods.iter().map(pod_cgroup).collect();
    let thrasher_container = format!("node/{}", pods[1].container);
    let mut node = SandboxNode::new(pods, NODE_MEMORY, WORKLOAD).unwrap();
    for cgroup in &cgroups {
        node.tree.set_memory_limit(cgroup, POD_LIMIT).unwrap();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let files = [
        ColdFile::new(dir, "fits", FITTING_FILE).unwrap(),
        ColdFile::new(dir, "thrashes", THRASHING_FILE).unwrap(),
    ];
    let mut args = vec!["--eviction-hard=memory.available<64Mi"];
    args.extend_from_slice(extra);
    let agent = if confined {
        node.start_confined_agent(SECCOMP.as_ref(), &args)
    } else {
        node.start_agent(&args)
    }
    .unwrap();
    for (pod, file) in [("fits", &files[0]), ("thrasher", &files[1])] {
        let answer = node
            .workload(pod)
            .unwrap()
            .command(&format!("cycle {}", file.path()))
            .unwrap();
        assert_eq!(answer, "cycling");
    }
    Scenario {
        node,
        agent,
        thrasher_container,
        _files: files,
    }
}

fn thrashing_series(pod: &str) -> String {
    format!("evictd_pod_memory_thrashing{{namespace=\"default\",pod=\"{pod}\"}}")
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn a_pod_cycling_a_working_set_past_its_limit_is_reported_thrashing_and_kept_by_default() {
    let mut scenario = start(&[], false);
    let address = scenario.agent.log.metrics_address();
    let mut page = String::new();
    wait_until(FOUND_WITHIN, "the thrasher reported thrashing", || {
        page = http_get(&address, "/metrics").unwrap_or_default();
        metric(&page, &thrashing_series("thrasher")) == Some(1.0)
    })
    .unwrap_or_else(|e| panic!("{e}: {page}"));
    assert_eq!(
        metric(&page, &thrashing_series("fits")),
        Some(0.0),
        "{page}"
    );
    let told = scenario.agent.log.expect(
        "pod thrashing at its memory limit",
        &[("pod", "default/thrasher")],
    );
    assert_eq!(told["evicted"], false, "{told}");
    assert!(scenario.node.alive("thrasher"));
    assert!(scenario.node.alive("fits"));
    let (status, mut log) = scenario.agent.stop().unwrap();
    assert!(status.success());
    assert!(log.all("eviction decided").is_empty(), "nothing evicted");
    assert_eq!(
        log.count("pod thrashing at its memory limit", "pod", "default/fits"),
        0
    );
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn with_thrashing_eviction_the_agent_confined_as_the_daemonset_evicts_the_thrashing_pod_alone() {
    let mut scenario = start(
        &["--thrashing-eviction", "--eviction-max-pod-grace-period=1"],
        true,
    );
    let log = &mut scenario.agent.log;
    let mut decided = None;
    wait_until(FOUND_WITHIN, "the thrasher's eviction decided", || {
        log.drain();
        decided = log.all("eviction decided").into_iter().next();
        decided.is_some()
    })
    .unwrap();
    let decided = decided.unwrap();
    assert_eq!(decided["victim"], "default/thrasher", "{decided}");
    assert_eq!(decided["reason"], "thrashing", "{decided}");
    assert_eq!(decided["signal"], "memory.available", "{decided}");
    let killed = log.expect("pod killed", &[("victim", "default/thrasher")]);
    assert!(log.position(&killed) > log.position(&decided));
    let procs = scenario
        .node
        .tree
        .procs(Controller::Memory, &scenario.thrasher_container)
        .unwrap();
    assert!(procs.is_empty(), "thrasher still runs: {procs:?}");
    assert!(scenario.node.alive("fits"));
    let (status, log) = scenario.agent.stop().unwrap();
    assert!(status.success());
    let evictions = log
        .seen
        .iter()
        .filter(|line| line["message"] == "eviction decided")
        .count();
    assert_eq!(evictions, 1, "the fitting pod stays");
}
