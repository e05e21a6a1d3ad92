//! The `evictd` binary as a user runs it: a watched cgroup, a workload that
//! crosses and hovers at the threshold, the log lines, the metrics endpoint,
//! and a clean stop that leaves no program behind.
use std::process::Command;

use evictd_integration::{
    AGENT_DEADLINE, Agent, BpfObjects, PrivateCgroupTree, Workload, agent_binary, http_get,
    program_ids,
};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn agent_reports_one_crossing_each_way_for_a_hovering_workload_and_detaches_on_sigterm() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let scope = tree.relative_path("pod");
    let mut agent = Agent::start(&[
        "--watch-memory",
        &format!("{scope}=64Mi"),
        "--memory-hysteresis",
        "16Mi",
        // Only the kernel may report the crossings this test asserts.
        "--resync-interval",
        "1h",
    ])
    .unwrap();
    let attached = agent.log.expect("eBPF programs attached", &[]);
    let program_ids = program_ids(&attached);
    assert_eq!(program_ids.len(), 8, "{attached}");
    assert!(
        attached["programs"]
            .as_str()
            .unwrap()
            .contains("memory_switch_out"),
        "{attached}"
    );
    let loaded = BpfObjects::of_programs(&program_ids);
    let address = agent.log.metrics_address();
    agent
        .log
        .expect("watching scope", &[("scope", &scope), ("trigger", "bpf")]);

    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(62 * MIB).unwrap();
    for _ in 0..10 {
        workload.alloc(4 * MIB).unwrap();
        workload.free(4 * MIB).unwrap();
    }
    let above = agent.log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "above"),
            ("source", "kernel"),
        ],
    );
    assert_eq!(above["threshold"], 64 * MIB);
    assert!(above["value"].as_u64().unwrap() >= 64 * MIB);
    assert!(above["latency_us"].as_u64().is_some());
    workload.free(30 * MIB).unwrap();
    agent.log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "below"),
            ("source", "kernel"),
        ],
    );
    assert_eq!(
        agent.log.count("threshold crossed", "direction", "above"),
        1
    );
    assert_eq!(
        agent.log.count("threshold crossed", "direction", "below"),
        1
    );

    let metrics = http_get(&address, "/metrics").unwrap();
    assert!(
        metrics.contains(
            "evictd_threshold_crossings_total{direction=\"above\",resource=\"memory\",source=\"kernel\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("evictd_trigger_info{resource=\"memory\",trigger=\"bpf\"} 1"));
    assert!(metrics.contains("evictd_trigger_fallback{resource=\"memory\"} 0"));
    assert!(metrics.contains("evictd_ready 1"), "{metrics}");
    assert!(metrics.contains("evictd_event_latency_seconds_count"));

    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success(), "{status:?}");
    log.expect("all eBPF programs detached", &[]);
    if let Err((timeout, left)) = loaded.wait_freed(AGENT_DEADLINE) {
        panic!("{timeout}: left loaded {left:?}");
    }
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn a_cgroup_created_after_start_is_watched_through_its_mkdir_event() {
    let tree = PrivateCgroupTree::new().unwrap();
    let pattern = format!("{}/*", tree.relative_path(""));
    // A long resync leaves the late pod's crossing to the kernel alone.
    let mut agent = Agent::start(&[
        "--watch-memory",
        &format!("{pattern}=32Mi"),
        "--resync-interval",
        "1h",
    ])
    .unwrap();
    agent.log.expect("serving /metrics and /healthz", &[]);
    tree.create("late-pod").unwrap();
    let scope = tree.relative_path("late-pod");
    agent
        .log
        .expect("watching scope", &[("scope", &scope), ("trigger", "bpf")]);
    let mut workload = Workload::spawn_in(&tree, "late-pod", WORKLOAD).unwrap();
    workload.alloc(48 * MIB).unwrap();
    agent.log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "above"),
            ("source", "kernel"),
        ],
    );
    drop(workload);
    tree.remove("late-pod").unwrap();
    agent.log.expect("scope removed", &[("scope", &scope)]);
    assert!(agent.stop().unwrap().0.success());
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn poll_mode_reports_crossings_from_cgroupfs() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let scope = tree.relative_path("pod");
    let mut agent = Agent::start(&[
        "--mode",
        "poll",
        "--housekeeping-interval",
        "100ms",
        "--watch-memory",
        &format!("{scope}=32Mi"),
    ])
    .unwrap();
    agent
        .log
        .expect("watching scope", &[("scope", &scope), ("trigger", "poll")]);
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(48 * MIB).unwrap();
    let above = agent.log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "above"),
            ("source", "poll"),
        ],
    );
    assert!(above["value"].as_u64().unwrap() >= 32 * MIB);
    assert!(above["kernel_value"].is_null());
    assert_eq!(
        agent.log.count(
            "eBPF programs attached",
            "message",
            "eBPF programs attached"
        ),
        0
    );
    assert!(agent.stop().unwrap().0.success());
}

#[test]
#[ignore = "needs root (to drop privileges) and cgroups: run with cargo xtask test"]
fn without_privilege_to_load_bpf_the_agent_says_why_and_polls() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let scope = tree.relative_path("pod");
    // setpriv (util-linux) runs the agent as nobody, which may not load BPF.
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(agent_binary())
        .args(["--resync-interval", "100ms"])
        .args(["--watch-memory", &format!("{scope}=32Mi")]);
    let mut agent = Agent::spawn(command).unwrap();
    let unavailable = agent.log.expect(
        "eBPF programs unavailable: POLLING cgroupfs instead of kernel events",
        &[],
    );
    let error = unavailable["error"].as_str().unwrap();
    assert!(error.contains("loading BPF needs root"), "{error}");
    agent
        .log
        .expect("watching scope", &[("scope", &scope), ("trigger", "poll")]);
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(48 * MIB).unwrap();
    agent.log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "above"),
            ("source", "poll"),
        ],
    );
    // What EvictdPolling alerts on (deploy/monitoring/alerts.yaml).
    let address = agent.log.metrics_address();
    let metrics = http_get(&address, "/metrics").unwrap();
    assert!(
        metrics.contains("evictd_trigger_fallback{resource=\"memory\"} 1"),
        "{metrics}"
    );
    assert!(agent.stop().unwrap().0.success());
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn the_agent_locks_its_memory_runs_its_decisions_in_real_time_and_raises_its_open_file_limit() {
    let mut agent = Agent::start(&["--dry-run", "--eviction-hard="]).unwrap();
    agent.log.expect("protection armed", &[]);
    // Real time only once armed: the start (the programs loaded, the first
    // walks) takes no CPU at real-time priority.
    let position = |message: &str| {
        agent
            .log
            .seen
            .iter()
            .position(|line| line["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} line: {:#?}", agent.log.seen))
    };
    assert!(
        position("deciding thread runs in real time (SCHED_FIFO)")
            > position("serving /healthz and /readyz for probes")
    );
    let proc = format!("/proc/{}", agent.pid());
    let limits = std::fs::read_to_string(format!("{proc}/limits")).unwrap();
    let files: Vec<&str> = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    // "Max open files SOFT HARD files"
    assert_eq!(files[3], files[4], "{limits}");
    let status = std::fs::read_to_string(format!("{proc}/status")).unwrap();
    let locked_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmLck:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(locked_kib > 0, "{status}");
    // The main thread decides; the threads it started (the metrics
    // endpoint at least) run normally. A thread that ended meanwhile has
    // no policy (-1) and is passed over.
    let policies: Vec<(u32, i32)> = std::fs::read_dir(format!("{proc}/task"))
        .unwrap()
        .filter_map(|task| {
            let tid: u32 = task.ok()?.file_name().to_str()?.parse().ok()?;
            // SAFETY: reads a thread's policy; no memory is passed.
            let policy = unsafe { libc::sched_getscheduler(tid as libc::pid_t) };
            (policy != -1).then_some((tid, policy))
        })
        .collect();
    for (tid, policy) in &policies {
        let expected = if *tid == agent.pid() {
            libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK
        } else {
            libc::SCHED_OTHER
        };
        assert_eq!(*policy, expected, "thread {tid}: {policies:?}");
    }
    assert!(policies.len() > 1, "{policies:?}");
    assert!(agent.stop().unwrap().0.success());
}
