//! One kill per pod, and every kill ends, with the agent confined as the
//! DaemonSet confines it (exactly its capabilities, its seccomp profile,
//! cgroupfs read-only but for the pods' cgroups: `confined_agent`) on pods
//! a real containerd runs (`CriNode`), reporting to a stand-in API server.
//!
//! Each test starts its own containerd and leaves nothing behind; without
//! containerd (and not root to install it) they skip with a message, except
//! under CI=true.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]
use std::{fs, io, os::unix::fs::PermissionsExt as _, time::Duration};

use evictd::node::cgroupfs::CgroupFs;
use evictd_integration::{
    Agent, ApiServer, CgroupVersion, Controller, CriNode, Faults, MEMORY_PODS_HELD, StuckFile,
    Workload, api_pod, confined_agent, http_get, memory_pods, metric, wait_until,
};
use serde_json::{Value, json};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const SECCOMP: &str = env!("CARGO_BIN_EXE_evictd-seccomp");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
const NODE_NAME: &str = "node-a";
/// What a container killed by SIGKILL exits with, as CRI reports it.
const KILLED: i32 = 128 + 9;
/// Reports follow the kill on another thread; this bounds the wait.
const REPORT_DEADLINE: Duration = Duration::from_secs(20);
/// A kill whose reapers block ends at the agent's 10 s kill deadline, after
/// the v1 freezer's 1 s wait for the task that cannot freeze.
const STUCK_KILL_DEADLINE: Duration = Duration::from_secs(40);
/// The one warning every confined agent on this node gives: the engine's
/// scope is the node, above the writable pods' cgroups, so on cgroup v1 the
/// zone's eventfd cannot be armed (see tests/tests/deploy.rs).
const ZONE_WARNING: &str =
    "memory threshold at the zone's edge failed: the precise memory hooks stay attached";

fn confined(node: &CriNode, args: &[String]) -> Agent {
    confined_agent(
        SECCOMP.as_ref(),
        &node.node_cgroup(),
        &node.tree.dir(Controller::Memory, "node"),
        args,
    )
    .unwrap()
}

/// The agent's WARN and ERROR lines but the `expected` ones.
fn unexpected_problems(
    agent_log: &mut evictd_integration::AgentLog,
    expected: &[&str],
) -> Vec<Value> {
    agent_log
        .problems()
        .into_iter()
        .filter(|line| {
            !expected
                .iter()
                .chain(&[ZONE_WARNING])
                .any(|message| line["message"] == *message)
        })
        .collect()
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel and containerd: run with cargo xtask test"]
fn a_pod_past_memory_and_pid_thresholds_at_once_is_killed_and_reported_once() {
    let pods = memory_pods();
    let api_pods = pods.iter().map(|pod| api_pod(pod, NODE_NAME)).collect();
    let Some(mut node) = CriNode::new(pods, NODE_MEMORY, WORKLOAD.as_ref()).unwrap() else {
        return;
    };
    // Five sandboxes and five workloads, then the hog's children.
    node.tree.set_pids_limit("node", 200).unwrap();
    let server = ApiServer::start(api_pods, Faults::default()).unwrap();
    // As a hostPath volume's DirectoryOrCreate leaves it: the confined
    // agent makes it its own.
    fs::create_dir_all(node.state_dir()).unwrap();
    fs::set_permissions(node.state_dir(), fs::Permissions::from_mode(0o755)).unwrap();
    let mut args = node.runtime_api_agent_args(NODE_NAME, server.kubeconfig());
    // Soft thresholds: the hog's eviction lasts its 2 s grace period (it
    // ignores SIGTERM), so the engine surely runs again while the hog is
    // being killed and still has every process and byte it had.
    args.extend(
        [
            "--eviction-hard=",
            "--eviction-soft",
            "memory.available<256Mi,pid.available<60",
            "--eviction-soft-grace-period",
            "memory.available=1s,pid.available=1s",
            "--eviction-max-pod-grace-period",
            "2",
        ]
        .map(str::to_owned),
    );
    // Past both thresholds before the agent starts: 150 more tasks leave
    // fewer than 60 of 200, 320 MiB less than 256 MiB of 512. Crossed
    // while the agent ran, the first line's grace could end (and the hog be
    // killed) before the hog reached the second: under emulation its 150
    // forks alone took longer than the 3 s (6.1 guest).
    let hog = node.workload("hog").unwrap();
    hog.command("ignore-sigterm").unwrap();
    hog.fork(150).unwrap();
    hog.alloc(320 * MIB).unwrap();
    let mut agent = confined(&node, &args);
    agent.log.expect(
        "pods listed from the Kubernetes API",
        &[("node", NODE_NAME)],
    );
    agent
        .log
        .expect("watching scope", &[("scope", &node.node_cgroup())]);

    let decided = agent
        .log
        .expect("eviction decided", &[("victim", "default/hog")]);
    agent.log.expect("pod killed", &[("victim", "default/hog")]);
    let status = node.wait_exited("hog").unwrap();
    assert_eq!(status.exit_code, KILLED, "{status:?}");
    for name in ["db", "web", "batch", "node-exporter"] {
        assert!(node.alive(name), "{name} was killed");
    }
    // Every report made, then the agent stopped: nothing more can come.
    server
        .wait_for_request(REPORT_DEADLINE, "the pod's Evicted event", |r| {
            r.method == "POST" && r.body["reason"] == "Evicted" && r.status != 0
        })
        .unwrap();
    let address = agent.log.metrics_address();
    wait_until(REPORT_DEADLINE, "no report pending", || {
        http_get(&address, "/metrics")
            .is_ok_and(|metrics| metric(&metrics, "evictd_eviction_reports_pending") == Some(0.0))
    })
    .unwrap();
    let metrics = http_get(&address, "/metrics").unwrap();
    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success());

    // One decision, one kill: the second resource waited for the first
    // resource's eviction of the same pod.
    assert_eq!(log.count("eviction decided", "victim", "default/hog"), 1);
    assert_eq!(log.count("pod killed", "victim", "default/hog"), 1);
    let other = match decided["signal"].as_str().unwrap() {
        "memory.available" => "pid.available",
        _ => "memory.available",
    };
    let decisions = |signal: &str| {
        metric(
            &metrics,
            &format!(
                r#"evictd_evictions_total{{qos="BestEffort",reason="threshold",signal="{signal}"}}"#
            ),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(decisions(decided["signal"].as_str().unwrap()), 1.0);
    assert_eq!(decisions(other), 0.0, "{metrics}");
    // One report: one status patch, one Evicted event.
    let writes = server.writes();
    let patches = writes
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/pods/hog/status"))
        .count();
    let evicted_events = writes
        .iter()
        .filter(|r| r.method == "POST" && r.body["reason"] == "Evicted")
        .count();
    assert_eq!((patches, evicted_events), (1, 1), "{writes:#?}");
    assert_eq!(server.failed_transitions(), 1);
    // The budget was spent once, and a restarted agent would know it.
    let budget = fs::read_to_string(node.state_dir().join("budget.json")).unwrap();
    let budget: Value = serde_json::from_str(&budget).unwrap();
    assert_eq!(budget["node"], NODE_NAME, "{budget}");
    assert_eq!(
        budget["spent"].as_array().map(Vec::len),
        Some(1),
        "{budget} {:#?}",
        log.seen
    );
    let mode = fs::metadata(node.state_dir()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let problems = unexpected_problems(&mut log, &[]);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The working set of the node cgroup, as the agent reads it.
fn node_working_set(node: &CriNode) -> u64 {
    CgroupFs::discover()
        .unwrap()
        .read_memory(&node.node_cgroup())
        .unwrap()
        .working_set_bytes()
}

/// Whether any thread of `pid` sleeps uninterruptibly (`D`).
fn sleeps_in_the_kernel(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|task| fs::read_to_string(task.path().join("stat")).ok())
        .any(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('D'))
        })
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel, FUSE and containerd: run with cargo xtask test"]
fn a_kill_whose_reaper_cannot_finish_ends_at_its_deadline_and_the_next_pod_goes() {
    let Some(mut node) = CriNode::new(memory_pods(), NODE_MEMORY, WORKLOAD.as_ref()).unwrap()
    else {
        return;
    };
    // Made after the node, so dropped before it: the stuck process must be
    // let go before the node's teardown waits for its container to end.
    let mut stuck = match StuckFile::mount() {
        Ok(stuck) => stuck,
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            eprintln!("skipped: no task can be made unkillable this way here: {e}");
            return;
        }
        Err(e) => panic!("mounting the stuck file: {e}"),
    };
    node.alloc(&MEMORY_PODS_HELD).unwrap();
    // A process of the hog's pod (started by the test, the filesystem
    // living in the host's mount namespace) that holds memory, then sleeps
    // in the kernel holding its mmap lock: SIGKILL cannot end it, and
    // process_mrelease waits for the lock. On cgroup v1 it sits in the
    // pod's cgroup, beside the container, which runc then tears down
    // alone; on v2 the pod's cgroup has children and so can hold no
    // process: it joins the container's, as an exec'd process does.
    let hog = node.pod("hog").unwrap();
    let hog_cgroup = match node.tree.layout().memory.version {
        CgroupVersion::V1 => hog.cgroup.clone(),
        CgroupVersion::V2 => hog.container_cgroup(),
    };
    let mut victim = Workload::spawn_in(&node.tree, &hog_cgroup, WORKLOAD).unwrap();
    // 16 MiB past the threshold: less than batch holds, so killing batch
    // alone brings the node back.
    let available = NODE_MEMORY - node_working_set(&node);
    victim.alloc(available - 96 * MIB + 16 * MIB).unwrap();
    let mapping = victim
        .command(&format!("map-shared {}", stuck.path().display()))
        .unwrap();
    assert_eq!(mapping, "mapping");
    wait_until(
        Duration::from_secs(10),
        "the victim's mapping asleep in the kernel",
        || sleeps_in_the_kernel(victim.pid()),
    )
    .unwrap();

    let mut args = node.runtime_agent_args();
    args.extend([
        "--eviction-hard".to_owned(),
        "memory.available<96Mi".to_owned(),
    ]);
    let mut agent = confined(&node, &args);
    // Past the threshold from the start: the hog goes first.
    let decided = agent
        .log
        .expect("eviction decided", &[("victim", "default/hog")]);
    assert_eq!(decided["trigger"], "startup", "{decided}");
    let failed = wait_for_line(
        &mut agent,
        "eviction failed; the next candidate is taken and this pod is left alone for the back-off",
    );
    assert_eq!(failed["victim"], "default/hog", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("process_mrelease threads still blocked"),
        "{error}"
    );
    assert!(error.contains(&victim.pid().to_string()), "{error}");
    // The next candidate goes, and the node is back.
    agent.log.expect_eviction("default/batch", "memory");
    for name in ["db", "web", "node-exporter"] {
        assert!(node.alive(name), "{name} was killed");
    }
    let metrics = http_get(&agent.log.metrics_address(), "/metrics").unwrap();
    assert_eq!(
        metric(
            &metrics,
            r#"evictd_eviction_failures_total{reason="threshold",signal="memory.available"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    // A reaper still blocked does not hold the agent's exit either.
    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success());
    assert!(
        sleeps_in_the_kernel(victim.pid()),
        "the victim was stuck throughout"
    );
    let problems = unexpected_problems(
        &mut log,
        &[
            "eviction failed; the next candidate is taken and this pod is left alone for the back-off",
            "not frozen within 1s; killing it unfrozen",
        ],
    );
    assert!(problems.is_empty(), "{problems:#?}");
    // Answered, the write lets the mapping end, and the victim dies.
    stuck.release().unwrap();
    let exit = victim.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(exit.is_some(), "the victim outlived its release");
    // The hog's container was killed. On cgroup v2, where the victim
    // shares its cgroup, CRI says so only once the victim is gone: it
    // still reported the container running 120 s after the kill (7.2
    // guest).
    assert_eq!(node.wait_exited("hog").unwrap().exit_code, KILLED);
}

/// The first line with `message`, waiting up to [`STUCK_KILL_DEADLINE`]:
/// longer than the log's own deadline, for a kill that takes its whole.
fn wait_for_line(agent: &mut Agent, message: &str) -> Value {
    let mut found = None;
    wait_until(STUCK_KILL_DEADLINE, message, || {
        found = agent.log.all(message).into_iter().next();
        found.is_some()
    })
    .unwrap();
    found.unwrap()
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel and containerd: run with cargo xtask test"]
fn a_soft_eviction_spares_the_sandbox_the_runtime_names_its_sigterm() {
    let mut pods = memory_pods();
    for pod in &mut pods {
        pod.metadata["termination_grace_period_seconds"] = json!(30);
    }
    let Some(mut node) = CriNode::new(pods, NODE_MEMORY, WORKLOAD.as_ref()).unwrap() else {
        return;
    };
    // As pid 1 of its container the workload gets SIGTERM only with a
    // handler for it; this one exits 143. The sandbox's process (this
    // image's, not named `pause`) exits at SIGTERM too.
    node.workload("hog")
        .unwrap()
        .command("exit-on-sigterm")
        .unwrap();
    node.workload("batch").unwrap().alloc(48 * MIB).unwrap();
    let mut args = node.runtime_agent_args();
    args.extend(
        [
            "--eviction-hard=",
            "--eviction-soft",
            "memory.available<256Mi",
            "--eviction-soft-grace-period",
            "memory.available=1s",
            "--eviction-max-pod-grace-period",
            "20",
        ]
        .map(str::to_owned),
    );
    let mut agent = confined(&node, &args);
    agent.log.expect("container runtime connected", &[]);
    // 224 MiB more leaves less than 256Mi: past the soft threshold, which
    // evicts once it has stayed met for 1 s.
    node.workload("hog").unwrap().alloc(224 * MIB).unwrap();
    let killed = agent.log.expect("pod killed", &[("victim", "default/hog")]);
    assert_eq!(killed["sigterm"], 1, "the container alone: {killed}");
    assert_eq!(killed["sigkill"], 1, "then the sandbox: {killed}");
    let status = node.wait_exited("hog").unwrap();
    assert_eq!(status.exit_code, 128 + 15, "{status:?}");
    for name in ["db", "web", "batch", "node-exporter"] {
        assert!(node.alive(name), "{name} was killed");
    }
    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success());
    let problems = unexpected_problems(&mut log, &[]);
    assert!(problems.is_empty(), "{problems:#?}");
}
