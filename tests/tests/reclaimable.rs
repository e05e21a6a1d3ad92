//! A pod that read a large file twice (kubernetes#43916): its pages are
//! active file cache, in kubelet's working set, and push memory.available
//! past the threshold while nothing is short of memory: the node is far
//! below its limit, the kernel reclaims nothing and nothing refaults.
//! kubelet's signal (the default) evicts the pod; `--memory-signal
//! reclaimable` counts those cold pages as available and evicts nothing,
//! and still evicts before the kernel OOM-kills once anonymous memory
//! does run short.
//!
//! The scenario needs a machine that reclaims nothing while it runs: a
//! machine full of page cache reclaims from the reader's pages too, and
//! its refaults are heat the option rightly counts. Each test first
//! makes room (dropping clean page cache if less than [`FREE_NEEDED`] is
//! free) and a failure says how many pages the kernel scanned meanwhile.
//!
//! Where the multi-generational LRU is on (Debian's 7.2), a file read
//! through a descriptor stays on the inactive list however often it is
//! read, so kubelet's working set leaves it out and the scenario does not
//! arise: the tests say so and end there.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::{path::Path, time::Duration};

use evictd::node::cgroupfs::CgroupFs;
use evictd_integration::{
    Agent, ColdFile, PodSpec, SandboxNode, cgroupfs_path, http_get, make_room, metric,
    pages_scanned_for_reclaim, wait_until,
};
use serde_json::json;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 768 * MIB;
/// Read twice, it is all active file.
const FILE: u64 = 384 * MIB;
/// Past it once the file is read twice (kubelet's available about 768 −
/// 384 − the pods' few MiB), far from it without the file's pages.
const THRESHOLD: u64 = 448 * MIB;
/// The window the option waits for before it counts anything, and room.
const COLD_WITHIN: Duration = Duration::from_secs(60);
/// Room for the kernel's flush of memory.stat's counters.
const STATS_FLUSHED: Duration = Duration::from_secs(10);
/// Free memory the scenario can allocate without waking the kernel's
/// reclaim: the node's (the file's pages are charged to it) and room
/// above the kernel's watermarks.
const FREE_NEEDED: u64 = NODE_MEMORY + 128 * MIB;
const COUNTED_AVAILABLE: &str = "memory.available: the node's active file pages count as \
     available (--memory-signal reclaimable)";

struct Scenario {
    node: SandboxNode,
    agent: Agent,
    file: ColdFile,
    /// [`pages_scanned_for_reclaim`] when the scenario started.
    scanned_before: u64,
}

impl Scenario {
    /// What the machine's reclaim did since the start, for a failure.
    fn reclaim_since_start(&self) -> String {
        let scanned = pages_scanned_for_reclaim().unwrap() - self.scanned_before;
        format!("the kernel scanned {scanned} pages for reclaim since the scenario started")
    }
}

/// Whether the kernel's multi-generational LRU is on, under which pages
/// read through a descriptor are never counted active.
fn multi_gen_lru() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/lru_gen/enabled").is_ok_and(|text| {
        u64::from_str_radix(text.trim().trim_start_matches("0x"), 16)
            .is_ok_and(|bits| bits & 1 == 1)
    })
}

/// True, with a message, where the scenario cannot arise.
fn no_active_file_from_reads() -> bool {
    let on = multi_gen_lru();
    if on {
        println!(
            "the multi-generational LRU is on: a file read twice stays inactive file, out of \
             kubelet's working set already, so there is no scenario to run"
        );
    }
    on
}

fn start(extra: &[&str]) -> Scenario {
    make_room(FREE_NEEDED).unwrap();
    let scanned_before = pages_scanned_for_reclaim().unwrap();
    let uid = |n: u32| format!("00000000-0000-4000-8000-0000000000c{n}");
    let pods = vec![
        PodSpec::new(
            "reader",
            uid(1),
            cgroupfs_path("besteffort/", &uid(1)),
            0,
            json!({}),
        ),
        PodSpec::new(
            "web",
            uid(2),
            cgroupfs_path("burstable/", &uid(2)),
            0,
            json!({"requests": {"memory": "64Mi"}}),
        ),
        PodSpec::new(
            "hog",
            uid(3),
            cgroupfs_path("besteffort/", &uid(3)),
            0,
            json!({}),
        ),
    ];
    let node = SandboxNode::new(pods, NODE_MEMORY, WORKLOAD).unwrap();
    let file = ColdFile::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "read-twice", FILE).unwrap();
    let hard = format!("--eviction-hard=memory.available<{THRESHOLD}");
    // The hooks attached for good, as in kubernetes.rs (which says why):
    // the hog grows at full speed and this test is about the cache rule.
    let mut args = vec![
        hard.as_str(),
        "--resync-interval=1s",
        "--precise-hooks=always",
    ];
    args.extend_from_slice(extra);
    let agent = node.start_agent(&args).unwrap();
    Scenario {
        node,
        agent,
        file,
        scanned_before,
    }
}

/// kubelet's memory.available of the sandbox node, from its own files.
fn kubelet_available(node: &SandboxNode) -> u64 {
    let reading = CgroupFs::discover()
        .unwrap()
        .read_memory(&node.node_cgroup())
        .unwrap();
    NODE_MEMORY.saturating_sub(reading.working_set_bytes())
}

/// The reader reads its file: the first time into the inactive list, the
/// second time every page to the active one.
fn read(scenario: &mut Scenario) -> std::io::Result<String> {
    let path = scenario.file.path();
    let reader = scenario.node.workload("reader")?;
    reader.command(&format!("read {path}"))
}

fn read_twice(scenario: &mut Scenario) {
    for _ in 0..2 {
        let read = read(scenario);
        if read.as_ref().ok() != Some(&FILE.to_string()) {
            scenario.agent.log.drain();
            panic!(
                "the read: {read:?}; the agent's log: {:#?}",
                scenario.agent.log.seen
            );
        }
    }
    // memory.stat's page states reach the file when the kernel flushes its
    // per-CPU counters (at most 2 s apart), usage at once.
    let past = wait_until(
        STATS_FLUSHED,
        "kubelet's memory.available past the line",
        || kubelet_available(&scenario.node) < THRESHOLD,
    );
    if past.is_err() {
        let cgroups = CgroupFs::discover().unwrap();
        let node = scenario.node.node_cgroup();
        panic!(
            "kubelet's memory.available {} B is not past the threshold: the scenario needs the \
             file's pages in the working set; the node: {:?}, {:?} ({})",
            kubelet_available(&scenario.node),
            cgroups.read_memory(&node).unwrap(),
            cgroups.read_file_cache(None, &node).unwrap(),
            scenario.reclaim_since_start()
        );
    }
}

/// `--memory-signal reclaimable` once it counts the node's active file
/// as available (a whole window read), and the reader's file read twice.
fn cold_cache_read_twice() -> Scenario {
    let mut scenario = start(&["--memory-signal=reclaimable"]);
    let log = &mut scenario.agent.log;
    wait_until(COLD_WITHIN, "the active file counted as available", || {
        log.drain();
        !log.all(COUNTED_AVAILABLE).is_empty()
    })
    .unwrap();
    read_twice(&mut scenario);
    scenario
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn kubelets_signal_evicts_a_pod_for_active_file_cache_nothing_needs_back() {
    if no_active_file_from_reads() {
        return;
    }
    let mut scenario = start(&[]);
    assert_eq!(read(&mut scenario).unwrap(), FILE.to_string());
    // The reader is evicted while its second read turns the pages active:
    // the read may end in its kill.
    let second = read(&mut scenario);
    let decided = scenario
        .agent
        .log
        .expect("eviction decided", &[("victim", "default/reader")]);
    assert_eq!(decided["signal"], "memory.available", "{decided}");
    assert_eq!(decided["reason"], "threshold", "{decided}");
    scenario
        .agent
        .log
        .expect("pod killed", &[("victim", "default/reader")]);
    assert!(second.is_err() || !scenario.node.alive("reader"));
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn with_the_reclaimable_signal_cold_active_file_counts_as_available_and_nobody_is_evicted() {
    if no_active_file_from_reads() {
        return;
    }
    let mut scenario = cold_cache_read_twice();

    // Two resyncs after the read, each observing a node past kubelet's
    // line, and the latest available memory the agent saw.
    let address = scenario.agent.log.metrics_address();
    let runs = |page: &str| metric(page, "evictd_engine_runs_total{trigger=\"resync\"}");
    let before = runs(&http_get(&address, "/metrics").unwrap()).unwrap_or(0.0);
    let mut page = String::new();
    wait_until(
        Duration::from_secs(30),
        "two resyncs after the read",
        || {
            page = http_get(&address, "/metrics").unwrap_or_default();
            runs(&page).is_some_and(|now| now >= before + 2.0)
        },
    )
    .unwrap();
    let still_past = kubelet_available(&scenario.node);
    assert!(still_past < THRESHOLD, "{still_past}");
    let seen = metric(
        &page,
        "evictd_signal_available{signal=\"memory.available\"}",
    )
    .unwrap();
    assert!(
        seen > THRESHOLD as f64,
        "the agent's memory.available {seen} B is past the threshold: it counted the file as \
         used ({})",
        scenario.reclaim_since_start()
    );
    let (status, mut log) = scenario.agent.stop().unwrap();
    assert!(status.success());
    assert!(log.all("eviction decided").is_empty(), "evicted");
    assert!(scenario.node.alive("reader"));
    assert_eq!(scenario.node.oom_kills().unwrap(), 0);
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn with_the_reclaimable_signal_a_hog_beside_the_cold_cache_is_still_evicted_before_the_kernel_kills()
 {
    if no_active_file_from_reads() {
        return;
    }
    let mut scenario = cold_cache_read_twice();
    // Anonymous memory the kernel cannot reclaim without swap, past the
    // line whatever the cache: the agent must stop the hog before the
    // kernel's OOM killer does, and take it, not the reader, whose cache
    // the node counts as free (ranked on its whole working set, as
    // kubelet ranks, the reader went first and gave nothing back: page
    // cache stays charged to its cgroup, and the kernel killed the hog).
    let held = scenario
        .node
        .grow_until_stopped("hog", 8 * MIB, NODE_MEMORY);
    assert!(held.is_ok(), "{held:?}");
    let first = scenario.agent.log.expect("eviction decided", &[]);
    assert_eq!(
        first["victim"],
        "default/hog",
        "{first} ({})",
        scenario.reclaim_since_start()
    );
    scenario
        .agent
        .log
        .expect("pod killed", &[("victim", "default/hog")]);
    assert_eq!(
        scenario.node.oom_kills().unwrap(),
        0,
        "the kernel killed first"
    );
    assert!(
        scenario.node.alive("reader"),
        "{}",
        scenario.reclaim_since_start()
    );
}
