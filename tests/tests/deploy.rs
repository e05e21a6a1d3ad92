//! What deploy/daemonset.yaml grants is enough: the agent, run as root with
//! only the capabilities the DaemonSet adds (everything else dropped from
//! its bounding set, as a container runtime does), loads and attaches its
//! programs and evicts a memory hog from a sandbox node, freezer writes and
//! all.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]
use std::process::Command;

use evictd_integration::{Agent, SandboxNode, agent_binary, memory_pods};
use serde_json::Value;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;

/// The capabilities the DaemonSet's container adds, as setpriv names them.
fn daemonset_capabilities() -> Vec<String> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/daemonset.yaml");
    let text = std::fs::read_to_string(manifest).unwrap();
    let daemonset: Value = serde_yaml_ng::from_str(&text).unwrap();
    let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    security["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|cap| cap.as_str().unwrap().to_lowercase())
        .collect()
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn the_daemonsets_capabilities_are_enough_to_attach_and_evict() {
    let capabilities = daemonset_capabilities();
    assert!(!capabilities.is_empty());
    let keep: String = capabilities.iter().map(|cap| format!(",+{cap}")).collect();
    let mut node = SandboxNode::new(memory_pods(), 512 * MIB, WORKLOAD).unwrap();
    // uid 0 keeps exactly what the bounding set allows across exec.
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--bounding-set=-all{keep}"))
        .arg(format!("--inh-caps=-all{keep}"))
        .arg(agent_binary())
        .args(node.agent_args())
        .args(["--eviction-hard", "memory.available<96Mi"]);
    let mut agent = Agent::spawn(command).unwrap();
    agent.log.expect("eBPF programs attached", &[]);
    assert!(
        agent
            .log
            .all("eBPF programs unavailable: POLLING cgroupfs instead of kernel events")
            .is_empty()
    );
    agent.log.expect(
        "watching scope",
        &[("scope", &node.node_cgroup()), ("trigger", "bpf")],
    );
    node.grow_until_stopped("hog", 16 * MIB, 512 * MIB).unwrap();
    agent.log.expect_eviction("default/hog", "memory");
    assert!(node.alive("db"));
    assert_eq!(node.oom_kills().unwrap(), 0, "the kernel OOM killer fired");
    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success());
    assert!(log.problems().is_empty(), "{:#?}", log.problems());
}
