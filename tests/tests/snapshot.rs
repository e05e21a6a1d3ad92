//! `evictd snapshot` on the real kernel, and its output fed back to
//! `evictd simulate`: capture a node, ask what evictd would do with it.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use evictd_integration::{SandboxNode, Workload, memory_pods, run_evictd};
use serde_json::Value;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
const STRANGER: &str = "node/kubepods/burstable/pod0b1e5a1d-0000-4000-8000-0000000000ff";

/// Runs `evictd ARGS` to completion within the deadline: (status, stdout).
fn evictd(args: &[&str]) -> (i32, String) {
    let (status, stdout) = run_evictd(args).unwrap();
    (status.code().unwrap(), stdout)
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn a_live_snapshot_shows_every_pod_and_simulate_decides_on_it() {
    let mut node = SandboxNode::new(memory_pods(), NODE_MEMORY, WORKLOAD).unwrap();
    node.workload("hog").unwrap().alloc(96 * MIB).unwrap();
    node.workload("batch").unwrap().fork(3).unwrap();
    // A pod kubelet runs but --pod-metadata does not know.
    node.tree.create(STRANGER).unwrap();
    let _stranger = Workload::spawn_in(&node.tree, STRANGER, WORKLOAD).unwrap();

    let mut args = vec!["snapshot".to_owned()];
    args.extend(node.agent_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stdout) = evictd(&args);
    assert_eq!(status, 0, "{stdout}");
    let snapshot: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(snapshot["node"]["memory"]["capacity_bytes"], NODE_MEMORY);
    assert!(
        snapshot["node"]["memory"]["working_set_bytes"]
            .as_u64()
            .unwrap()
            >= 96 * MIB
    );
    let pods = snapshot["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 6, "{snapshot:#}");
    let pod = |name: &str| pods.iter().find(|p| p["name"] == name).unwrap();
    assert!(
        pod("hog")["usage"]["memory_working_set_bytes"]
            .as_u64()
            .unwrap()
            >= 96 * MIB
    );
    assert_eq!(
        pod("batch")["usage"]["pids"],
        4,
        "the workload and its 3 children"
    );
    assert_eq!(pod("db")["namespace"], "default");
    // Each pod's memory counters as read (simulate, below, ignores them).
    for pod in pods {
        let stalls = &pod["usage"]["memory_stalls"];
        assert!(stalls["read_at_ns"].as_u64().unwrap() > 0, "{pod:#}");
        assert!(stalls["workingset_refault_file"].is_u64(), "{pod:#}");
        // What the thrashing rule judges a pod at its limit by.
        assert!(stalls["file_bytes"].is_u64(), "{pod:#}");
        assert!(stalls["usage_bytes"].is_u64(), "{pod:#}");
        assert!(stalls["limit_hits"].is_u64(), "{pod:#}");
    }
    assert!(
        pod("db")["cgroup"]
            .as_str()
            .unwrap()
            .ends_with("kubepods/pod00000000-0000-4000-8000-00000000000a")
    );
    let stranger = pod("pod0b1e5a1d-0000-4000-8000-0000000000ff");
    assert_eq!(stranger["cgroup_qos"], "Burstable");
    assert!(
        stranger["unknown"]
            .as_array()
            .unwrap()
            .contains(&Value::from("priority"))
    );

    let file = std::env::temp_dir().join(format!("evictd-snapshot-{}.json", node.tree.name()));
    std::fs::write(&file, &stdout).unwrap();
    let (status, decision) = evictd(&[
        "simulate",
        "--snapshot",
        file.to_str().unwrap(),
        "--eviction-hard",
        "memory.available<1Gi",
    ]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(status, 0);
    let decision: Value = serde_json::from_str(decision.trim()).unwrap();
    assert_eq!(decision["starved_resource"], "memory");
    assert_eq!(decision["victims"], serde_json::json!(["default/hog"]));
}

/// kubelet ranks pods under PID pressure by their processes (the lines of
/// their containers' cgroup.procs, as cadvisor counts them), not by their
/// threads, which the pids controller counts: a pod of two processes with
/// forty threads between them is smaller than one of four single-threaded
/// processes.
#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn pid_usage_counts_processes_not_threads() {
    let mut node = SandboxNode::new(memory_pods(), NODE_MEMORY, WORKLOAD).unwrap();
    node.workload("web").unwrap().threads(40).unwrap();
    node.workload("hog").unwrap().fork(3).unwrap();
    let web = node.pods.iter().find(|p| p.name == "web").unwrap();
    let web_tasks = node
        .tree
        .pids_current(&format!("node/{}", web.container))
        .unwrap();
    assert!(
        web_tasks >= 42,
        "the kernel counts every thread: {web_tasks}"
    );

    let mut args = vec!["snapshot".to_owned()];
    args.extend(node.agent_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stdout) = evictd(&args);
    assert_eq!(status, 0, "{stdout}");
    let snapshot: Value = serde_json::from_str(&stdout).unwrap();
    let pids = |name: &str| {
        snapshot["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["usage"]["pids"].clone())
            .unwrap()
    };
    assert_eq!(pids("web"), 2, "the workload and its threaded child");
    assert_eq!(pids("hog"), 4, "the workload and its 3 children");

    let file = std::env::temp_dir().join(format!("evictd-pids-{}.json", node.tree.name()));
    std::fs::write(&file, &stdout).unwrap();
    let (status, decision) = evictd(&[
        "simulate",
        "--snapshot",
        file.to_str().unwrap(),
        "--eviction-hard",
        "pid.available<99%",
    ]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(status, 0);
    let decision: Value = serde_json::from_str(decision.trim()).unwrap();
    assert_eq!(decision["starved_resource"], "pids", "{decision}");
    // Priority first, then processes: hog and web share priority 0.
    assert_eq!(
        decision["ranking"],
        serde_json::json!([
            "default/hog",
            "default/web",
            "default/batch",
            "default/db",
            "default/node-exporter"
        ])
    );
    assert_eq!(decision["victims"], serde_json::json!(["default/hog"]));
}
