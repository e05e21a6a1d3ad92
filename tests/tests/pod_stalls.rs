//! Each pod's refaults (and, on cgroup v2, its memory stall time) on the
//! agent's metrics page: a pod that reads a file twice its memory limit
//! twice refaults; an idle pod beside it does not.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use evictd_integration::{
    CgroupVersion, ColdFile, PodSpec, SandboxNode, cgroupfs_path, http_get, metric, wait_until,
};
use serde_json::json;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// The scanner's container limit, and the file it reads: three times
/// larger, so its second read finds the file's first pages reclaimed.
const SCANNER_LIMIT: u64 = 32 * MIB;
const FILE_SIZE: u64 = 96 * MIB;
/// How often the agent reads each pod's counters.
const READING_INTERVAL: Duration = Duration::from_secs(10);

fn series(metric_name: &str, kind: &str, pod: &str) -> String {
    format!("{metric_name}{{kind=\"{kind}\",namespace=\"default\",pod=\"{pod}\"}}")
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn a_pod_reading_a_file_larger_than_its_limit_refaults_and_an_idle_pod_does_not() {
    let uid = |n: u32| format!("00000000-0000-4000-8000-0000000000e{n}");
    // The idle pod first: the workload binary's pages are charged to it,
    // not to the scanner, whose limit would reclaim them.
    let pods = vec![
        PodSpec::new(
            "idle",
            uid(1),
            cgroupfs_path("besteffort/", &uid(1)),
            0,
            json!({}),
        ),
        PodSpec::new(
            "scanner",
            uid(2),
            cgroupfs_path("besteffort/", &uid(2)),
            0,
            json!({}),
        ),
    ];
    let scanner = format!("node/{}", pods[1].container);
    let mut node = SandboxNode::new(pods, NODE_MEMORY, WORKLOAD).unwrap();
    node.tree.set_memory_limit(&scanner, SCANNER_LIMIT).unwrap();
    let file = ColdFile::new(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "refaults",
        FILE_SIZE,
    )
    .unwrap();
    // No thresholds: this test is about what the agent reports.
    let mut agent = node.start_agent(&["--eviction-hard="]).unwrap();
    let address = agent.log.metrics_address();

    let path = file.path();
    let mut scan = || {
        let read = node
            .workload("scanner")
            .unwrap()
            .command(&format!("read {path}"))
            .unwrap();
        assert_eq!(read, FILE_SIZE.to_string());
        Instant::now()
    };
    scan();
    let mut scanned = scan();

    let refaults = |pod: &str, page: &str| {
        metric(
            page,
            &series("evictd_pod_memory_refaults_total", "file", pod),
        )
    };
    let mut page = String::new();
    // The agent reads the pods' counters every 10 s. Under the
    // multi-generational LRU (6.12, 7.2) the kernel counts few of a
    // streaming reader's refaults (51 of the 24,576 pages read again, 6.12;
    // 24,574 with it off), and once in a whole 6.12 suite none for two
    // passes: the scanner reads on, a pass per reading, until one counts.
    wait_until(Duration::from_secs(60), "the scanner's refaults", || {
        page = http_get(&address, "/metrics").unwrap_or_default();
        let counted = refaults("scanner", &page).is_some_and(|count| count > 0.0);
        if !counted && scanned.elapsed() > READING_INTERVAL {
            scanned = scan();
        }
        counted
    })
    .unwrap_or_else(|e| panic!("{e}: {page}"));
    assert_eq!(refaults("idle", &page), Some(0.0), "{page}");

    // Stall time is v2's alone (v1 has no per-cgroup PSI), as are
    // activations.
    let v2 = node.tree.layout().memory.version == CgroupVersion::V2;
    for pod in ["idle", "scanner"] {
        for (name, kind) in [
            ("evictd_pod_memory_stall_seconds_total", "some"),
            ("evictd_pod_memory_stall_seconds_total", "full"),
            ("evictd_pod_memory_activations_total", "file"),
        ] {
            assert_eq!(
                metric(&page, &series(name, kind, pod)).is_some(),
                v2,
                "{name} {kind} of {pod} on v2: {v2}\n{page}"
            );
        }
    }
    drop(agent);
}
