//! Faults a node agent meets in production, each through the real binary on
//! the real kernel: a ring buffer that overflows while the agent cannot
//! read, pod cgroups that vanish while the agent reads them, and the agent
//! itself killed and restarted while the node is under pressure.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]
use std::{
    fs,
    sync::atomic::{AtomicBool, AtomicU32, Ordering},
    time::Instant,
};

use evictd_common::{CgroupEvent, CrossingEvent, EVENTS_RING_BYTES};
use evictd_integration::{
    AGENT_DEADLINE, Agent, AgentLog, BpfObjects, Controller, PrivateCgroupTree, SandboxNode,
    Workload, agent_binary, http_get, memory_pods, metric, program_ids, wait_until,
};
use nix::sys::signal::Signal;
use serde_json::Value;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// Each BPF ring-buffer record carries an 8-byte header.
const RINGBUF_HEADER: usize = 8;

/// Where `line` sits in the log seen so far.
fn position(log: &AgentLog, line: &Value) -> usize {
    log.seen.iter().position(|l| l == line).unwrap()
}

fn metrics_of(log: &mut AgentLog) -> String {
    http_get(&log.metrics_address(), "/metrics").unwrap()
}

/// Watched pods whose crossings race for what room the flood leaves: at
/// most four crossing records fit in less than one cgroup record's space.
const CROSSING_PODS: usize = 6;
const ROOM_FOR_CROSSINGS: usize = 4;

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn a_full_ring_buffer_is_detected_counted_and_repaired_from_cgroupfs_at_once() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("flood").unwrap();
    let pods: Vec<String> = (0..CROSSING_PODS)
        .map(|i| format!("watched/pod{i}"))
        .collect();
    let mut workloads = Vec::new();
    for pod in &pods {
        tree.create(pod).unwrap();
        let mut workload = Workload::spawn_in(&tree, pod, WORKLOAD).unwrap();
        workload.alloc(16 * MIB).unwrap();
        workloads.push(workload);
    }
    // The resync timer never fires here: only the agent noticing the drops
    // can repair what they lost.
    let mut agent = Agent::start(&[
        "--eviction-hard=",
        "--resync-interval",
        "1h",
        "--watch-memory",
        &format!("{}/*=32Mi", tree.relative_path("watched")),
    ])
    .unwrap();
    agent.log.expect("protection armed", &[]);
    for pod in &pods {
        let scope = tree.relative_path(pod);
        agent
            .log
            .expect("watching scope", &[("scope", &scope), ("trigger", "bpf")]);
    }

    // Stopped, the agent reads nothing, and every cgroup created or removed
    // on the machine queues a record in its ring buffer until it is full:
    // twice its capacity from this test alone.
    agent.signal(Signal::SIGSTOP).unwrap();
    let record = size_of::<CgroupEvent>() + RINGBUF_HEADER;
    let capacity = EVENTS_RING_BYTES as usize / record;
    assert!(
        ROOM_FOR_CROSSINGS * (size_of::<CrossingEvent>() + RINGBUF_HEADER) < record
            && (ROOM_FOR_CROSSINGS + 1) * (size_of::<CrossingEvent>() + RINGBUF_HEADER) >= record
    );
    let hierarchies = tree.layout().hierarchies();
    let records_per_cycle = 2 * hierarchies.len();
    let cycles = 2 * capacity / records_per_cycle + 1;
    for cycle in 0..cycles {
        let dirs: Vec<_> = hierarchies
            .iter()
            .map(|h| {
                h.mount_point
                    .join(tree.name())
                    .join(format!("flood/c{cycle}"))
            })
            .collect();
        for dir in &dirs {
            fs::create_dir(dir).unwrap();
        }
        for dir in &dirs {
            fs::remove_dir(dir).unwrap();
        }
    }
    // With the ring full, the kernel drops the mkdir of a cgroup the agent
    // must watch, and crossings of watched scopes beyond the few that fit
    // in what room is left.
    tree.create("watched/late").unwrap();
    for workload in &mut workloads {
        workload.alloc(32 * MIB).unwrap();
    }
    agent.signal(Signal::SIGCONT).unwrap();

    let lost = agent.log.expect(
        "ring buffer was full and dropped records; resyncing from cgroupfs",
        &[],
    );
    let drops = lost["drops"].as_u64().unwrap();
    let least = (cycles * records_per_cycle - capacity) as u64;
    assert!(drops >= least, "{drops} drops, at least {least} expected");
    let late = tree.relative_path("watched/late");
    let installed = agent.log.expect("watching scope", &[("scope", &late)]);
    assert!(position(&agent.log, &lost) < position(&agent.log, &installed));
    let mut repaired = 0;
    for pod in &pods {
        let scope = tree.relative_path(pod);
        let crossed = agent.log.expect(
            "threshold crossed",
            &[("scope", &scope), ("direction", "above")],
        );
        assert!(crossed["value"].as_u64().unwrap() >= 32 * MIB, "{crossed}");
        if crossed["source"] == "resync" {
            assert!(position(&agent.log, &lost) < position(&agent.log, &crossed));
            repaired += 1;
        }
    }
    assert!(
        repaired >= CROSSING_PODS - ROOM_FOR_CROSSINGS,
        "{repaired} crossings repaired by the resync"
    );

    let metrics = metrics_of(&mut agent.log);
    let counted = metric(&metrics, "evictd_ringbuf_drops_total").unwrap();
    assert!(counted >= drops as f64, "{counted} < {drops}");
    let series = "evictd_threshold_crossings_total{direction=\"above\",resource=\"memory\",source=\"resync\"}";
    assert_eq!(metric(&metrics, series), Some(repaired as f64), "{metrics}");
    eprintln!(
        "flood of {} cgroup records into a ring of {capacity}: {drops} dropped; \
         {repaired} of {CROSSING_PODS} crossings and the new cgroup repaired by the resync",
        cycles * records_per_cycle
    );
    assert!(agent.stop().unwrap().0.success());
}

/// Runs `work` while pod cgroups are created and removed, as kubelet does
/// when pods come and go: static pods (a 32-hex-digit uid, so listed and
/// read but never victims), every third with a process in its container
/// that exits before the pod is removed. `churned` counts them.
fn while_churning(tree: &PrivateCgroupTree, churned: &AtomicU32, work: impl FnOnce()) {
    /// Stops the churn however `work` ends: a scope waits for its threads.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let stopper = StopOnDrop(&stop);
        let churner = scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let index = churned.fetch_add(1, Ordering::Relaxed);
                let pod = format!("node/kubepods/besteffort/pod{index:032x}");
                let container = format!("{pod}/ctr");
                tree.create(&container).unwrap();
                if index.is_multiple_of(3) {
                    // SIGKILLed and reaped on drop: the pod's process ended.
                    drop(Workload::spawn_in(tree, &container, WORKLOAD).unwrap());
                }
                tree.remove(&pod).unwrap();
            }
        });
        work();
        drop(stopper);
        churner.join().unwrap();
    });
}

fn engine_runs(log: &mut AgentLog, trigger: &str) -> f64 {
    let metrics = metrics_of(log);
    let series = format!("evictd_engine_runs_total{{trigger=\"{trigger}\"}}");
    metric(&metrics, &series).unwrap_or(0.0)
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn pod_cgroups_vanishing_while_the_agent_reads_and_kills_raise_no_warning() {
    let exporter = memory_pods()
        .into_iter()
        .find(|pod| pod.name == "node-exporter")
        .unwrap();
    let mut node = SandboxNode::new(vec![exporter], NODE_MEMORY, WORKLOAD).unwrap();
    let besteffort = format!("{}/kubepods/besteffort", node.node_cgroup());
    node.tree.create("node/kubepods/besteffort").unwrap();
    let mut agent = node
        .start_agent(&[
            "--eviction-hard",
            "memory.available<256Mi",
            // Every pod cgroup is also watched, installed on its mkdir.
            "--watch-memory",
            &format!("{besteffort}/*=1Gi"),
        ])
        .unwrap();
    agent.log.expect("protection armed", &[]);

    // Pressure no pod may relieve: the system-critical exporter holds it,
    // so the engine lists and reads every pod every 20 ms.
    node.workload("node-exporter")
        .unwrap()
        .alloc(320 * MIB)
        .unwrap();
    let unrelieved = agent.log.expect(
        "threshold met but no pod may be evicted (all critical, running evictd, backing off, or none running)",
        &[],
    );

    let churned = AtomicU32::new(0);
    let before = engine_runs(&mut agent.log, "close-watch");
    while_churning(&node.tree, &churned, || {
        wait_until(AGENT_DEADLINE, "100 engine runs during the churn", || {
            engine_runs(&mut agent.log, "close-watch") >= before + 100.0
        })
        .unwrap();
    });
    let runs = engine_runs(&mut agent.log, "close-watch") - before;

    // Relief, then a pod that may be evicted, while pods keep coming and
    // going.
    node.workload("node-exporter")
        .unwrap()
        .free(320 * MIB)
        .unwrap();
    let hog_uid = "00000000-0000-4000-8000-0000000000f1";
    let hog_cgroup = format!("node/kubepods/besteffort/pod{hog_uid}/ctr");
    node.tree.create(&hog_cgroup).unwrap();
    let mut hog = Workload::spawn_in(&node.tree, &hog_cgroup, WORKLOAD).unwrap();
    while_churning(&node.tree, &churned, || {
        let mut held = 0;
        while hog.alloc(16 * MIB).is_ok() {
            held += 16 * MIB;
            assert!(held < NODE_MEMORY, "the hog was never stopped");
        }
    });
    let killed = agent
        .log
        .expect_eviction(&format!("/pod{hog_uid}"), "memory");
    assert!(node.alive("node-exporter"));
    assert_eq!(node.oom_kills().unwrap(), 0);

    // The only warning is the one about pressure no pod could relieve.
    let problems: Vec<String> = agent
        .log
        .problems()
        .iter()
        .map(|line| format!("{}: {}", line["message"], line["error"]))
        .collect();
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(agent.log.problems(), [unrelieved]);
    eprintln!(
        "{} pod cgroups came and went during {runs} engine runs; then {killed}",
        churned.load(Ordering::Relaxed)
    );
    assert!(agent.stop().unwrap().0.success());
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn an_agent_killed_under_pressure_and_restarted_evicts_the_right_pod_at_once() {
    let mut node = SandboxNode::new(memory_pods(), NODE_MEMORY, WORKLOAD).unwrap();
    node.alloc(&[
        ("db", 48 * MIB),
        ("web", 32 * MIB),
        ("batch", 48 * MIB),
        ("node-exporter", 24 * MIB),
        ("hog", 64 * MIB),
    ])
    .unwrap();
    let threshold = ["--eviction-hard", "memory.available<256Mi"];
    let mut first = node.start_agent(&threshold).unwrap();
    let attached = first.log.expect("eBPF programs attached", &[]);
    let loaded = BpfObjects::of_programs(&program_ids(&attached));
    first.log.expect("protection armed", &[]);
    first.signal(Signal::SIGKILL).unwrap();
    let (status, _) = first.wait_exit().unwrap();
    assert!(!status.success());
    if let Err((timeout, left)) = loaded.wait_freed(AGENT_DEADLINE) {
        panic!("{timeout}: the killed agent left {left:?}");
    }

    // Nobody watches while the node crosses the line (working set past
    // 512 - 256 MiB).
    node.workload("hog").unwrap().alloc(160 * MIB).unwrap();
    let started = Instant::now();
    let mut second = node.start_agent(&threshold).unwrap();
    let armed = second.log.expect("protection armed", &[]);
    let decided = second.log.expect_eviction("default/hog", "memory");
    let killed_after = started.elapsed();
    assert_eq!(decided["trigger"], "startup", "{decided}");
    assert!(position(&second.log, &armed) < position(&second.log, &decided));
    for name in ["db", "web", "batch", "node-exporter"] {
        assert!(node.alive(name), "{name} was killed");
    }
    assert_eq!(node.oom_kills().unwrap(), 0, "the kernel OOM killer fired");
    assert_eq!(second.log.all("eviction decided").len(), 1);
    eprintln!(
        "restart under pressure: protection armed {} ms into the run, hog killed {:?} after the start ({})",
        armed["startup_ms"],
        killed_after,
        agent_binary().display()
    );
    let metrics = metrics_of(&mut second.log);
    assert!(metric(&metrics, "evictd_startup_seconds").unwrap() > 0.0);
    assert!(second.stop().unwrap().0.success());
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn a_pod_left_frozen_by_an_agent_killed_mid_kill_is_thawed_by_the_next_one() {
    let mut node = SandboxNode::new(memory_pods(), NODE_MEMORY, WORKLOAD).unwrap();
    if node.tree.layout().freezer.is_none() {
        eprintln!(
            "skipped: no v1 freezer hierarchy; on cgroup v2 the agent kills with cgroup.kill and never freezes a pod"
        );
        return;
    }
    let hog = memory_pods()
        .into_iter()
        .find(|pod| pod.name == "hog")
        .unwrap();
    let pod = format!("node/{}", hog.container.rsplit_once('/').unwrap().0);
    // What an agent killed between freezing its victim and thawing it
    // leaves: the pod frozen at its own level.
    let state = node
        .tree
        .dir(Controller::Freezer, &pod)
        .join("freezer.state");
    fs::write(&state, "FROZEN").unwrap();
    wait_until(AGENT_DEADLINE, "the pod to freeze", || {
        node.tree.freezer_state(&pod).unwrap() == "FROZEN"
    })
    .unwrap();

    // The restarted agent cannot even start (its kubeconfig is missing):
    // the pod is thawed all the same, before anything that can fail.
    let args = node.api_agent_args("n1", std::path::Path::new("/nonexistent/kubeconfig"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start(&args).unwrap();
    let (status, mut log) = agent.wait_exit().unwrap();
    assert_eq!(status.code(), Some(2), "a configuration error");
    log.expect(
        "thawed a pod left frozen by an agent stopped in the middle of its kill",
        &[("cgroup", &node.tree.relative_path(&pod))],
    );
    assert_eq!(node.tree.freezer_state(&pod).unwrap(), "THAWED");
    assert!(node.alive("hog"), "the pod runs again");
}
