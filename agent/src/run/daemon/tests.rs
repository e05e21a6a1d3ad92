//! The serve loop on fakes, with tokio's clock paused: what wakes the
//! engine, and how often it reads the node.
use std::fs;

use evictd_common::{CrossingEvent, EVENT_CROSSING, RESOURCE_MEMORY};
use tokio::sync::mpsc;

use super::*;
use crate::{
    act::{evictor::CLOSE_WATCH_INTERVAL, wake::WakeCause},
    config::EvictionArgs,
    kernel::bpf::{Crossing, KernelEvent, Received, ScopeKind},
    node::cgroupfs::CgroupFs,
    testing::{
        LogCapture,
        fakes::{Fake, FakeKernel, Harness, HarnessOptions, MIB, NODE_CAPACITY, NODE_CGROUP, pod},
    },
};

/// Serves `harness` for `run_for` of (paused) time with `kernel` records,
/// the resync timer an hour away.
async fn serve_for(harness: &mut Harness, kernel: &mut FakeKernel, run_for: Duration) {
    let ready = AtomicBool::new(false);
    let sources = Sources::<FakeKernel> {
        kernel: Some(kernel),
        notifier: None,
        precise: None,
        check_interval: Duration::from_secs(3600),
        timer_cause: WakeCause::Resync,
    };
    serve::<Fake>(
        &mut harness.evictor,
        sources,
        &ready,
        tokio::time::sleep(run_for),
    )
    .await
    .unwrap();
    assert!(ready.load(Ordering::Acquire), "ready after the first run");
}

/// A kernel record of the node memory scope crossing its band.
fn node_crossing(harness: &Harness) -> Received {
    let dir = harness
        ._dir
        .path()
        .join("memory")
        .join(NODE_CGROUP.trim_start_matches('/'));
    let id = CgroupFs::cgroup_id(&dir).unwrap();
    let now = harness.evictor.clock().now_ns();
    Received {
        event: KernelEvent::Crossing(Crossing {
            kind: ScopeKind::Memory,
            raw: CrossingEvent {
                kind: EVENT_CROSSING,
                resource: RESOURCE_MEMORY,
                timestamp_ns: now,
                scope_id: id,
                trigger_cgroup_id: id,
                value: NODE_CAPACITY,
                bound: NODE_CAPACITY - 100 * MIB,
                rising: 1,
                _pad: 0,
            },
        }),
        received_ns: now,
    }
}

#[tokio::test(start_paused = true)]
async fn the_close_watch_fires_while_usage_stays_past_the_band() {
    // Page cache keeps usage past capacity − 100Mi; the working set leaves
    // 150 MiB, so the threshold is not met: only a fresh look tells when.
    let mut harness = Harness::new(HarnessOptions {
        outside_pods: NODE_CAPACITY - 150 * MIB,
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().page_cache = 100 * MIB;
    let (_records, receiver) = mpsc::unbounded_channel();
    let mut kernel = FakeKernel::new(receiver);
    serve_for(
        &mut harness,
        &mut kernel,
        CLOSE_WATCH_INTERVAL * 5 + CLOSE_WATCH_INTERVAL / 2,
    )
    .await;
    assert_eq!(harness.engine_runs("startup"), 1);
    assert_eq!(harness.engine_runs("close-watch"), 5);

    // Once usage is back below the band, nothing wakes the engine.
    harness.node.0.borrow_mut().page_cache = 0;
    let (_records, receiver) = mpsc::unbounded_channel();
    let mut kernel = FakeKernel::new(receiver);
    serve_for(&mut harness, &mut kernel, CLOSE_WATCH_INTERVAL * 5).await;
    assert_eq!(harness.engine_runs("close-watch"), 5);
}

#[tokio::test(start_paused = true)]
async fn one_kernel_record_is_one_observation_of_the_node() {
    let mut harness = Harness::new(HarnessOptions {
        outside_pods: NODE_CAPACITY - 300 * MIB,
        ..HarnessOptions::default()
    });
    let (records, receiver) = mpsc::unbounded_channel();
    records.send(node_crossing(&harness)).unwrap();
    let mut kernel = FakeKernel::new(receiver);
    let (log, _guard) = LogCapture::start();
    serve_for(&mut harness, &mut kernel, Duration::from_millis(100)).await;
    assert_eq!(harness.engine_runs("kernel"), 1);
    // The fake cgroupfs has no memory files: a read by the monitor would
    // have warned.
    assert!(log.problems().is_empty(), "{:?}", log.problems());
    let model = harness.node.0.borrow();
    assert_eq!(
        model.observations, 2,
        "startup, then the kernel record: the engine scope is settled from that one read"
    );
    assert_eq!(model.listings, 0, "nothing starved: no pod is read");
}

#[tokio::test(start_paused = true)]
async fn a_failed_kill_does_not_wedge_the_loop() {
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("hog", 300)],
        outside_pods: NODE_CAPACITY - 350 * MIB,
        ..HarnessOptions::default()
    });
    *harness.killer.fail.borrow_mut() = true;
    let (records, receiver) = mpsc::unbounded_channel();
    let mut kernel = FakeKernel::new(receiver);
    serve_for(&mut harness, &mut kernel, Duration::from_secs(1)).await;
    assert_eq!(
        harness.killer.killed.borrow().len(),
        1,
        "backing off, not retried every close watch"
    );
    // The loop still serves records and, past the back-off, kills.
    *harness.killer.fail.borrow_mut() = false;
    tokio::time::advance(Duration::from_secs(10)).await;
    records.send(node_crossing(&harness)).unwrap();
    serve_for(&mut harness, &mut kernel, Duration::from_millis(100)).await;
    assert!(harness.node.0.borrow().pods.is_empty());
}

/// The `PID hooks` lines logged: one per move.
fn pid_hook_moves(log: &LogCapture) -> Vec<String> {
    log.lines()
        .into_iter()
        .filter(|line| line.contains("PID hooks"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn without_a_pid_line_the_pid_hooks_go_at_once_and_stay_gone() {
    // A memory line alone, kubelet's default.
    let mut harness = Harness::new(HarnessOptions::default());
    let (_records, receiver) = mpsc::unbounded_channel();
    let mut kernel = FakeKernel::new(receiver);
    let (log, _guard) = LogCapture::start();
    serve_for(&mut harness, &mut kernel, Duration::from_secs(1)).await;
    assert!(!*kernel.pid_hooks.borrow(), "still attached");
    serve_for(&mut harness, &mut kernel, Duration::from_secs(1)).await;
    let moves = pid_hook_moves(&log);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert!(moves[0].contains("state=\"detached\""), "{moves:?}");
}

#[tokio::test(start_paused = true)]
async fn pid_hooks_the_kernel_will_not_move_are_tried_and_warned_about_once() {
    let mut harness = Harness::new(HarnessOptions::default());
    let (records, receiver) = mpsc::unbounded_channel();
    for _ in 0..3 {
        records.send(node_crossing(&harness)).unwrap();
    }
    let mut kernel = FakeKernel::new(receiver);
    kernel.refuse_pid_hooks = true;
    let (log, _guard) = LogCapture::start();
    serve_for(&mut harness, &mut kernel, Duration::from_secs(1)).await;
    assert!(
        harness.engine_runs("kernel") >= 1,
        "no wake-up after the first"
    );
    assert_eq!(kernel.pid_hook_moves, 1);
    let warnings: Vec<String> = log
        .problems()
        .into_iter()
        .filter(|line| line.contains("PID hooks"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
}

#[tokio::test(start_paused = true)]
async fn far_from_a_pid_line_the_pid_hooks_go_and_come_back_when_the_tasks_climb_into_its_zone() {
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionArgs {
            eviction_hard: vec!["memory.available<100Mi".into(), "pid.available<1000".into()],
            ..EvictionArgs::default()
        }
        .resolve()
        .unwrap(),
        pods: vec![pod("forker", 10)],
        pid_zone: Some(ZoneOptions::pids(Duration::from_secs(1))),
        ..HarnessOptions::default()
    });
    // The line at 9,001 tasks, the node at 11: far.
    harness.node.0.borrow_mut().pid_max = 10_000;
    let (_records, receiver) = mpsc::unbounded_channel();
    let mut kernel = FakeKernel::new(receiver);
    let (log, _guard) = LogCapture::start();
    serve_for(&mut harness, &mut kernel, Duration::from_secs(2)).await;
    assert!(!*kernel.pid_hooks.borrow(), "far, and still attached");
    // (8,990 − 1,024) tasks at 20,000 forks/s: read again every 398 ms.
    let reads = harness.engine_runs("close-watch");
    assert!((4..=6).contains(&reads), "{reads} reads in 2 s");

    // The pod forks to 491 tasks below the line, within the zone: the next
    // read attaches them, and the engine looks again at once.
    harness.node.0.borrow_mut().pods[0].usage.pids = 8500;
    serve_for(&mut harness, &mut kernel, Duration::from_millis(500)).await;
    assert!(*kernel.pid_hooks.borrow(), "near, and still detached");
    let moves = pid_hook_moves(&log);
    assert_eq!(moves.len(), 2, "{moves:?}");
    assert!(
        moves[0].contains("state=\"detached\"")
            && moves[0].contains("far from every PID threshold"),
        "{moves:?}"
    );
    assert!(
        moves[1].contains("state=\"attached\"") && moves[1].contains("near a PID threshold"),
        "{moves:?}"
    );
}

/// Serves with the precise memory hooks managed (cgroup v2's adaptive
/// read as the far trigger, as on a node without eventfd thresholds).
async fn serve_zoned(harness: &mut Harness, kernel: &mut FakeKernel, run_for: Duration) {
    let ready = AtomicBool::new(false);
    // No eventfd thresholds are armed on the adaptive read: never read.
    let cgroupfs = CgroupFs::memory_only(
        crate::node::cgroupfs::CgroupVersion::V2,
        &harness._dir.path().join("memory"),
    );
    let sources = Sources::<FakeKernel> {
        kernel: Some(kernel),
        notifier: None,
        precise: Some(PreciseHooks::new(
            cgroupfs,
            harness.metrics.clone(),
            Duration::from_secs(3600),
            Pacer::tokio(),
        )),
        check_interval: Duration::from_secs(3600),
        timer_cause: WakeCause::Resync,
    };
    serve::<Fake>(
        &mut harness.evictor,
        sources,
        &ready,
        tokio::time::sleep(run_for),
    )
    .await
    .unwrap();
}

#[rstest::rstest]
#[case::hooks_that_run_on_frees(true)]
#[case::hooks_that_run_on_charges_only(false)]
#[tokio::test(start_paused = true)]
async fn the_loop_detaches_the_hooks_far_away_attaches_them_on_the_climb_and_detaches_them_only_once_the_kill_started(
    #[case] off_while_reclaiming: bool,
) {
    use crate::scopes::zone::{FarTrigger, ZoneOptions};
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("hog", 100)],
        // 500 MiB available, 400 MiB below the line.
        outside_pods: NODE_CAPACITY - 600 * MIB,
        zone: Some(ZoneOptions::new(
            FarTrigger::AdaptiveRead {
                max_period: Duration::from_secs(1),
            },
            off_while_reclaiming,
        )),
        ..HarnessOptions::default()
    });
    let (_records, receiver) = mpsc::unbounded_channel();
    let mut kernel = FakeKernel::new(receiver);
    kernel.kills = harness.killer.killed.clone();
    let changes = kernel.memory_hook_changes.clone();
    serve_zoned(&mut harness, &mut kernel, Duration::from_secs(3)).await;
    assert_eq!(
        *changes.borrow(),
        [false],
        "far: detached after the first run"
    );
    assert_eq!(harness.metrics.precise_hooks_armed.get(), 0);
    let reads = harness.engine_runs("close-watch");
    assert!(reads >= 2, "the adaptive read looks again: {reads}");

    // The hog climbs to 40 MiB below the line: the next read attaches the
    // hooks and the engine looks again at once.
    harness.node.0.borrow_mut().pods[0]
        .usage
        .memory_working_set_bytes = 460 * MIB;
    serve_zoned(&mut harness, &mut kernel, Duration::from_secs(1)).await;
    assert_eq!(*changes.borrow(), [false, true]);
    assert_eq!(harness.metrics.precise_hooks_armed.get(), 1);

    // Past the line (a kernel record): the kill starts, then the hooks
    // go off, for the kill where they run on frees, else once its memory
    // is back far below the line; then they stay off.
    harness.node.0.borrow_mut().pods[0]
        .usage
        .memory_working_set_bytes = 550 * MIB;
    let (records, receiver) = mpsc::unbounded_channel();
    records.send(node_crossing(&harness)).unwrap();
    kernel.records = receiver;
    serve_zoned(&mut harness, &mut kernel, Duration::from_millis(500)).await;
    assert_eq!(
        *harness.killer.killed.borrow(),
        ["/node/kubepods/besteffort/podhog"]
    );
    assert_eq!(*changes.borrow(), [false, true, false]);
    assert_eq!(
        *kernel.kills_at_changes.borrow(),
        [0, 0, 1],
        "the kill started before the hooks were detached"
    );
    let transitions = |state: &str, reason: &str| {
        harness
            .metrics
            .precise_hooks_transitions
            .with_label_values(&[state, reason])
            .get()
    };
    let for_the_kill = transitions("disarmed", "a victim's memory is being returned");
    let far_again = transitions("disarmed", "far from every memory threshold");
    if off_while_reclaiming {
        assert_eq!((for_the_kill, far_again), (1, 1));
    } else {
        assert_eq!(
            (for_the_kill, far_again),
            (0, 2),
            "off once the memory was back"
        );
    }
    assert_eq!(transitions("armed", "near a memory threshold"), 1);
}

#[tokio::test]
async fn a_memory_threshold_reached_before_its_eventfd_was_armed_asks_for_a_look_at_once() {
    // A v1 memory cgroup's files, as far as arming reads and writes them.
    let dir = tempfile::tempdir().unwrap();
    let usage_file = dir.path().join("memory.usage_in_bytes");
    fs::write(&usage_file, "2000\n").unwrap();
    let mut notifier = Some(Notifier::MemcgThresholds(
        MemcgThresholds::open(dir.path()).unwrap(),
    ));
    let mut rearm_at = |levels: Vec<u64>, read_usage| {
        rearm(notifier.as_mut(), Some(&MemcgLevels { levels, read_usage }))
    };
    assert!(
        rearm_at(vec![1500], 1000),
        "usage climbed past the level between the reading and the arming"
    );
    assert!(
        rearm_at(vec![2000], 1000),
        "reaching the level is crossing it"
    );
    assert!(
        !rearm_at(vec![1500], 1600),
        "past at the reading: the engine saw it (a kill runs there)"
    );
    assert!(
        !rearm_at(vec![3000], 1000),
        "still below: the kernel signals it"
    );
    fs::write(&usage_file, "not a number").unwrap();
    assert!(
        !rearm_at(vec![1500], 1000),
        "an unreadable usage leaves the timer"
    );
    assert!(!rearm(None, Some(&MemcgLevels::default())));
}

/// What the kernel does at a crossing: a count on the eventfd that the
/// registered `line` names.
async fn signal(notifier: &mut Notifier, line: &str) {
    let eventfd: i32 = line.split(' ').next().unwrap().parse().unwrap();
    // SAFETY: the notifier keeps the eventfd open past this write.
    let eventfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(eventfd) };
    nix::unistd::write(eventfd, &1u64.to_ne_bytes()).unwrap();
    notifier.wait().await.unwrap();
}

#[tokio::test]
async fn after_a_signal_only_a_reading_below_a_level_registers_it_again() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("memory.usage_in_bytes"), "1000\n").unwrap();
    let control = dir.path().join("cgroup.event_control");
    let mut notifier = Some(Notifier::MemcgThresholds(
        MemcgThresholds::open(dir.path()).unwrap(),
    ));
    let levels = |read_usage| MemcgLevels {
        levels: vec![1500],
        read_usage,
    };
    rearm(notifier.as_mut(), Some(&levels(900)));
    let registered = fs::read_to_string(&control).unwrap();
    signal(notifier.as_mut().unwrap(), &registered).await;
    fs::write(&control, "").unwrap();
    rearm(notifier.as_mut(), Some(&levels(1600)));
    assert_eq!(
        fs::read_to_string(&control).unwrap(),
        "",
        "past every level (a kill starts): the kernel's passed level is right"
    );
    signal(notifier.as_mut().unwrap(), &registered).await;
    fs::write(&control, "").unwrap();
    rearm(notifier.as_mut(), Some(&levels(1000)));
    assert!(
        fs::read_to_string(&control).unwrap().ends_with(" 1500"),
        "below a level after a signal: registered again"
    );
}
