//! A real node: `--node-cgroup /`, the memory hierarchy's root, where
//! kubelet reads the node's memory from the root's statistics (v1
//! `memory.usage_in_bytes` less `total_inactive_file`; v2 `anon + file`
//! less `inactive_file` of the root's memory.stat, which leaves out slab,
//! kernel stacks and page tables) and where memory held outside the pods
//! (system daemons, the kernel's caches) counts as much as the pods'.
//! Runs on this host's cgroup v1 root and, with `cargo xtask test --vm`,
//! on a cgroup v2 guest's: the whole machine in both cases, so its lines
//! are set from what the machine holds when the test starts.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::{fs, io::Write as _, time::Duration};

use evictd::node::{
    cgroupfs::{CgroupFs, CgroupVersion, KeptOpen},
    stats::NodeSignals,
};
use evictd_integration::{Agent, PrivateCgroupTree, Workload, make_room, run_evictd, wait_until};
use serde_json::Value;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
/// What the system daemon of the root test takes, past the line 256 MiB
/// above the machine's working set.
const DAEMON_MEMORY: u64 = 768 * MIB;

/// `key`'s number in a `key value` (memory.stat) or `Key: value kB`
/// (/proc/meminfo) file.
fn field(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()?.trim_end_matches(':') == key).then(|| words.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {key} in {text}"))
}

fn meminfo_bytes(key: &str) -> u64 {
    field(&fs::read_to_string("/proc/meminfo").unwrap(), key) * 1024
}

/// kubelet's working set of the machine, computed from the root's own
/// files as cAdvisor does: usage (v1 the root's usage file; v2 `anon +
/// file` of its memory.stat, opencontainers/cgroups' root stats) less the
/// inactive file pages.
fn kubelet_working_set(cgroupfs: &CgroupFs) -> u64 {
    let root = &cgroupfs.memory_root;
    let stat = fs::read_to_string(root.join("memory.stat")).unwrap();
    let (usage, inactive) = match cgroupfs.version {
        CgroupVersion::V1 => (
            fs::read_to_string(root.join("memory.usage_in_bytes"))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap(),
            field(&stat, "total_inactive_file"),
        ),
        CgroupVersion::V2 => (
            field(&stat, "anon") + field(&stat, "file"),
            field(&stat, "inactive_file"),
        ),
    };
    usage.saturating_sub(inactive)
}

/// How far two readings of the memory cgroups' statistics can disagree
/// with nothing charged in between: each CPU batches its updates
/// (`MEMCG_CHARGE_BATCH`, 64 pages) before they are flushed.
fn charge_batches() -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    64 * 4096 * cpus
}

fn node_signals(cgroupfs: &CgroupFs) -> NodeSignals {
    NodeSignals {
        cgroupfs: cgroupfs.clone(),
        node: "/".into(),
        nodefs: "/nonexistent".into(),
        imagefs: "/nonexistent".into(),
        containerfs: None,
        files: KeptOpen::default(),
        root_band: false,
        cold_cache: None,
    }
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn the_roots_memory_is_kubelets_formula_with_slab_and_anonymous_memory_on_the_node() {
    let cgroupfs = CgroupFs::discover().unwrap();
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("system").unwrap();
    let mut daemon = Workload::spawn_in(&tree, "system", WORKLOAD).unwrap();
    daemon.touch(64 * MIB).unwrap();
    // Slab that kubelet's formula leaves out: a dentry and an inode for
    // each empty file.
    let slab_before = meminfo_bytes("Slab");
    let files = tempfile::tempdir().unwrap();
    for i in 0..50_000 {
        fs::File::create(files.path().join(i.to_string())).unwrap();
    }
    let slab_grew = meminfo_bytes("Slab").saturating_sub(slab_before);
    assert!(slab_grew >= 16 * MIB, "slab grew by {slab_grew} bytes only");

    // Each look is bracketed by two of kubelet's readings; whatever else
    // runs on the machine may move memory in between, so a few looks are
    // allowed for one in a quiet moment. The old reading (MemTotal −
    // MemFree, slab included) is off by the slab in every one.
    let signals = node_signals(&cgroupfs);
    let slack = charge_batches();
    let mut looks = Vec::new();
    let agrees = (0..20).any(|_| {
        let before = kubelet_working_set(&cgroupfs);
        let observed = signals.observe().unwrap().stats.memory;
        let after = kubelet_working_set(&cgroupfs);
        assert_eq!(observed.capacity_bytes, meminfo_bytes("MemTotal"));
        looks.push((before, observed.working_set_bytes, after));
        (before.min(after) - slack..=before.max(after) + slack)
            .contains(&observed.working_set_bytes)
    });
    assert!(
        agrees,
        "(kubelet's formula, evictd's reading, kubelet's formula): {looks:?}"
    );

    // The same through `evictd snapshot`, which holds memory of its own
    // while it reads (a few MiB of a short-lived process).
    let before = kubelet_working_set(&cgroupfs);
    let (status, stdout) = run_evictd(&[
        "snapshot",
        "--node-cgroup",
        "/",
        "--nodefs-path",
        "/nonexistent",
        "--imagefs-path",
        "/nonexistent",
    ])
    .unwrap();
    let after = kubelet_working_set(&cgroupfs);
    assert!(status.success(), "{stdout}");
    let snapshot: Value = serde_json::from_str(&stdout).unwrap();
    let working_set = snapshot["node"]["memory"]["working_set_bytes"]
        .as_u64()
        .unwrap();
    let (low, high) = (before.min(after) - slack, before.max(after) + 32 * MIB);
    assert!(
        (low..=high).contains(&working_set),
        "evictd snapshot read {working_set} bytes; kubelet's formula gave {before} then {after}"
    );
    drop(files);
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn memory_outside_the_pods_past_the_nodes_line_is_reported_by_the_kernel_on_the_root() {
    // The daemon's 768 MiB from free memory: where the machine must
    // reclaim for them, the page cache it takes back can come out of the
    // working set too and keep the climb below the line, with no crossing
    // to report. Once in CI (7.2, a 1.5 GiB guest) no crossing came; the
    // premise check below now says whether that was why.
    make_room(DAEMON_MEMORY + 64 * MIB).unwrap();
    let cgroupfs = CgroupFs::discover().unwrap();
    let tree = PrivateCgroupTree::new().unwrap();
    // A system daemon's cgroup: outside any pods' cgroup.
    tree.create("system").unwrap();
    let mut daemon = Workload::spawn_in(&tree, "system", WORKLOAD).unwrap();
    let capacity = meminfo_bytes("MemTotal");
    // The node's line 256 MiB above what the machine holds now; the daemon
    // then takes 768 MiB, past it whatever else the machine frees meanwhile.
    let threshold = capacity - kubelet_working_set(&cgroupfs) - 256 * MIB;
    let hard = format!("memory.available<{threshold}");
    let mut agent = Agent::start(&[
        "--node-cgroup",
        "/",
        "--dry-run",
        "--eviction-hard",
        &hard,
        "--nodefs-path",
        "/nonexistent",
        "--imagefs-path",
        "/nonexistent",
        // The kernel's trigger alone: hooks attached at any distance, and
        // the resync an hour away.
        "--precise-hooks",
        "always",
        "--resync-interval",
        "1h",
    ])
    .unwrap();
    agent.log.expect("node memory watched on the root", &[]);
    let watched = agent
        .log
        .expect("watching scope", &[("scope", "/"), ("resource", "memory")]);
    agent.log.expect("eBPF programs attached", &[]);
    daemon.touch(DAEMON_MEMORY).unwrap();
    // The scenario's premise, apart from what the agent says: the working
    // set did pass the line (memory.stat's counters are flushed within 2 s).
    let line = capacity - threshold;
    wait_until(
        Duration::from_secs(10),
        "the working set past the line",
        || kubelet_working_set(&cgroupfs) > line,
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: the machine's working set is {} B, the line {line} B: it reclaimed page \
             cache counted in it",
            kubelet_working_set(&cgroupfs)
        )
    });
    let crossed = agent.log.expect(
        "threshold crossed",
        &[
            ("scope", "/"),
            ("resource", "memory"),
            ("direction", "above"),
            ("source", "kernel"),
        ],
    );
    // The kernel compared the machine's working set, not a page counter
    // holding its page cache and kernel memory: what it reported is what
    // the daemon brought the working set to, give or take what the rest
    // of the machine did meanwhile.
    let kernel_value = crossed["kernel_value"].as_u64().unwrap();
    assert!(
        (line - 16 * MIB..line + 64 * MIB).contains(&kernel_value),
        "line {line}: {crossed}"
    );
    let (_, mut log) = agent.stop().unwrap();
    let lines = log.all("watching scope");
    let crossings = log.all("threshold crossed");
    for line in lines.iter().chain(&crossings) {
        let text = line.to_string();
        assert!(
            !text.contains("\"threshold\":0,") && !text.contains("[0,") && !text.contains("[0]"),
            "a line at 0: {line}"
        );
    }
    assert!(watched["thresholds"].as_str().is_some(), "{watched}");
}

/// An agent on the root whose line is 192 MiB beyond what the machine
/// holds, farther than the zone (64 MiB at first): the hooks go, and the
/// far trigger waits at the zone's edge (on cgroup v1 an eventfd on the
/// root, which compares kubelet's usage, not the working set). Returns the
/// agent, a workload of the system's, and the working set at the line.
fn agent_far_from_the_roots_line(
    cgroupfs: &CgroupFs,
    tree: &PrivateCgroupTree,
) -> (Agent, Workload, u64) {
    tree.create("system").unwrap();
    let daemon = Workload::spawn_in(tree, "system", WORKLOAD).unwrap();
    let capacity = meminfo_bytes("MemTotal");
    let threshold = capacity - kubelet_working_set(cgroupfs) - 192 * MIB;
    let hard = format!("memory.available<{threshold}");
    let mut agent = Agent::start(&[
        "--node-cgroup",
        "/",
        "--dry-run",
        "--eviction-hard",
        &hard,
        "--nodefs-path",
        "/nonexistent",
        "--imagefs-path",
        "/nonexistent",
        "--resync-interval",
        "1h",
    ])
    .unwrap();
    agent.log.expect(
        "precise memory hooks",
        &[
            ("state", "disarmed"),
            ("reason", "far from every memory threshold"),
        ],
    );
    (agent, daemon, capacity - threshold)
}

/// Into the zone's middle, short of the line (what the agent itself took
/// at its start counts): the far trigger must attach the hooks. Two steps,
/// so the order is the test's, not the emulator's: an unpaced or even
/// paced climb in a TCG guest could outrun the far trigger's read (a 7.2
/// guest read 89 MiB past the line). Returns the agent's line saying so.
fn climb_into_the_zone(
    agent: &mut Agent,
    daemon: &mut Workload,
    cgroupfs: &CgroupFs,
    line: u64,
) -> Value {
    daemon
        .touch(line - kubelet_working_set(cgroupfs) - 32 * MIB)
        .unwrap();
    agent.log.expect(
        "precise memory hooks",
        &[("state", "armed"), ("reason", "near a memory threshold")],
    )
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn far_from_the_nodes_line_the_root_leaves_the_hooks_off_and_a_climb_past_it_is_still_caught() {
    let cgroupfs = CgroupFs::discover().unwrap();
    let tree = PrivateCgroupTree::new().unwrap();
    let (mut agent, mut daemon, line) = agent_far_from_the_roots_line(&cgroupfs, &tree);
    let armed = climb_into_the_zone(&mut agent, &mut daemon, &cgroupfs, line);
    let early = agent
        .log
        .seen
        .iter()
        .find(|l| l["message"] == "threshold crossed");
    assert!(early.is_none(), "crossed inside the zone: {early:?}");
    // Past the line: caught, after the hooks were attached.
    let mut climber = Workload::spawn_in(&tree, "system", WORKLOAD).unwrap();
    climber.touch(128 * MIB).unwrap();
    let crossed = agent.log.expect(
        "threshold crossed",
        &[
            ("scope", "/"),
            ("resource", "memory"),
            ("direction", "above"),
        ],
    );
    let position = |line: &Value| agent.log.seen.iter().position(|l| l == line);
    assert!(
        position(&armed) < position(&crossed),
        "the hooks were not attached before the crossing: {armed} {crossed}"
    );
}

/// The root's usage file counts page cache its working set leaves out, so
/// cgroup v1's eventfd at the zone's edge sits that much above the edge
/// of the working set. A file deleted once the edge is set takes its pages
/// out of the usage and not out of the working set: the working set then
/// reaches the zone with the usage file still short of the eventfd's level
/// (on v2 the far trigger reads the working set itself).
#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn far_from_the_nodes_line_page_cache_dropped_once_the_edge_is_set_does_not_hide_a_climb() {
    let cgroupfs = CgroupFs::discover().unwrap();
    let tree = PrivateCgroupTree::new().unwrap();
    // 256 MiB of clean page cache (in the root's usage, and inactive, so
    // not in its working set). CARGO_TARGET_TMPDIR is on a disk, not tmpfs,
    // whose pages would count as working set.
    let cache = tempfile::NamedTempFile::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let chunk = vec![0x5a_u8; MIB as usize];
    for _ in 0..256 {
        cache.as_file().write_all(&chunk).unwrap();
    }
    cache.as_file().sync_all().unwrap();
    let (mut agent, mut daemon, line) = agent_far_from_the_roots_line(&cgroupfs, &tree);
    drop(cache);
    climb_into_the_zone(&mut agent, &mut daemon, &cgroupfs, line);
}

/// The root's band compares what /proc/vmstat adds up (the programs read
/// the same per-NUMA-node counters): kubelet's working set, to within the
/// kernel's per-CPU batching.
#[test]
#[ignore = "needs root: run with cargo xtask test"]
fn the_machines_working_set_in_vmstat_is_kubelets() {
    let cgroupfs = CgroupFs::discover().unwrap();
    let vmstat = |key: &str| field(&fs::read_to_string("/proc/vmstat").unwrap(), key) * 4096;
    // The kernel's running counters fold each CPU's changes in past a
    // threshold of at most 125 pages per item.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let slack = charge_batches() + 3 * 125 * 4096 * cpus;
    // The root's memory.stat may still hold what a process freed just
    // before (the previous test's 768 MiB, 7.2 guest: 770 MB against
    // vmstat's 4 MB) until its statistics are next flushed, at most 2 s
    // on: the two must meet by then.
    let mut seen = String::new();
    let met = wait_until(
        Duration::from_secs(10),
        "vmstat and memory.stat to agree",
        || {
            let before = kubelet_working_set(&cgroupfs);
            let counted =
                vmstat("nr_anon_pages") + vmstat("nr_file_pages") - vmstat("nr_inactive_file");
            let after = kubelet_working_set(&cgroupfs);
            seen = format!("vmstat gives {counted}; kubelet's formula {before} then {after}");
            (before.min(after).saturating_sub(slack)..=before.max(after) + slack).contains(&counted)
        },
    );
    assert!(met.is_ok(), "{seen}");
}
