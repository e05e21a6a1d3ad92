//! The eBPF programs on the real kernel: real cgroups, real processes, the
//! records that reach userspace. Run as root through `cargo xtask test`
//! (single-threaded: the tests share the kernel's cgroup and BPF state).
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::time::Duration;

use evictd::{
    kernel::bpf::{Hook, KernelEvent, Probes, Purpose, Received, ScopeKind, ScopeMaps},
    kernel::capabilities::Capabilities,
    kernel::triggers::{self, MemoryFalls, Mode, Trigger},
    node::cgroupfs::CgroupFs,
    scopes::levels::Levels,
};
use evictd_common::NODE_PIDS_SCOPE_ID;
use evictd_integration::{
    Controller, PrivateCgroupTree, Workload, load_probes, scaled, wait_until,
};
use nix::{
    sched::{CpuSet, sched_getaffinity, sched_setaffinity},
    unistd::Pid,
};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const CHECK_STEP: u64 = 256 * 1024;
const EVENT_DEADLINE: Duration = Duration::from_secs(10);

/// How far past a threshold the kernel may first notice it: each CPU can
/// hold up to one check step of unexamined churn, and one fault can charge a
/// 2 MiB transparent huge page at once.
fn detection_tolerance() -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    CHECK_STEP * cpus + 2 * MIB
}

/// The hooks that can watch memory on this kernel (lru-insertion,
/// memcg-stat and page-alloc on 6.18, page-alloc alone on 6.1): the memory
/// tests run on each.
fn memory_hooks() -> Vec<Hook> {
    let (capabilities, _) = Capabilities::detect(&CgroupFs::discover().unwrap());
    let hooks: Vec<Hook> = Hook::ALL
        .into_iter()
        .filter(|hook| hook.purpose() == Purpose::Memory)
        .filter(|hook| capabilities.hook_tracepoints(*hook).is_yes())
        .collect();
    assert!(!hooks.is_empty(), "no memory hook on this kernel");
    hooks
}

/// Loaded programs and the records read from them so far.
struct Kernel {
    runtime: tokio::runtime::Runtime,
    // Detaches the programs when dropped.
    _probes: Probes,
    maps: ScopeMaps,
    events: evictd::kernel::bpf::EventStream,
    unclaimed: Vec<Received>,
}

impl Kernel {
    /// The hooks the agent would choose on this kernel, all attached: every
    /// resource has a kernel trigger on the kernels evictd is tested on.
    fn load() -> Self {
        Self::load_watching_memory_with(None)
    }

    /// Same, with memory watched through `memory` instead of the best hook.
    fn load_with(memory: Hook) -> Self {
        Self::load_watching_memory_with(Some(memory))
    }

    fn load_watching_memory_with(memory: Option<Hook>) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (capabilities, mut probes) = load_probes(CHECK_STEP).unwrap();
        let chosen = triggers::choose(&capabilities, Mode::Event, MemoryFalls::AtTheNextCharge);
        for purpose in Purpose::ALL {
            assert!(
                matches!(chosen.get(purpose).trigger, Trigger::Kernel(_)),
                "{purpose:?} has a kernel trigger on this kernel: {:?} ({capabilities})",
                chosen.get(purpose)
            );
        }
        for hook in chosen.hooks() {
            let hook = match memory {
                Some(memory) if hook.purpose() == Purpose::Memory => memory,
                _ => hook,
            };
            probes.attach(hook).unwrap();
        }
        let events = {
            let _guard = runtime.enter();
            probes.take_events().unwrap()
        };
        let maps = probes.take_scope_maps().unwrap();
        Self {
            runtime,
            _probes: probes,
            maps,
            events,
            unclaimed: Vec::new(),
        }
    }

    fn watch(&mut self, resource: ScopeKind, id: u64, thresholds: &[u64], hysteresis: u64) {
        let band = Levels::new(thresholds.to_vec(), hysteresis).band(0, 0);
        self.maps.set_band(resource, id, band).unwrap();
    }

    /// Re-arms a scope at `level`, as the agent does after a crossing.
    fn rearm(
        &mut self,
        resource: ScopeKind,
        id: u64,
        thresholds: &[u64],
        hysteresis: u64,
        level: usize,
    ) {
        let band = Levels::new(thresholds.to_vec(), hysteresis).band(level, 0);
        self.maps.set_band(resource, id, band).unwrap();
    }

    /// Reads whatever records are queued, waiting at most `deadline` for the
    /// first one.
    fn read(&mut self, deadline: Duration) {
        let mut batch = Vec::new();
        let events = &mut self.events;
        let _ = self.runtime.block_on(async {
            tokio::time::timeout(deadline, events.next_batch(&mut batch)).await
        });
        self.unclaimed
            .extend(batch.into_iter().map(|r| r.expect("every record decodes")));
    }

    /// The first record matching `wanted`, waiting up to EVENT_DEADLINE
    /// (stretched by `scaled`).
    fn expect(&mut self, what: &str, wanted: impl Fn(&KernelEvent) -> bool) -> Received {
        let started = std::time::Instant::now();
        let deadline = scaled(EVENT_DEADLINE);
        loop {
            if let Some(i) = self.unclaimed.iter().position(|r| wanted(&r.event)) {
                return self.unclaimed.remove(i);
            }
            let left = deadline.saturating_sub(started.elapsed());
            assert!(
                !left.is_zero(),
                "no {what} within {deadline:?}; saw {:?}",
                self.unclaimed
            );
            self.read(left);
        }
    }

    /// Records matching `wanted` among those queued now.
    fn count_queued(&mut self, wanted: impl Fn(&KernelEvent) -> bool) -> usize {
        self.read(Duration::from_millis(50));
        self.unclaimed.iter().filter(|r| wanted(&r.event)).count()
    }
}

/// Keeps process `pid` on the first CPU this test may run on.
fn pin_to_one_cpu(pid: u32) {
    let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
    let first = (0..CpuSet::count())
        .find(|&cpu| allowed.is_set(cpu).unwrap_or(false))
        .unwrap();
    let mut only = CpuSet::new();
    only.set(first).unwrap();
    sched_setaffinity(Pid::from_raw(pid.try_into().unwrap()), &only).unwrap();
}

fn crossing(resource: ScopeKind, scope: u64, rising: bool) -> impl Fn(&KernelEvent) -> bool {
    move |event| {
        matches!(event, KernelEvent::Crossing(c)
            if c.kind == resource && c.raw.scope_id == scope && c.rising() == rising)
    }
}

fn crossing_value(received: &Received) -> u64 {
    match received.event {
        KernelEvent::Crossing(c) => c.raw.value,
        other => panic!("not a crossing: {other:?}"),
    }
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn memory_crossing_reaches_the_leaf_and_its_watched_ancestors_before_the_limit() {
    for hook in memory_hooks() {
        eprintln!("memory hook {}", hook.as_str());
        memory_crossing_reaches_the_leaf_and_its_watched_ancestors_before_the_limit_through(hook);
    }
}

fn memory_crossing_reaches_the_leaf_and_its_watched_ancestors_before_the_limit_through(hook: Hook) {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("node/kubepods/pod-a").unwrap();
    let limit = 512 * MIB;
    tree.set_memory_limit("node/kubepods/pod-a", limit).unwrap();
    let mut kernel = Kernel::load_with(hook);
    let scopes = [
        ("node/kubepods/pod-a", 64 * MIB),
        ("node/kubepods", 96 * MIB),
        ("node", 128 * MIB),
    ];
    for (rel, threshold) in scopes {
        kernel.watch(
            ScopeKind::Memory,
            tree.cgroup_id(Controller::Memory, rel).unwrap(),
            &[threshold],
            16 * MIB,
        );
    }
    let mut workload = Workload::spawn_in(&tree, "node/kubepods/pod-a", WORKLOAD).unwrap();

    let mut allocated = 0;
    while allocated < 200 * MIB {
        allocated = workload.alloc(8 * MIB).unwrap();
    }
    let usage = tree.memory_usage("node/kubepods/pod-a").unwrap();
    assert!(usage < limit, "the workload stayed below its limit");
    for (rel, threshold) in scopes {
        let id = tree.cgroup_id(Controller::Memory, rel).unwrap();
        let event = kernel.expect(rel, crossing(ScopeKind::Memory, id, true));
        let value = crossing_value(&event);
        assert!(
            value >= threshold,
            "{rel}: reported {value} below threshold {threshold}"
        );
        assert!(
            value - threshold <= detection_tolerance(),
            "{rel}: reported {value}, {} past threshold {threshold} ({})",
            value - threshold,
            hook.as_str()
        );
        // The value was read from the page counter cgroupfs reports; the
        // workload only grew since.
        assert!(
            value <= tree.memory_usage(rel).unwrap(),
            "{rel}: {value} above cgroupfs"
        );
        let KernelEvent::Crossing(c) = event.event else {
            unreachable!()
        };
        assert_eq!(
            c.raw.trigger_cgroup_id,
            tree.cgroup_id(Controller::Memory, "node/kubepods/pod-a")
                .unwrap()
        );
        assert_eq!(c.raw.bound, threshold);
    }
    assert_eq!(tree.oom_kill_count("node/kubepods/pod-a").unwrap(), 0);
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn memory_falling_below_the_band_is_reported_after_a_rearm() {
    for hook in memory_hooks() {
        eprintln!("memory hook {}", hook.as_str());
        memory_falling_below_the_band_is_reported_after_a_rearm_through(hook);
    }
}

fn memory_falling_below_the_band_is_reported_after_a_rearm_through(hook: Hook) {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let id = tree.cgroup_id(Controller::Memory, "pod").unwrap();
    let mut kernel = Kernel::load_with(hook);
    let (thresholds, hysteresis) = ([64 * MIB], 16 * MIB);
    kernel.watch(ScopeKind::Memory, id, &thresholds, hysteresis);
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(100 * MIB).unwrap();
    kernel.expect("rising crossing", crossing(ScopeKind::Memory, id, true));
    kernel.rearm(ScopeKind::Memory, id, &thresholds, hysteresis, 1);

    // Inside the hysteresis band: no report.
    workload.free(40 * MIB).unwrap();
    assert_eq!(
        kernel.count_queued(crossing(ScopeKind::Memory, id, false)),
        0
    );
    workload.free(50 * MIB).unwrap();
    if !hook.sees_memory_falls() {
        // It runs on charges only: the fall shows at the next one.
        workload.alloc(MIB).unwrap();
    }
    let event = kernel.expect("falling crossing", crossing(ScopeKind::Memory, id, false));
    let value = crossing_value(&event);
    assert!(value < thresholds[0] - hysteresis, "fell to {value}");
    let usage = tree.memory_usage("pod").unwrap();
    if hook.sees_memory_falls() {
        assert!(value >= usage, "only freed since: {value} < {usage}");
    } else {
        assert!(value <= usage, "only charged since: {value} > {usage}");
    }
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn a_crossing_made_by_a_task_that_then_sleeps_is_reported() {
    for hook in memory_hooks() {
        eprintln!("memory hook {}", hook.as_str());
        a_crossing_made_by_a_task_that_then_sleeps_is_reported_through(hook);
    }
}

/// The workload stops at the first page that takes the page counter past
/// the line and waits for its next command. With `lru-insertion` that
/// page (and up to 30 before it) is still in the CPU's LRU batch, and
/// with `page-alloc` it was allocated before it was charged: no hook
/// runs for it until the task allocates again, so the crossing comes from
/// the task's switch-out, which a paced allocator makes after each burst.
///
/// The workload stays on one CPU: the mark that asks for the switch-out
/// read is the CPU's, set by the last read made there, so a task that
/// moves to another CPU between that read and its sleep is not read as it
/// leaves (design note, the switch-out read). On the 6.1 guest the
/// `page-alloc` run once saw no crossing in 40 s when the workload was
/// free to move.
fn a_crossing_made_by_a_task_that_then_sleeps_is_reported_through(hook: Hook) {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let id = tree.cgroup_id(Controller::Memory, "pod").unwrap();
    let mut kernel = Kernel::load_with(hook);
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    pin_to_one_cpu(workload.pid());
    workload.alloc(16 * MIB).unwrap();
    // Not a multiple of the page counter's 64-page batch, so the crossing
    // charge falls anywhere in the LRU batch.
    let line = tree.memory_usage("pod").unwrap() + 24 * MIB + 12 * 4096;
    kernel.watch(ScopeKind::Memory, id, &[line], 16 * MIB);
    let usage_file = tree.memory_usage_file("pod").unwrap();
    // The page counter passes the line when a CPU takes a 64-page batch
    // into its stock; the kernel may hand the unused part back (another
    // cgroup's charge on that CPU), and the cgroup is below the line again.
    // The workload then touches on until the line is passed for good.
    let mut touched = 0;
    for _ in 0..32 {
        touched += workload.touch_until(32 * MIB, line, &usage_file).unwrap();
        if tree.memory_usage("pod").unwrap() >= line {
            break;
        }
    }
    assert!(
        tree.memory_usage("pod").unwrap() >= line,
        "the pod stayed below the line after {touched} bytes"
    );
    let event = kernel.expect("the crossing", crossing(ScopeKind::Memory, id, true));
    let value = crossing_value(&event);
    assert!(value >= line, "reported {value}, below the line {line}");
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn a_value_hovering_at_the_line_is_reported_once() {
    for hook in memory_hooks() {
        eprintln!("memory hook {}", hook.as_str());
        a_value_hovering_at_the_line_is_reported_once_through(hook);
    }
}

fn a_value_hovering_at_the_line_is_reported_once_through(hook: Hook) {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let id = tree.cgroup_id(Controller::Memory, "pod").unwrap();
    let mut kernel = Kernel::load_with(hook);
    kernel.watch(ScopeKind::Memory, id, &[64 * MIB], 16 * MIB);
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(62 * MIB).unwrap();
    for _ in 0..20 {
        workload.alloc(4 * MIB).unwrap();
        workload.free(4 * MIB).unwrap();
    }
    kernel.expect("the crossing", crossing(ScopeKind::Memory, id, true));
    let repeats =
        kernel.count_queued(|e| matches!(e, KernelEvent::Crossing(c) if c.raw.scope_id == id));
    assert_eq!(
        repeats, 0,
        "a disarmed band stays quiet until the agent re-arms it"
    );
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn task_count_crossings_in_a_cgroup_both_ways() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let id = tree.cgroup_id(Controller::Pids, "pod").unwrap();
    let mut kernel = Kernel::load();
    let (thresholds, hysteresis) = ([20], 4);
    kernel.watch(ScopeKind::Pids, id, &thresholds, hysteresis);
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();

    workload.fork(30).unwrap();
    let event = kernel.expect("rising task count", crossing(ScopeKind::Pids, id, true));
    assert_eq!(
        crossing_value(&event),
        20,
        "reported at the fork that reached it"
    );
    assert_eq!(
        tree.pids_current("pod").unwrap(),
        31,
        "workload and its 30 children"
    );

    kernel.rearm(ScopeKind::Pids, id, &thresholds, hysteresis, 1);
    workload.reap(30).unwrap();
    let event = kernel.expect("falling task count", crossing(ScopeKind::Pids, id, false));
    // Tasks are released in RCU batches, so several may go before the first
    // free is traced.
    let value = crossing_value(&event);
    assert!(
        value < 16 && value >= tree.pids_current("pod").unwrap(),
        "{value}"
    );
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn node_wide_task_count_crossing() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let mut kernel = Kernel::load();
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    let now = evictd::node::cgroupfs::node_tasks(None).unwrap();
    kernel.watch(ScopeKind::Pids, NODE_PIDS_SCOPE_ID, &[now + 40], 0);
    workload.fork(60).unwrap();
    let event = kernel.expect(
        "node crossing",
        crossing(ScopeKind::Pids, NODE_PIDS_SCOPE_ID, true),
    );
    // Other tasks on the machine come and go; the count is within reach.
    let value = crossing_value(&event);
    assert!(
        value >= now + 40 && value <= now + 61,
        "{value} vs {now} + 40"
    );
    // No pids cgroup is watched, so no fork walks one; the report still
    // names the cgroup of the task that crossed.
    let KernelEvent::Crossing(c) = event.event else {
        unreachable!()
    };
    assert_ne!(
        c.raw.trigger_cgroup_id, 0,
        "the crossing names a pids cgroup"
    );
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn a_node_wide_band_no_longer_watched_reports_nothing_until_watched_again() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let mut kernel = Kernel::load();
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    let now = evictd::node::cgroupfs::node_tasks(None).unwrap();
    let node_crossing = crossing(ScopeKind::Pids, NODE_PIDS_SCOPE_ID, true);
    kernel.watch(ScopeKind::Pids, NODE_PIDS_SCOPE_ID, &[now + 40], 0);
    kernel
        .maps
        .remove_scope(ScopeKind::Pids, NODE_PIDS_SCOPE_ID)
        .unwrap();
    assert_eq!(
        kernel
            .maps
            .band(ScopeKind::Pids, NODE_PIDS_SCOPE_ID)
            .unwrap(),
        None
    );
    // The armed band is still in the kernel's array: only the watch says
    // it is not to be compared.
    workload.fork(60).unwrap();
    assert_eq!(kernel.count_queued(&node_crossing), 0);

    workload.reap(60).unwrap();
    kernel.watch(ScopeKind::Pids, NODE_PIDS_SCOPE_ID, &[now + 40], 0);
    workload.fork(60).unwrap();
    kernel.expect("node crossing once watched again", node_crossing);
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn cgroup_creation_and_removal_are_reported() {
    let tree = PrivateCgroupTree::new().unwrap();
    let mut kernel = Kernel::load();
    tree.create("pod-new").unwrap();
    let id = tree.cgroup_id(Controller::Memory, "pod-new").unwrap();
    let path = tree.relative_path("pod-new");
    let created = kernel.expect(
        "mkdir",
        |e| matches!(e, KernelEvent::CgroupCreated(c) if c.0.cgroup_id == id),
    );
    let KernelEvent::CgroupCreated(change) = created.event else {
        unreachable!()
    };
    assert_eq!(change.path(), (path, false));
    assert_eq!(change.0.level, 2);
    tree.remove("pod-new").unwrap();
    kernel.expect(
        "rmdir",
        |e| matches!(e, KernelEvent::CgroupRemoved(c) if c.0.cgroup_id == id),
    );
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn a_kernel_oom_kill_is_reported() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    tree.set_memory_limit("pod", 64 * MIB).unwrap();
    let id = tree.cgroup_id(Controller::Memory, "pod").unwrap();
    let mut kernel = Kernel::load();
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    let pid = workload.pid();
    assert!(
        workload.alloc(128 * MIB).is_err(),
        "the OOM killer ends the workload"
    );
    let status = workload.wait_exit(EVENT_DEADLINE).unwrap();
    assert!(status.is_some_and(|s| !s.success()), "killed: {status:?}");
    let event = kernel.expect(
        "OOM victim",
        |e| matches!(e, KernelEvent::OomVictim(o) if o.pid == pid),
    );
    let KernelEvent::OomVictim(victim) = event.event else {
        unreachable!()
    };
    assert_eq!(victim.memory_cgroup_id, id);
    assert!(victim.rss_bytes > 32 * MIB, "rss {}", victim.rss_bytes);
    assert_eq!(&victim.comm[..15], b"evictd-workload");
    wait_until(EVENT_DEADLINE, "oom_kill in memory.oom_control", || {
        tree.oom_kill_count("pod").unwrap_or(0) >= 1
    })
    .unwrap();
}
