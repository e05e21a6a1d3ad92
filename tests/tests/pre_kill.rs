//! `--pre-kill-hook` on a node inside this machine: a soft memory eviction
//! of the hog runs the hook first (the hog still running), tells it the
//! pod, the kill reason and the deadline, then kills; a hook that never
//! ends is killed with what it started at its deadline and the hog is
//! evicted all the same.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]
use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use evictd_integration::{
    AGENT_DEADLINE, Agent, Controller, MEMORY_PODS_HELD, SandboxNode, confined_agent, http_get,
    memory_pods, metric, wait_until,
};
use serde_json::Value;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const SECCOMP: &str = env!("CARGO_BIN_EXE_evictd-seccomp");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// The hog's grace period (`--eviction-max-pod-grace-period`): the hook
/// may take half of it at most.
const GRACE_SECONDS: &str = "4";

/// An executable shell script `hook` in `dir`.
fn hook(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("hook");
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A soft memory threshold the hog's 200 MiB pass, its grace period, and
/// the hook at `script` with `timeout`.
fn with_hook(script: &Path, timeout: &str) -> Vec<String> {
    [
        "--eviction-hard=",
        "--eviction-soft",
        "memory.available<200Mi",
        "--eviction-soft-grace-period",
        "memory.available=1s",
        "--eviction-max-pod-grace-period",
        GRACE_SECONDS,
        "--pre-kill-hook",
        script.to_str().unwrap(),
        "--pre-kill-hook-timeout",
        timeout,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The node, the agent with the hook `script` makes for the node and
/// `timeout`, and the hog pushing the node past a soft memory threshold.
fn soft_eviction_with_hook(
    timeout: &str,
    script: impl FnOnce(&SandboxNode) -> PathBuf,
) -> (SandboxNode, Agent) {
    let mut node = SandboxNode::new(memory_pods(), NODE_MEMORY, WORKLOAD).unwrap();
    node.alloc(&MEMORY_PODS_HELD).unwrap();
    let script = script(&node);
    let args = with_hook(&script, timeout);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = node.start_agent(&args).unwrap();
    // Past the threshold, far from the node's limit.
    node.alloc(&[("hog", 200 * MIB)]).unwrap();
    (node, agent)
}

/// The hog's container cgroup in the memory hierarchy.
fn hog_procs(node: &SandboxNode) -> PathBuf {
    let hog = node.pods.iter().find(|pod| pod.name == "hog").unwrap();
    node.tree
        .dir(Controller::Memory, &format!("node/{}", hog.container))
        .join("cgroup.procs")
}

/// Whether `lines` were logged in that order.
fn in_order(agent: &Agent, lines: &[&Value]) -> bool {
    let positions: Vec<Option<usize>> = lines.iter().map(|l| agent.log.position(l)).collect();
    positions.iter().all(Option::is_some) && positions.is_sorted()
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn a_soft_eviction_tells_the_hook_the_pod_the_reason_and_the_deadline_before_the_kill() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    // What the hook was told, and how many processes the hog had as it ran.
    let (mut node, mut agent) = soft_eviction_with_hook("2s", |node| {
        hook(
            dir.path(),
            &format!(
                "env > {seen}.tmp\necho HOG_PROCESSES=$(wc -l < {procs}) >> {seen}.tmp\nmv {seen}.tmp {seen}",
                seen = seen.display(),
                procs = hog_procs(node).display(),
            ),
        )
    });
    let decided = agent.log.expect_eviction("default/hog", "memory");
    assert_eq!(decided["reason"], "threshold", "{decided}");
    let done = agent
        .log
        .expect("pre-kill hook done", &[("victim", "default/hog")]);
    let killed = agent.log.expect("pod killed", &[("victim", "default/hog")]);
    assert!(in_order(&agent, &[&decided, &done, &killed]));
    assert!(killed["sigterm"].as_u64().unwrap() >= 1, "{killed}");
    let told: BTreeMap<String, String> = fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    let hog = node.pods.iter().find(|pod| pod.name == "hog").unwrap();
    assert_eq!(told["EVICTD_POD_NAMESPACE"], "default");
    assert_eq!(told["EVICTD_POD_NAME"], "hog");
    assert_eq!(told["EVICTD_POD_UID"], hog.uid);
    assert_eq!(told["EVICTD_REASON"], "threshold");
    assert_eq!(told["EVICTD_SIGNAL"], "memory.available");
    // The default 2 s, within half the 4 s grace period.
    assert_eq!(told["EVICTD_DEADLINE_REMAINING_MS"], "2000");
    assert!(told["EVICTD_DEADLINE_UNIX_MS"].parse::<u64>().unwrap() > 0);
    let processes: u64 = told["HOG_PROCESSES"].parse().unwrap();
    assert!(processes >= 1, "the hook ran after the hog was gone");
    assert!(!node.alive("hog"));
    for name in ["db", "web", "batch", "node-exporter"] {
        assert!(node.alive(name), "{name} was killed");
    }
    let address = agent.log.metrics_address();
    let metrics = http_get(&address, "/metrics").unwrap();
    assert_eq!(
        metric(&metrics, r#"evictd_pre_kill_hooks_total{outcome="done"}"#),
        Some(1.0),
        "{metrics}"
    );
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}

fn gone(pid: u32) -> bool {
    // A zombie runs nothing and holds no memory: gone too.
    fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn a_hook_that_never_ends_is_killed_at_its_deadline_and_the_pod_is_evicted_all_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = hook(
        dir.path(),
        &format!(
            "sleep 100000 &\necho $$ $! > {pids}.tmp\nmv {pids}.tmp {pids}\nwait",
            pids = pids.display()
        ),
    );
    let (mut node, mut agent) = soft_eviction_with_hook("1s", |_| script);
    let decided = agent.log.expect_eviction("default/hog", "memory");
    assert_eq!(decided["reason"], "threshold", "{decided}");
    let timed_out = agent.log.expect(
        "pre-kill hook still running at its deadline: killed; the eviction goes on",
        &[("victim", "default/hog")],
    );
    let killed = agent.log.expect("pod killed", &[("victim", "default/hog")]);
    assert!(in_order(&agent, &[&decided, &timed_out, &killed]));
    // What was left of the grace period went to the hog's SIGTERM.
    assert!(killed["sigterm"].as_u64().unwrap() >= 1, "{killed}");
    assert!(!node.alive("hog"));
    let pids: Vec<u32> = fs::read_to_string(&pids)
        .expect("the hook ran before its deadline")
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    // Killed before the hog's SIGTERM, with the sleep it started (its
    // group).
    wait_until(AGENT_DEADLINE, "the hook gone", || gone(pids[0])).unwrap();
    wait_until(AGENT_DEADLINE, "the hook's child gone", || gone(pids[1])).unwrap();
    let address = agent.log.metrics_address();
    let metrics = http_get(&address, "/metrics").unwrap();
    assert_eq!(
        metric(
            &metrics,
            r#"evictd_pre_kill_hooks_total{outcome="timeout"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn the_daemonsets_confinement_lets_the_agent_start_a_hook_and_kill_it_at_its_deadline() {
    // `yes` writes to /dev/null until it is killed, under the agent's own
    // seccomp filter and capabilities, which it inherits.
    let yes = Path::new("/usr/bin/yes");
    let mut node = SandboxNode::new(memory_pods(), NODE_MEMORY, WORKLOAD).unwrap();
    node.alloc(&MEMORY_PODS_HELD).unwrap();
    let mut args = node.agent_args();
    args.extend(with_hook(yes, "1s"));
    let mut agent = confined_agent(
        SECCOMP.as_ref(),
        &node.node_cgroup(),
        &node.tree.dir(Controller::Memory, "node"),
        &args,
    )
    .unwrap();
    agent.log.expect("eBPF programs attached", &[]);
    node.alloc(&[("hog", 200 * MIB)]).unwrap();
    agent.log.expect_eviction("default/hog", "memory");
    // Started (a hook that cannot start fails at once), killed, reaped.
    agent.log.expect(
        "pre-kill hook still running at its deadline: killed; the eviction goes on",
        &[("victim", "default/hog")],
    );
    assert!(!node.alive("hog"));
    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success());
    let problems: Vec<Value> = log
        .problems()
        .into_iter()
        .filter(|line| {
            ![
                "pre-kill hook still running at its deadline: killed; the eviction goes on",
                // See tests/tests/deploy.rs.
                "memory threshold at the zone's edge failed: the precise memory hooks stay attached",
            ]
            .contains(&line["message"].as_str().unwrap_or_default())
        })
        .collect();
    assert!(problems.is_empty(), "{problems:#?}");
}
