//! What deploy/daemonset.yaml grants is enough, and no more is needed: the
//! agent, run as root with only the capabilities the DaemonSet adds
//! (everything else dropped from its bounding set, as a container runtime
//! does), under the seccomp profile it names (deploy/seccomp, applied as a
//! runtime applies a Localhost profile), with every cgroup filesystem
//! read-only but for the pods' cgroups (as its volume mounts have it), loads
//! and attaches its programs and evicts a memory hog from a sandbox node,
//! freezer writes and all. And the profile is enforced: without `bpf` in
//! it, the agent cannot load its programs.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]
use std::{fs, process::Command};

use evictd_integration::{
    Agent, Controller, SandboxNode, agent_binary, agent_container, confined_agent,
    daemonset_capabilities, daemonset_seccomp_profile, memory_pods, with_capabilities,
};
use serde_json::Value;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const SECCOMP: &str = env!("CARGO_BIN_EXE_evictd-seccomp");
const MIB: u64 = 1 << 20;

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn the_daemonsets_security_context_is_enough_to_attach_and_evict() {
    let mut node = SandboxNode::new(memory_pods(), 512 * MIB, WORKLOAD).unwrap();
    let mut args = node.agent_args();
    // The hooks attached for good: in the emulated 6.1 guest beside a
    // second guest, the zone lost the hog to the kernel's OOM killer in 1
    // of 2 runs. The hooks went on as the hog (600-900 MiB/s there) neared
    // the line, and as the kill began their detach (114 ms) held back its
    // SIGKILL until the hog had reached the node's limit. The zone has its
    // own test (precise_hooks.rs); this one is about what the DaemonSet
    // grants.
    args.extend(
        [
            "--eviction-hard",
            "memory.available<96Mi",
            "--precise-hooks",
            "always",
        ]
        .map(String::from),
    );
    let node_cgroup = node.node_cgroup();
    let mut agent = confined_agent(
        SECCOMP.as_ref(),
        &node_cgroup,
        &node.tree.dir(Controller::Memory, "node"),
        &args,
    )
    .unwrap();
    agent.log.expect("eBPF programs attached", &[]);
    assert!(
        agent
            .log
            .all("eBPF programs unavailable: POLLING cgroupfs instead of kernel events")
            .is_empty()
    );
    agent.log.expect(
        "watching scope",
        &[("scope", &node_cgroup), ("trigger", "bpf")],
    );
    node.grow_until_stopped("hog", 16 * MIB, 512 * MIB).unwrap();
    let decided = agent.log.expect_eviction("default/hog", "memory");
    // The profile lets the decision read its thread's usage (getrusage).
    assert!(decided["run_on_cpu_us"].is_u64(), "{decided}");
    assert!(decided["run_blocked"].is_u64(), "{decided}");
    assert!(node.alive("db"));
    assert_eq!(node.oom_kills().unwrap(), 0, "the kernel OOM killer fired");
    // The record is written under the profile too.
    agent.expect_recorded_decision("default/hog", "evicted");
    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success());
    let problems = log.problems();
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn the_seccomp_profile_is_enforced() {
    let container = agent_container().unwrap();
    let capabilities = daemonset_capabilities(&container);
    let profile: Value = serde_json::from_str(
        &std::fs::read_to_string(daemonset_seccomp_profile(&container)).unwrap(),
    )
    .unwrap();
    let mut without_bpf = profile.clone();
    for rule in without_bpf["syscalls"].as_array_mut().unwrap() {
        rule["names"]
            .as_array_mut()
            .unwrap()
            .retain(|name| name != "bpf");
    }
    assert_ne!(
        profile, without_bpf,
        "the profile allows no bpf() to take away"
    );
    // Removed when the test ends, however it ends.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("without-bpf.json");
    std::fs::write(&path, serde_json::to_vec(&without_bpf).unwrap()).unwrap();
    let node = SandboxNode::new(memory_pods(), 512 * MIB, WORKLOAD).unwrap();
    let mut agent_line = vec![
        SECCOMP.to_owned(),
        path.display().to_string(),
        agent_binary().display().to_string(),
    ];
    agent_line.extend(node.agent_args());
    let line = with_capabilities(&capabilities, &agent_line);
    let mut command = Command::new(&line[0]);
    command.args(&line[1..]);
    let mut agent = Agent::spawn(command).unwrap();
    let refused = agent.log.expect(
        "eBPF programs unavailable: POLLING cgroupfs instead of kernel events",
        &[],
    );
    // The agent names EPERM from bpf() as a matter of privilege.
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("loading BPF needs root")),
        "{refused}"
    );
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}

/// A file of deploy/, parsed.
fn manifest(name: &str) -> Value {
    let path = format!("{}/../deploy/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// kubelet's probes go to the port the agent serves them on alone (its
/// `--health-address`), which nothing in the cluster is let into: the
/// Service and the NetworkPolicy open only the metrics port. No scrape
/// client can then take the probes' connection slots.
#[test]
fn the_probes_have_a_port_of_their_own_that_only_the_node_reaches() {
    let container = agent_container().unwrap();
    let flag_port = |flag: &str| -> u64 {
        let prefix = format!("--{flag}=");
        let arg = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .find_map(|arg| arg.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in the agent's args"));
        arg.rsplit_once(':').unwrap().1.parse().unwrap()
    };
    let port_named = |name: &str| -> u64 {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|port| port["name"] == name)
            .and_then(|port| port["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no container port {name}"))
    };
    assert_eq!(port_named("metrics"), flag_port("metrics-address"));
    assert_eq!(port_named("health"), flag_port("health-address"));
    assert_ne!(port_named("health"), port_named("metrics"));
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        assert_eq!(
            container[probe]["httpGet"]["port"], "health",
            "{probe}: {}",
            container[probe]
        );
    }
    let service = manifest("service.yaml");
    let exposed: Vec<&Value> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|port| &port["targetPort"])
        .collect();
    assert_eq!(exposed, [&Value::from("metrics")]);
    let policy = manifest("networkpolicy.yaml");
    let admitted: Vec<&Value> = policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| rule["ports"].as_array().unwrap())
        .map(|port| &port["port"])
        .collect();
    assert_eq!(admitted, [&Value::from("metrics")]);
}

#[test]
#[ignore = "needs root: run with cargo xtask test"]
fn under_the_profile_a_failed_state_write_removes_its_temporary_file() {
    let container = agent_container().unwrap();
    let capabilities = daemonset_capabilities(&container);
    let profile = daemonset_seccomp_profile(&container);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // A directory where the file goes: the write's rename fails after its
    // temporary file is made.
    fs::create_dir_all(state.join("evictd.json/in-the-way")).unwrap();
    let line = with_capabilities(
        &capabilities,
        &[
            SECCOMP.to_owned(),
            profile.display().to_string(),
            agent_binary().display().to_string(),
            "seccomp-profile".to_owned(),
            "--install".to_owned(),
            state.display().to_string(),
        ],
    );
    let output = Command::new(&line[0]).args(&line[1..]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("evictd.json"), "{stderr}");
    assert!(
        !state.join(".evictd.json.tmp").exists(),
        "the temporary file was left behind: {stderr}"
    );
}
