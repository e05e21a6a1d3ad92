//! KEP-5986's two stages, out of tree, on cgroup v2, by the agent confined
//! as the DaemonSet runs it: a container held at its memory.high (as
//! kubelet's MemoryQoS sets it, below its memory.max) is relaxed to its
//! memory.max and recovers, kept; a container cycling a file past its
//! memory.max, which relaxing memory.high cannot help, is evicted once its
//! pressure outlasts the grace period; a calm pod beside them is left
//! alone. No node threshold is anywhere near. The API stand-in is told
//! both stages: a `MemoryHighRelaxed` warning on the relaxed pod and its
//! `ContainerMemoryPressure` condition set (through one 500 answer, which
//! the agent retries), then cleared once it recovered; an `Evicted` event
//! on the evicted one. cgroup v1 has no memory.high: there the test only
//! checks that the agent says it judges nothing.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::{fs, path::Path, time::Duration};

use evictd_integration::{
    Agent, ApiServer, CgroupVersion, ColdFile, Controller, Faults, PodSpec, Recorded, SandboxNode,
    api_pod, cgroupfs_path, confined_agent, wait_until,
};
use serde_json::json;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const SECCOMP: &str = env!("CARGO_BIN_EXE_evictd-seccomp");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// The held container's memory.high and memory.max, and what it allocates:
/// two thirds over its memory.high, the kernel throttles it for minutes
/// (up to 2 s a charge batch), well inside its memory.max once relaxed.
const HELD_HIGH: u64 = 24 * MIB;
const HELD_MAX: u64 = 64 * MIB;
const HELD_ALLOCATES: u64 = 40 * MIB;
/// The other container's memory.max and the file it cycles, 12 % larger.
const AT_MAX_LIMIT: u64 = 32 * MIB;
const AT_MAX_FILE: u64 = 36 * MIB;
/// Readings 10 s apart: a baseline, the pressure's first, the grace's end
/// (stage 1 or 2), with room for a slow machine.
const STAGES_WITHIN: Duration = Duration::from_secs(120);
const NODE_NAME: &str = "node-a";
/// Reports follow on the API thread; this bounds the wait.
const REPORT_DEADLINE: Duration = Duration::from_secs(20);

/// The agent as the DaemonSet runs it, told the pods by `server`.
fn start_agent(node: &SandboxNode, server: &ApiServer, extra: &[&str]) -> Agent {
    let mut args = node.api_agent_args(NODE_NAME, server.kubeconfig());
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    confined_agent(
        SECCOMP.as_ref(),
        &node.node_cgroup(),
        &node.tree.dir(Controller::Memory, "node"),
        &args,
    )
    .unwrap()
}

fn container_file(node: &SandboxNode, container: &str, file: &str) -> std::path::PathBuf {
    node.tree.dir(Controller::Memory, container).join(file)
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn a_container_held_at_memory_high_is_relaxed_and_one_at_memory_max_is_evicted_after_the_grace() {
    let uid = |n: u32| format!("00000000-0000-4000-8000-0000000000e{n}");
    let pods = vec![
        PodSpec::new(
            "held",
            uid(1),
            cgroupfs_path("besteffort/", &uid(1)),
            0,
            json!({}),
        ),
        PodSpec::new(
            "at-max",
            uid(2),
            cgroupfs_path("besteffort/", &uid(2)),
            0,
            json!({}),
        ),
        PodSpec::new(
            "calm",
            uid(3),
            cgroupfs_path("besteffort/", &uid(3)),
            0,
            json!({}),
        ),
    ];
    let containers: Vec<String> = pods
        .iter()
        .map(|pod| format!("node/{}", pod.container))
        .collect();
    let mut node = SandboxNode::new(pods, NODE_MEMORY, WORKLOAD).unwrap();
    let v2 = node.tree.layout().memory.version == CgroupVersion::V2;
    let api_pods = node
        .pods
        .iter()
        .map(|pod| api_pod(pod, NODE_NAME))
        .collect();
    // The first write of held's condition meets a failing webhook.
    let faults = Faults {
        failing: vec!["/pods/held/status"],
        failing_first: 1,
        ..Faults::default()
    };
    let server = ApiServer::start(api_pods, faults).unwrap();
    let args = [
        "--eviction-hard=memory.available<64Mi",
        "--memory-high-eviction-threshold=1",
        "--memory-max-eviction-threshold=1",
        "--memory-pressure-eviction-grace-period=10s",
        "--eviction-max-pod-grace-period=1",
    ];
    if !v2 {
        let mut agent = start_agent(&node, &server, &args);
        agent.log.expect("--memory-*-eviction-threshold set, but the memory controller is on cgroup v1, which has no memory.high or memory.events: containers' memory pressure is not judged", &[]);
        return;
    }
    fs::write(
        container_file(&node, &containers[0], "memory.max"),
        HELD_MAX.to_string(),
    )
    .unwrap();
    fs::write(
        container_file(&node, &containers[0], "memory.high"),
        HELD_HIGH.to_string(),
    )
    .unwrap();
    node.tree
        .set_memory_limit(&containers[1], AT_MAX_LIMIT)
        .unwrap();
    let file = ColdFile::new(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "at-max",
        AT_MAX_FILE,
    )
    .unwrap();
    let mut agent = start_agent(&node, &server, &args);
    agent.log.expect(
        "containers' memory pressure judged at each 10 s reading (KEP-5986): memory.high relaxed, then the pod evicted",
        &[],
    );
    let answer = node
        .workload("at-max")
        .unwrap()
        .command(&format!("cycle {}", file.path()))
        .unwrap();
    assert_eq!(answer, "cycling");

    // Held at its memory.high, the allocation ends only once relaxed.
    let held = node.workload("held").unwrap();
    held.set_command_deadline(STAGES_WITHIN);
    assert_eq!(held.alloc(HELD_ALLOCATES).unwrap(), HELD_ALLOCATES);
    let relaxed = agent.log.expect(
        "memory.high relaxed to memory.max (KEP-5986 stage 1)",
        &[("pod", "default/held"), ("container", "ctr")],
    );
    assert_eq!(relaxed["memory_high"], HELD_MAX.to_string(), "{relaxed}");
    assert_eq!(
        fs::read_to_string(container_file(&node, &containers[0], "memory.high"))
            .unwrap()
            .trim(),
        HELD_MAX.to_string()
    );

    let log = &mut agent.log;
    let mut decided = None;
    wait_until(STAGES_WITHIN, "the at-max pod's eviction decided", || {
        log.drain();
        decided = log.all("eviction decided").into_iter().next();
        decided.is_some()
    })
    .unwrap();
    let decided = decided.unwrap();
    assert_eq!(decided["victim"], "default/at-max", "{decided}");
    assert_eq!(decided["reason"], "container-memory-pressure", "{decided}");
    assert_eq!(decided["signal"], "memory.high.pressure", "{decided}");
    log.expect("pod killed", &[("victim", "default/at-max")]);
    let procs = node.tree.procs(Controller::Memory, &containers[1]).unwrap();
    assert!(procs.is_empty(), "at-max still runs: {procs:?}");
    let relaxed_event = server
        .wait_for_request(REPORT_DEADLINE, "held's MemoryHighRelaxed event", |r| {
            r.method == "POST" && r.body["reason"] == "MemoryHighRelaxed"
        })
        .unwrap();
    assert_eq!(relaxed_event.body["type"], "Warning");
    assert_eq!(relaxed_event.body["involvedObject"]["name"], "held");
    let evicted_event = server
        .wait_for_request(REPORT_DEADLINE, "at-max's Evicted event", |r| {
            r.method == "POST" && r.body["reason"] == "Evicted"
        })
        .unwrap();
    assert_eq!(evicted_event.body["involvedObject"]["name"], "at-max");
    assert_eq!(
        evicted_event.body["metadata"]["annotations"]["evictd.io/kill-reason"],
        "container-memory-pressure",
        "{:#}",
        evicted_event.body
    );
    // The KEP's pod condition: set by stage 1 (retried past the 500),
    // cleared at the first reading that finds the held pod calm.
    let condition_write = |r: &Recorded, status: &str| {
        r.method == "PATCH"
            && r.path.ends_with("/pods/held/status")
            && r.body["status"]["conditions"][0]["type"] == "ContainerMemoryPressure"
            && r.body["status"]["conditions"][0]["status"] == status
    };
    server
        .wait_for_request(REPORT_DEADLINE, "held's condition set", |r| {
            condition_write(r, "True") && r.status == 200
        })
        .unwrap();
    server
        .wait_for_request(STAGES_WITHIN, "held's condition cleared", |r| {
            condition_write(r, "False") && r.status == 200
        })
        .unwrap();
    let set: Vec<u16> = server
        .requests()
        .iter()
        .filter(|r| condition_write(r, "True"))
        .map(|r| r.status)
        .collect();
    assert_eq!(
        set,
        [500, 200],
        "the condition retried once past the failing webhook"
    );
    let held_conditions = server.pod("default", "held").unwrap()["status"]["conditions"].clone();
    assert_eq!(
        held_conditions,
        json!([{
            "type": "ContainerMemoryPressure",
            "status": "False",
            "reason": "MemoryPressureSubsided",
            "message": "Every container is back under the memory pressure thresholds.",
            "lastTransitionTime": held_conditions[0]["lastTransitionTime"],
        }])
    );
    // The at-max pod never reached stage 1: no condition of the KEP's.
    assert!(
        !server
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/pods/at-max/status")
                && r.body["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "ContainerMemoryPressure")),
        "{:#?}",
        server.requests()
    );
    // Recovered: the held pod allocates at once now.
    assert_eq!(
        node.workload("held").unwrap().alloc(MIB).unwrap(),
        HELD_ALLOCATES + MIB
    );
    assert!(node.alive("held"));
    assert!(node.alive("calm"));
    let (status, log) = agent.stop().unwrap();
    assert!(status.success());
    let evicted: Vec<_> = log
        .seen
        .iter()
        .filter(|line| line["message"] == "eviction decided")
        .map(|line| line["victim"].clone())
        .collect();
    assert_eq!(
        evicted,
        ["default/at-max"],
        "only the pod at its memory.max"
    );
    assert_eq!(node.oom_kills().unwrap(), 0, "the kernel OOM killer fired");
}
