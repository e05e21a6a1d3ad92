//! The loop's decisions on fakes of its seams (node, killer, API, kernel
//! bands), with tokio's clock paused: no root, no sleeping.
use std::collections::BTreeMap;

use evictd_common::Band;

use super::{storage_limits::IMMEDIATE_EVICTION_GRACE_PERIOD, *};
use crate::{
    act::pre_kill::{HookTarget, PreKillHook},
    act::{kill::Sandbox, wake::WakeCause},
    decide::snapshot::{EmptyDirVolume, ForkRate, QosClass},
    decide::{
        engine::DEFAULT_TERMINATION_GRACE_PERIOD,
        rank::PidRanking,
        thresholds::{EvictionConfig, Signal, Threshold, ThresholdValue},
    },
    kernel::bpf::ScopeKind,
    node::container_pressure::PodFinding,
    node::runtime::disk_usage::{FsUsage, PodDiskUsage, VolumeUsage},
    report::decisions::{DecisionRecord, DecisionRecords, explain, read_records},
    report::kubernetes::{EvictOutcome, EvictionAction, KILL_REASON_KEY},
    state::StateDir,
    testing::{
        LogCapture,
        fakes::{FakeApi, Harness, HarnessOptions, MIB, NODE_CAPACITY, pod},
    },
};

const SECOND: Duration = Duration::from_secs(1);
const MIB_I64: i64 = 1 << 20;

/// `n` MiB as a threshold's value.
fn mib(n: i64) -> ThresholdValue {
    ThresholdValue::Quantity(n * MIB_I64)
}

/// `n` tasks as a threshold's value.
fn tasks(n: i64) -> ThresholdValue {
    ThresholdValue::Quantity(n)
}

/// memory.available<100Mi as kubelet takes it (with its copy for the pods'
/// allocatable memory), then `others`.
fn hard_memory_then(others: impl IntoIterator<Item = Threshold>) -> Vec<Threshold> {
    Threshold::hard_memory_available(100 * MIB_I64)
        .into_iter()
        .chain(others)
        .collect()
}

/// memory.available<`n`Mi, held for `grace`.
fn soft_memory_available(n: i64, grace: Duration) -> Threshold {
    Threshold::soft(Signal::MemoryAvailable, mib(n), grace)
}

/// Working set outside the pods that leaves `free_mib` MiB available with
/// `pods_mib` held by pods.
fn outside(pods_mib: u64, free_mib: u64) -> u64 {
    NODE_CAPACITY - (pods_mib + free_mib) * MIB
}

fn wake(harness: &Harness) -> Wake {
    harness.evictor.clock().wake(WakeCause::Kernel)
}

fn killed(harness: &Harness) -> Vec<String> {
    harness.killer.killed.borrow().clone()
}

fn cgroup(name: &str) -> String {
    format!("/node/kubepods/besteffort/pod{name}")
}

#[tokio::test(start_paused = true)]
async fn the_biggest_hog_goes_and_the_engine_decides_again_once_it_has() {
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("web", 100), pod("hog", 300)],
        outside_pods: outside(400, 50),
        ..HarnessOptions::default()
    });
    let first = harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        first.action,
        Action::AwaitChange,
        "the eviction's end wakes it"
    );
    assert_eq!(harness.evictor.evictions_running(), 1);
    let last = harness.settle(wake(&harness)).await;
    assert_eq!(
        killed(&harness),
        [cgroup("hog")],
        "one victim, then the node was fine"
    );
    assert_eq!(last.action, Action::AwaitChange);
    assert_eq!(harness.engine_runs("eviction-ended"), 1);
}

#[tokio::test(start_paused = true)]
async fn the_eviction_budget_bounds_a_runaway() {
    // Every kill gives back the 1 MiB its pod held, never enough.
    let pods = (0..20).map(|i| pod(&format!("p{i}"), 1)).collect();
    let mut harness = Harness::new(HarnessOptions {
        pods,
        outside_pods: NODE_CAPACITY - 30 * MIB,
        budget: "3/1m".parse().unwrap(),
        ..HarnessOptions::default()
    });
    let (log, _guard) = LogCapture::start();
    let evaluation = harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness).len(), 3);
    let Action::Requeue(wait) = evaluation.action else {
        panic!("{evaluation:?}")
    };
    assert!(wait <= Duration::from_secs(60), "{wait:?}");
    assert!(log.contains("eviction budget spent"), "{:?}", log.lines());
    let held = harness
        .metrics
        .evictions_held
        .with_label_values(&["budget"])
        .get();
    assert!(held >= 1);
    tokio::time::advance(Duration::from_secs(60)).await;
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness).len(), 6, "a new period, a new budget");
}

#[tokio::test(start_paused = true)]
async fn the_budget_an_agent_spent_is_spent_for_the_agent_restarted_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let options = || HarnessOptions {
        pods: (0..20).map(|i| pod(&format!("p{i}"), 1)).collect(),
        outside_pods: NODE_CAPACITY - 30 * MIB,
        budget: "3/1m".parse().unwrap(),
        state_dir: Some(dir.path().join("evictd")),
        ..HarnessOptions::default()
    };
    let mut first = Harness::new(options());
    first.settle(wake(&first)).await;
    assert_eq!(killed(&first).len(), 3);
    drop(first);
    // A crash loop: the agent starts again on the same node, under the
    // same pressure.
    let (log, _guard) = LogCapture::start();
    let mut restarted = Harness::new(options());
    restarted.settle(wake(&restarted)).await;
    assert!(killed(&restarted).is_empty(), "the budget is still spent");
    assert!(log.contains("eviction budget spent"), "{:?}", log.lines());
    assert!(log.contains("the evictions the last agent started count in this one's budget"));
}

#[tokio::test(start_paused = true)]
async fn pressure_outside_the_pods_stops_evictions_instead_of_draining_them() {
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("a", 300), pod("b", 200), pod("c", 100)],
        outside_pods: outside(600, 50),
        ..HarnessOptions::default()
    });
    let (log, _guard) = LogCapture::start();
    harness.evictor.evaluate(wake(&harness));
    let (id, ended) = harness.evictor.next_ended().await;
    assert_eq!(killed(&harness), [cgroup("a")]);
    // A host process takes what the kill frees, as fast as it is freed.
    harness.node.0.borrow_mut().outside_pods += 300 * MIB;
    harness.evictor.end(id, ended);
    let wake_after = harness.evictor.clock().wake(WakeCause::EvictionEnded);
    harness.evictor.evaluate(wake_after);
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness), [cgroup("a")], "b and c live");
    assert!(
        log.contains("the pressure is outside the pods"),
        "{:?}",
        log.lines()
    );
    let gauge = harness
        .metrics
        .pressure_outside_pods
        .with_label_values(&["memory.available"]);
    assert_eq!(gauge.get(), 1);
    // Held for the budget's period, watching; then one more try.
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness).len(), 1);
    tokio::time::advance(Duration::from_secs(60)).await;
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness), [cgroup("a"), cgroup("b")]);
}

/// Starts `harness`'s decision record in a fresh state directory.
fn record_decisions(harness: &mut Harness) -> (tempfile::TempDir, StateDir) {
    let temp = tempfile::tempdir().unwrap();
    let dir = StateDir::open(temp.path()).unwrap();
    harness
        .evictor
        .set_decision_records(DecisionRecords::start(dir.clone(), 8).unwrap());
    (temp, dir)
}

/// The records in `dir` once its writer has written `count` (bounded: the
/// writer is a thread of its own).
fn recorded(dir: &StateDir, count: usize) -> Vec<DecisionRecord> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let records = read_records(dir).unwrap();
        if records.len() >= count || std::time::Instant::now() > deadline {
            return records;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn outcomes(records: &[DecisionRecord]) -> Vec<Outcome> {
    records
        .iter()
        .map(|record| record.decision.facts.outcome)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_hold_for_pressure_outside_the_pods_is_recorded_once_with_no_ranking() {
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("a", 300), pod("b", 200)],
        outside_pods: outside(500, 50),
        ..HarnessOptions::default()
    });
    let (_temp, dir) = record_decisions(&mut harness);
    harness.evictor.evaluate(wake(&harness));
    let (id, ended) = harness.evictor.next_ended().await;
    harness.node.0.borrow_mut().outside_pods += 300 * MIB;
    harness.evictor.end(id, ended);
    for _ in 0..3 {
        harness.settle(wake(&harness)).await;
    }
    assert_eq!(killed(&harness), [cgroup("a")]);
    // The hold over, one more try: its record comes after any the hold
    // made, so a hold recorded twice would show.
    tokio::time::advance(Duration::from_secs(60)).await;
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness), [cgroup("a"), cgroup("b")]);
    let records = recorded(&dir, 3);
    assert_eq!(
        outcomes(&records),
        [Outcome::Evicted, Outcome::HeldOutsidePods, Outcome::Evicted],
        "the hold once, not once per run"
    );
    let held = &records[1];
    assert!(held.pods.is_empty() && held.decision.ranking.is_empty());
    assert_eq!(held.decision.facts.signal, Signal::MemoryAvailable);
    let told = explain(held);
    assert!(told.contains("the pressure is outside the pods"), "{told}");
    assert!(!told.contains("ranking for"), "{told}");
}

#[tokio::test(start_paused = true)]
async fn a_disk_decision_held_for_unknown_usage_is_recorded_once() {
    let mut harness = disk_harness();
    let (_temp, dir) = record_decisions(&mut harness);
    harness.node.0.borrow_mut().disk_usage_unknown = true;
    for _ in 0..3 {
        harness.evictor.evaluate(wake(&harness));
    }
    // The runtime back: decided, after (and so showing) every hold record.
    harness.node.0.borrow_mut().disk_usage_unknown = false;
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness).len(), 1);
    let records = recorded(&dir, 2);
    assert_eq!(
        outcomes(&records),
        [Outcome::HeldDiskUsageUnknown, Outcome::Evicted]
    );
    assert_eq!(records[0].decision.facts.signal, Signal::NodeFsAvailable);
    assert!(records[0].decision.victims.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_decision_not_acted_on_is_reported_once() {
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("hog", 300)],
        outside_pods: outside(300, 50),
        dry_run: true,
        ..HarnessOptions::default()
    });
    let (log, _guard) = LogCapture::start();
    for _ in 0..3 {
        let evaluation = harness.settle(wake(&harness)).await;
        assert_eq!(evaluation.action, Action::Requeue(CLOSE_WATCH_INTERVAL));
    }
    let decided = log
        .lines()
        .iter()
        .filter(|line| line.contains("eviction decided"))
        .count();
    assert_eq!(decided, 1, "{:?}", log.lines());
    assert!(killed(&harness).is_empty(), "dry run");
    let evictions = harness
        .metrics
        .evictions
        .with_label_values(&["memory.available", "BestEffort", "threshold"])
        .get();
    assert_eq!(evictions, 1);
}

/// A hog past a soft memory.available<100Mi whose 1s grace period has
/// passed, with an API that answers evictions with `answer`.
async fn soft_harness(answer: EvictOutcome) -> (Harness, FakeApi) {
    let pods = vec![pod("hog", 300)];
    let api = FakeApi::evicting(&pods, answer);
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig::of(vec![soft_memory_available(100, SECOND)]),
        pods,
        outside_pods: outside(300, 50),
        api: Some(api.clone()),
        ..HarnessOptions::default()
    });
    let waiting = harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        waiting.action,
        Action::Requeue(CLOSE_WATCH_INTERVAL),
        "inside the grace period: look again soon"
    );
    assert_eq!(api.0.borrow().evictions, 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    (harness, api)
}

#[tokio::test(start_paused = true)]
async fn a_refused_eviction_leaves_the_pod_and_is_not_retried_until_the_ranking_changes() {
    let (mut harness, api) =
        soft_harness(EvictOutcome::Refused("PodDisruptionBudget".into())).await;
    let (log, _guard) = LogCapture::start();
    for _ in 0..3 {
        harness.settle(wake(&harness)).await;
    }
    assert_eq!(api.0.borrow().evictions, 1, "asked once");
    assert!(killed(&harness).is_empty(), "no local kill");
    assert_eq!(harness.node.0.borrow().pods.len(), 1, "the pod stays");
    assert!(log.contains("the Eviction API refused the soft eviction; the pod stays"));
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_eviction_falls_back_to_the_local_kill() {
    let (mut harness, api) = soft_harness(EvictOutcome::Unanswered).await;
    harness.settle(wake(&harness)).await;
    assert_eq!(api.0.borrow().evictions, 1);
    assert_eq!(killed(&harness), [cgroup("hog")]);
    let reports = &api.0.borrow().reports;
    assert_eq!(reports.len(), 1, "the local kill is reported");
    assert!(!reports[0].evicted_by_api);
}

#[tokio::test(start_paused = true)]
async fn a_forbidden_eviction_is_a_configuration_error_said_loudly_and_the_pod_killed_locally() {
    let (mut harness, api) = soft_harness(EvictOutcome::Forbidden(
        "Forbidden: evictd may not use the Eviction API".into(),
    ))
    .await;
    let (log, _guard) = LogCapture::start();
    harness.settle(wake(&harness)).await;
    assert!(
        log.contains("the Kubernetes API forbids evictd's Evictions"),
        "{:?}",
        log.lines()
    );
    assert!(!log.contains("the pod stays"));
    assert_eq!(api.0.borrow().evictions, 1);
    assert_eq!(killed(&harness), [cgroup("hog")], "not left running");
    let reports = &api.0.borrow().reports;
    assert_eq!(reports.len(), 1, "reported as a local kill");
    assert!(!reports[0].evicted_by_api);
}

/// The sandbox each kill of a hog past a soft threshold, with a 30 s grace
/// period, is told of, with the runtime naming `sandboxes` (none: no
/// runtime) and the API listing the hog's `containers`.
async fn sandboxes_told(
    sandboxes: Option<BTreeMap<String, Vec<String>>>,
    containers: Vec<(String, String)>,
) -> Vec<Sandbox> {
    let hog = PodSnapshot {
        termination_grace_period_seconds: Some(30),
        ..pod("hog", 300)
    };
    let api = FakeApi::evicting(std::slice::from_ref(&hog), EvictOutcome::Unanswered);
    if let Some(known) = api.0.borrow_mut().known.get_mut(&hog.uid) {
        known.container_ids = containers;
    }
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig {
            max_pod_grace_period: Duration::from_secs(30),
            ..EvictionConfig::of(vec![soft_memory_available(100, SECOND)])
        },
        pods: vec![hog],
        outside_pods: outside(300, 50),
        api: Some(api),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().sandboxes = sandboxes;
    harness.evictor.evaluate(wake(&harness));
    tokio::time::advance(Duration::from_secs(1)).await;
    harness.settle(wake(&harness)).await;
    harness.killer.sandboxes.borrow().clone()
}

#[tokio::test(start_paused = true)]
async fn a_soft_kill_spares_the_sandbox_the_runtime_names_or_else_what_the_api_does_not_list() {
    let containers = vec![("main".to_owned(), "container-1".to_owned())];
    let runtime = BTreeMap::from([("uid-hog".to_owned(), vec!["sandbox-1".to_owned()])]);
    assert_eq!(
        sandboxes_told(Some(runtime), containers.clone()).await,
        [Sandbox::Named(vec!["sandbox-1".into()])]
    );
    assert_eq!(
        sandboxes_told(None, containers).await,
        [Sandbox::NotContaining(vec!["container-1".into()])]
    );
    assert_eq!(sandboxes_told(None, Vec::new()).await, [Sandbox::Unknown]);
}

#[tokio::test(start_paused = true)]
async fn an_accepted_eviction_is_left_to_the_api() {
    let (mut harness, api) = soft_harness(EvictOutcome::Evicted).await;
    harness.settle(wake(&harness)).await;
    assert!(killed(&harness).is_empty());
    let reports = &api.0.borrow().reports;
    assert_eq!(reports.len(), 1);
    assert!(reports[0].evicted_by_api);
}

#[tokio::test(start_paused = true)]
async fn a_failed_kill_backs_the_pod_off_and_takes_the_next_candidate() {
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("hog", 300), pod("web", 200)],
        outside_pods: outside(500, 50),
        ..HarnessOptions::default()
    });
    *harness.killer.fail.borrow_mut() = true;
    let (log, _guard) = LogCapture::start();
    harness.evictor.evaluate(wake(&harness));
    let (id, ended) = harness.evictor.next_ended().await;
    harness.evictor.end(id, ended);
    assert!(log.contains("eviction failed"), "{:?}", log.lines());
    let failures = harness
        .metrics
        .eviction_failures
        .with_label_values(&["memory.available", "threshold"])
        .get();
    assert_eq!(failures, 1);
    *harness.killer.fail.borrow_mut() = false;
    harness.settle(wake(&harness)).await;
    assert_eq!(
        killed(&harness),
        [cgroup("hog"), cgroup("web")],
        "the hog is left alone for its back-off; the next pod goes"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pod_past_two_thresholds_is_killed_once_and_the_other_resource_waits_for_it() {
    // A fork bomb holding memory and tasks, past both hard thresholds.
    let mut bomb = pod("bomb", 300);
    bomb.usage.pids = 900;
    let pods = vec![bomb, pod("web", 100)];
    let api = FakeApi::evicting(&pods, EvictOutcome::Evicted);
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig::of(hard_memory_then([Threshold::hard(
            Signal::PidAvailable,
            tasks(100),
        )])),
        pods,
        outside_pods: outside(400, 50),
        api: Some(api.clone()),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().pid_max = 1000;
    // A second wake-up (a kernel record, the resync timer) while the kill
    // runs: the bomb still has its processes then.
    harness.evictor.evaluate(wake(&harness));
    let second = harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        second.action,
        Action::AwaitChange,
        "the kill's end wakes the engine"
    );
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness), [cgroup("bomb")], "once, and web lives");
    assert_eq!(api.0.borrow().reports.len(), 1, "one report");
    let decided: u64 = ["memory.available", "pid.available"]
        .into_iter()
        .map(|signal| {
            harness
                .metrics
                .evictions
                .with_label_values(&[signal, "BestEffort", "threshold"])
                .get()
        })
        .sum();
    assert_eq!(
        decided, 1,
        "one eviction decided, one spent from the budget"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fork_bombs_tasks_not_yet_reaped_are_waited_for_not_taken_for_pressure_outside_the_pods()
{
    let mut bomb = pod("bomb", 10);
    bomb.usage.pids = 900;
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig::of(vec![Threshold::hard(Signal::PidAvailable, tasks(100))]),
        pods: vec![bomb, pod("web", 10)],
        outside_pods: outside(20, 500),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().pid_max = 1000;
    let (log, _guard) = LogCapture::start();
    harness.evictor.evaluate(wake(&harness));
    let (id, ended) = harness.evictor.next_ended().await;
    // The bomb lists no process once killed, but its tasks are charged to
    // it, and to the node, until they are reaped.
    harness
        .node
        .0
        .borrow_mut()
        .unreaped
        .insert(cgroup("bomb"), 900);
    harness.evictor.end(id, ended);
    harness.evictor.evaluate(wake(&harness));
    harness.node.0.borrow_mut().unreaped.clear();
    harness.evictor.evaluate(wake(&harness));
    assert!(
        !log.contains("the pressure is outside the pods"),
        "{:?}",
        log.lines()
    );
    assert_eq!(killed(&harness), [cgroup("bomb")], "web lives");
}

#[tokio::test(start_paused = true)]
async fn a_hard_threshold_takes_over_a_soft_eviction_waiting_out_its_grace() {
    let pods = vec![PodSnapshot {
        termination_grace_period_seconds: Some(30),
        ..pod("hog", 300)
    }];
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig {
            max_pod_grace_period: Duration::from_secs(30),
            ..EvictionConfig::of(hard_memory_then([soft_memory_available(400, SECOND)]))
        },
        pods,
        outside_pods: outside(300, 300),
        // The soft eviction spends it: taking it over is no new eviction.
        budget: "1/1m".parse().unwrap(),
        ..HarnessOptions::default()
    });
    let soft = harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        soft.action,
        Action::Requeue(CLOSE_WATCH_INTERVAL),
        "in its grace period"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    let _ = harness.evictor.evaluate(wake(&harness));
    assert_eq!(harness.evictor.evictions_running(), 1);
    // As the serve loop would, let it send its SIGTERM and wait.
    let waiting =
        tokio::time::timeout(Duration::from_millis(1), harness.evictor.next_ended()).await;
    assert!(waiting.is_err(), "the soft eviction waits out 30 s");
    // The pod keeps growing past the hard threshold during its grace.
    harness.node.0.borrow_mut().outside_pods += 250 * MIB;
    let (log, _guard) = LogCapture::start();
    harness.settle(wake(&harness)).await;
    assert!(log.contains("a hard threshold takes over the soft eviction under way"));
    assert!(
        harness.node.0.borrow().pods.is_empty(),
        "killed at once, not 30 s later"
    );
    assert_eq!(killed(&harness), [cgroup("hog"), cgroup("hog")]);
}

#[tokio::test(start_paused = true)]
async fn usage_past_the_band_with_the_threshold_unmet_asks_for_a_close_watch() {
    // 150 MiB of working set free, 100 MiB of it page cache: usage is past
    // capacity − 100Mi (the band) while memory.available is not below it.
    let mut harness = Harness::new(HarnessOptions {
        outside_pods: outside(0, 150),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().page_cache = 100 * MIB;
    let evaluation = harness.evictor.evaluate(wake(&harness));
    assert_eq!(evaluation.action, Action::Requeue(CLOSE_WATCH_INTERVAL));
    assert_eq!(
        evaluation.memcg_levels.map(|memcg| memcg.levels),
        Some(vec![NODE_CAPACITY + 1]),
        "capacity − 100Mi + 1 + inactive file"
    );
    // Past the first line the kernel still watches: where the working set
    // crosses if the cache stays, so an anonymous hog's crossing is pushed.
    let memory_bands: Vec<Band> = harness
        .evictor
        .monitor()
        .bands()
        .unwrap()
        .bands
        .iter()
        .filter(|(key, _)| key.kind == ScopeKind::Memory)
        .map(|(_, band)| *band)
        .collect();
    assert_eq!(memory_bands.len(), 1, "{memory_bands:?}");
    assert_eq!(
        memory_bands[0].rise_at,
        NODE_CAPACITY + 1,
        "{memory_bands:?}"
    );
    harness.node.0.borrow_mut().page_cache = 0;
    let evaluation = harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        evaluation.action,
        Action::AwaitChange,
        "back below the band"
    );
}

#[tokio::test(start_paused = true)]
async fn in_poll_mode_the_timer_is_the_only_trigger() {
    let mut harness = Harness::new(HarnessOptions {
        outside_pods: outside(0, 150),
        kernel: false,
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().page_cache = 100 * MIB;
    let evaluation = harness.evictor.evaluate(wake(&harness));
    assert_eq!(evaluation.action, Action::AwaitChange);
}

#[tokio::test(start_paused = true)]
async fn a_hard_pid_threshold_does_not_wait_behind_a_soft_memory_eviction() {
    let hog = PodSnapshot {
        termination_grace_period_seconds: Some(30),
        ..pod("hog", 300)
    };
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig {
            max_pod_grace_period: Duration::from_secs(30),
            ..EvictionConfig::of(vec![
                Threshold::hard(Signal::PidAvailable, tasks(100)),
                soft_memory_available(400, SECOND),
            ])
        },
        pods: vec![hog, pod("forker", 10)],
        outside_pods: outside(310, 300),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().pid_max = 1000;
    harness.evictor.evaluate(wake(&harness));
    tokio::time::advance(Duration::from_secs(1)).await;
    harness.evictor.evaluate(wake(&harness));
    let waiting =
        tokio::time::timeout(Duration::from_millis(1), harness.evictor.next_ended()).await;
    assert!(waiting.is_err(), "the hog waits out its 30 s grace period");
    // The forker now holds 900 tasks: 910 of 1000 in use.
    harness.node.0.borrow_mut().pods[1].usage.pids = 900;
    harness.evictor.evaluate(wake(&harness));
    let (id, ended) = harness.evictor.next_ended().await;
    harness.evictor.end(id, ended);
    assert_eq!(killed(&harness), [cgroup("hog"), cgroup("forker")]);
    assert_eq!(
        harness.node.0.borrow().pods.len(),
        1,
        "the forker is gone, the hog still in its grace"
    );
}

#[tokio::test(start_paused = true)]
async fn an_evict_set_without_a_covering_set_is_capped_by_the_budget() {
    let pods = (0..8).map(|i| pod(&format!("p{i}"), 1)).collect();
    let mut harness = Harness::new(HarnessOptions {
        pods,
        outside_pods: NODE_CAPACITY - 60 * MIB,
        budget: "3/1m".parse().unwrap(),
        ..HarnessOptions::default()
    });
    harness.evictor.options.policy = VictimPolicy::CoveringSet;
    harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        harness.evictor.evictions_running(),
        3,
        "not all eight at once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_memory_decision_reads_exactly_only_the_pods_it_turns_on() {
    // 200 pods, each holding 1 MiB and 1 MiB of page cache, and a hog.
    let mut pods: Vec<PodSnapshot> = (0..200).map(|i| pod(&format!("p{i:03}"), 1)).collect();
    pods.push(pod("hog", 300));
    let mut harness = Harness::new(HarnessOptions {
        pods,
        outside_pods: outside(500, 50),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().pod_page_cache = MIB;
    let (log, _guard) = LogCapture::start();
    harness.evictor.evaluate(wake(&harness));
    let refined = harness.node.0.borrow().refined;
    assert_eq!(refined, 1, "the hog alone, not all 201");
    let decided = log
        .lines()
        .into_iter()
        .find(|line| line.contains("eviction decided"))
        .unwrap();
    assert!(decided.contains("victim=default/hog"), "{decided}");
    // Exact numbers in the log: 300 MiB of working set, not 301 charged.
    assert!(decided.contains("victim_usage=314572800"), "{decided}");
    // And where the decision's time went, with the one exact read.
    for phase in [
        "woken_to_run_us=",
        "observe_us=",
        "list_us=",
        "rank_us=",
        "exact_read_us=",
        "run_on_cpu_us=",
        "run_off_cpu_us=",
        "run_preempted=",
        "run_blocked=",
    ] {
        assert!(decided.contains(phase), "{phase} in {decided}");
    }
    assert!(decided.contains("exact_reads=1"), "{decided}");
}

#[tokio::test(start_paused = true)]
async fn near_ties_fall_back_to_reading_every_pod_at_once() {
    // Every pod looks bigger than it is by its page cache: reading them one
    // by one would move each below the next, so past a few all are read.
    let pods = (0..50)
        .map(|i| pod(&format!("p{i:02}"), 10 + i % 3))
        .collect();
    let mut harness = Harness::new(HarnessOptions {
        pods,
        outside_pods: outside(550, 50),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().pod_page_cache = 5 * MIB;
    harness.evictor.evaluate(wake(&harness));
    let (listings, refined) = {
        let model = harness.node.0.borrow();
        (model.listings, model.refined)
    };
    assert_eq!(refined, MAX_SINGLE_READS);
    assert_eq!(
        listings, 2,
        "the cheap listing, then every pod read at once"
    );
    let (id, ended) = harness.evictor.next_ended().await;
    harness.evictor.end(id, ended);
    let victim = killed(&harness);
    assert!(
        victim[0].ends_with("p02"),
        "the largest (12 MiB) first of those tied: {victim:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_precise_hooks_come_near_the_line_and_go_while_the_victims_memory_returns() {
    use crate::scopes::zone::{ArmReason, FarTrigger, ZoneOptions};
    let zone = ZoneOptions::new(
        FarTrigger::AdaptiveRead {
            max_period: Duration::from_secs(1),
        },
        true,
    );
    // 500 MiB available: 400 MiB below the 100Mi line's 924 MiB of usage.
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("web", 100), pod("hog", 100)],
        outside_pods: outside(200, 500),
        zone: Some(zone),
        ..HarnessOptions::default()
    });
    let plan = |evaluation: &Evaluation| evaluation.precise.clone().expect("a plan");
    let set_hog = |harness: &Harness, mib: u64| {
        harness.node.0.borrow_mut().pods[1]
            .usage
            .memory_working_set_bytes = mib * MIB;
    };

    let far = harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        (plan(&far).armed, plan(&far).reason),
        (false, ArmReason::Far)
    );
    let read_after = plan(&far).read_after.expect("v2: the adaptive read");
    assert_eq!(far.action, Action::Requeue(read_after));

    // 40 MiB below the line: inside the 64 MiB zone.
    set_hog(&harness, 460);
    let near = harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        (plan(&near).armed, plan(&near).reason),
        (true, ArmReason::Near)
    );
    assert_eq!(plan(&near).read_after, None);

    // Past it: the decision's kill takes the hooks off at once.
    set_hog(&harness, 550);
    let decided = harness.evictor.evaluate(wake(&harness));
    assert_eq!(harness.evictor.evictions_running(), 1);
    assert_eq!(
        (plan(&decided).armed, plan(&decided).reason),
        (false, ArmReason::Reclaim)
    );

    // The hog's memory is back, far below the line: they stay off.
    let last = harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness), [cgroup("hog")]);
    assert_eq!(
        (plan(&last).armed, plan(&last).reason),
        (false, ArmReason::Far)
    );
}

/// A nodefs of 1000 MiB with `free_mib` available.
fn nodefs(free_mib: u64) -> crate::decide::snapshot::FsStats {
    crate::decide::snapshot::FsStats {
        capacity_bytes: 1000 * MIB,
        available_bytes: free_mib * MIB,
        inodes: 1_000_000,
        inodes_free: 900_000,
        device: Some(1),
    }
}

/// A pod holding `mib` MiB of memory and `disk_mib` MiB in its writable
/// layer.
fn writer(name: &str, mib: u64, disk_mib: u64) -> PodSnapshot {
    let mut pod = pod(name, mib);
    pod.usage.rootfs_bytes = disk_mib * MIB;
    pod
}

/// A node short of nodefs under `eviction`'s thresholds, `memory_free_mib`
/// MiB of memory available: `filler` fills the disk, `big-memory` holds
/// the most memory.
fn disk_node_harness(eviction: EvictionConfig, memory_free_mib: u64) -> Harness {
    let harness = Harness::new(HarnessOptions {
        eviction,
        pods: vec![writer("filler", 10, 400), writer("big-memory", 500, 1)],
        outside_pods: outside(510, memory_free_mib),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().nodefs = Some(nodefs(50));
    harness
}

/// nodefs.available<100Mi.
fn nodefs_threshold() -> Threshold {
    Threshold::hard(Signal::NodeFsAvailable, mib(100))
}

fn disk_harness() -> Harness {
    disk_node_harness(EvictionConfig::of(vec![nodefs_threshold()]), 400)
}

/// [`disk_harness`]'s node short of memory too: the pod holding the most
/// memory is the memory victim.
fn disk_and_memory_harness() -> Harness {
    disk_node_harness(
        EvictionConfig::of(hard_memory_then([nodefs_threshold()])),
        20,
    )
}

#[tokio::test(start_paused = true)]
async fn under_disk_pressure_node_reclaim_goes_first_and_then_the_biggest_disk_user() {
    let mut harness = disk_harness();
    harness.node.0.borrow_mut().reclaim = Some(NodeReclaim::Pending);
    let waiting = harness.evictor.evaluate(wake(&harness));
    assert_eq!(waiting.action, Action::Requeue(DISK_USAGE_WAIT));
    assert!(
        killed(&harness).is_empty(),
        "nobody goes before the reclaim"
    );
    assert_eq!(
        harness.node.0.borrow().reclaims,
        [crate::decide::thresholds::Signal::NodeFsAvailable]
    );
    // Reclaimed, looked at again, still short: the pod filling the disk
    // goes, not the one holding the most memory.
    harness.node.0.borrow_mut().reclaim = Some(NodeReclaim::Done);
    harness.evictor.evaluate(wake(&harness));
    harness.evictor.next_ended().await;
    assert_eq!(killed(&harness), [cgroup("filler")]);
}

/// [`disk_harness`] with a soft memory threshold too, its grace period a
/// minute.
fn disk_and_soft_memory_harness() -> Harness {
    let eviction = EvictionConfig::of(vec![
        nodefs_threshold(),
        soft_memory_available(100, Duration::from_secs(60)),
    ]);
    disk_node_harness(eviction, 400)
}

/// kubelet's `reclaimNodeLevelResources`: once the node's reclaim for
/// nodefs is done, every threshold is held to its minimum reclaim on the
/// node as it is then. All fine: nobody goes. nodefs fine but memory short
/// (a soft threshold inside its grace period): kubelet still evicts in that
/// round, the pod ranked for nodefs.
#[tokio::test(start_paused = true)]
async fn after_node_reclaim_every_threshold_is_looked_at_again() {
    for (memory_free_mib, victims) in [(400, vec![]), (50, vec![cgroup("filler")])] {
        let mut harness = disk_and_soft_memory_harness();
        harness.node.0.borrow_mut().reclaim = Some(NodeReclaim::Pending);
        harness.evictor.evaluate(wake(&harness));
        assert!(killed(&harness).is_empty(), "nobody before the reclaim");
        {
            let mut model = harness.node.0.borrow_mut();
            model.nodefs = Some(nodefs(500));
            model.outside_pods = outside(510, memory_free_mib);
            model.reclaim = Some(NodeReclaim::Done);
        }
        let (log, _guard) = LogCapture::start();
        harness.settle(wake(&harness)).await;
        assert_eq!(killed(&harness), victims, "{memory_free_mib} MiB free");
        let relieved = log
            .lines()
            .iter()
            .any(|line| line.contains("node-level reclaim brought every threshold back"));
        assert_eq!(relieved, victims.is_empty(), "{:?}", log.lines());
    }
}

/// One signal's reclaim at a time, as kubelet reclaims for one threshold
/// per round: a second disk threshold waits for the first's.
#[tokio::test(start_paused = true)]
async fn one_disk_signal_is_reclaimed_for_at_a_time() {
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig::of(vec![
            nodefs_threshold(),
            Threshold::hard(Signal::NodeFsInodesFree, ThresholdValue::Quantity(1000)),
        ]),
        pods: vec![writer("filler", 10, 400)],
        outside_pods: outside(10, 400),
        ..HarnessOptions::default()
    });
    let mut starved = nodefs(50);
    starved.inodes_free = 10;
    harness.node.0.borrow_mut().nodefs = Some(starved);
    harness.node.0.borrow_mut().reclaim = Some(NodeReclaim::Pending);
    harness.evictor.evaluate(wake(&harness));
    harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        harness.node.0.borrow().reclaims,
        [Signal::NodeFsAvailable, Signal::NodeFsAvailable]
    );
}

#[tokio::test(start_paused = true)]
async fn a_disk_decision_waits_for_the_pods_disk_usage_without_holding_up_memory() {
    let mut harness = disk_harness();
    harness.node.0.borrow_mut().disk_usage_pending = Some(DISK_USAGE_WAIT);
    let waiting = harness.evictor.evaluate(wake(&harness));
    assert_eq!(waiting.action, Action::Requeue(DISK_USAGE_WAIT));
    assert!(killed(&harness).is_empty(), "not ranked on no disk usage");

    // The same node also short of memory: decided at once.
    let mut harness = disk_and_memory_harness();
    harness.node.0.borrow_mut().disk_usage_pending = Some(DISK_USAGE_WAIT);
    harness.evictor.evaluate(wake(&harness));
    harness.evictor.next_ended().await;
    assert_eq!(killed(&harness), [cgroup("big-memory")]);
}

#[tokio::test(start_paused = true)]
async fn with_the_runtime_down_a_disk_decision_is_held_and_memory_still_decided() {
    // Disk alone: nobody is ranked on no disk usage; looked at again soon.
    let mut harness = disk_harness();
    harness.node.0.borrow_mut().disk_usage_unknown = true;
    let waiting = harness.evictor.evaluate(wake(&harness));
    assert_eq!(waiting.action, Action::Requeue(DISK_UNKNOWN_WAIT));
    assert!(killed(&harness).is_empty(), "not ranked on no disk usage");
    assert_eq!(
        harness
            .evictor
            .metrics()
            .evictions_held
            .with_label_values(&["disk-usage-unknown"])
            .get(),
        1
    );

    // Short of memory too: the memory decision is not held behind it.
    let mut harness = disk_and_memory_harness();
    harness.node.0.borrow_mut().disk_usage_unknown = true;
    harness.evictor.evaluate(wake(&harness));
    harness.evictor.next_ended().await;
    assert_eq!(killed(&harness), [cgroup("big-memory")]);
}

/// A pod `name` whose `scratch` emptyDir has a 4Mi `sizeLimit`, and the
/// runtime's reading of its disk: `used_mib` MiB in the emptyDir.
fn scratch_writer(name: &str, used_mib: u64) -> (PodSnapshot, PodDiskUsage) {
    let mut pod = pod(name, 10);
    pod.empty_dirs = vec![EmptyDirVolume {
        name: "scratch".into(),
        size_limit: Some("4Mi".parse().unwrap()),
    }];
    let usage = PodDiskUsage {
        volumes: vec![VolumeUsage {
            name: "scratch".into(),
            plugin: "kubernetes.io~empty-dir".into(),
            usage: FsUsage {
                bytes: used_mib * MIB,
                inodes: 1,
            },
        }],
        ..PodDiskUsage::default()
    };
    (pod, usage)
}

/// A node under no pressure running `writers` and `calm` (which sets no
/// limit), with the API knowing them all.
fn limits_harness(writers: Vec<(PodSnapshot, PodDiskUsage)>, dry_run: bool) -> (Harness, FakeApi) {
    let mut pods = vec![pod("calm", 500)];
    let mut disk = BTreeMap::new();
    for (pod, usage) in writers {
        disk.insert(pod.uid.clone(), usage);
        pods.push(pod);
    }
    let api = FakeApi::evicting(&pods, EvictOutcome::Evicted);
    let harness = Harness::new(HarnessOptions {
        pods,
        outside_pods: outside(500, 400),
        api: Some(api.clone()),
        dry_run,
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().pod_disk = disk;
    (harness, api)
}

#[tokio::test(start_paused = true)]
async fn a_pod_over_its_empty_dir_limit_is_killed_at_once_with_kubelets_message_without_pressure() {
    let (mut harness, api) = limits_harness(
        vec![scratch_writer("over", 8), scratch_writer("within", 2)],
        false,
    );
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness), [cgroup("over")], "only the pod over it");
    let reports = api.0.borrow().reports.clone();
    assert_eq!(reports.len(), 1);
    assert!(reports[0].pod_limit, "no node event: no threshold was met");
    assert_eq!(
        reports[0].message.text,
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"4Mi\". "
    );
    // kubelet adds no annotation to these; evictd adds its kill reason.
    assert_eq!(
        reports[0].message.annotations,
        BTreeMap::from([(KILL_REASON_KEY.to_owned(), "pod-limit".to_owned())])
    );
    let counted = harness
        .metrics
        .evictions
        .with_label_values(&["emptydirfs.limit", "BestEffort", "pod-limit"])
        .get();
    assert_eq!(counted, 1);

    // Held to their limits every 10 s, not on every wake-up.
    let checks = harness.node.0.borrow().local_storage_checks;
    harness.evictor.evaluate(wake(&harness));
    assert_eq!(harness.node.0.borrow().local_storage_checks, checks);
    tokio::time::advance(Duration::from_secs(10)).await;
    harness.evictor.evaluate(wake(&harness));
    assert_eq!(harness.node.0.borrow().local_storage_checks, checks + 1);
    assert_eq!(killed(&harness).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn local_storage_limits_wait_for_the_runtimes_reading_and_spare_what_must_not_die() {
    let mut critical = scratch_writer("critical", 8);
    critical.0.priority = 2_000_000_000;
    let (mut harness, _api) = limits_harness(vec![scratch_writer("over", 8), critical], false);
    harness.node.0.borrow_mut().disk_usage_pending = Some(DISK_USAGE_WAIT);
    let waiting = harness.evictor.evaluate(wake(&harness));
    assert_eq!(waiting.action, Action::Requeue(DISK_USAGE_WAIT));
    assert!(killed(&harness).is_empty(), "nobody judged on no reading");
    // A reading long under way: looked for when the runtime's thread says
    // (once a second), not every 100 ms.
    harness.node.0.borrow_mut().disk_usage_pending = Some(Duration::from_secs(1));
    let waiting = harness.evictor.evaluate(wake(&harness));
    assert_eq!(waiting.action, Action::Requeue(Duration::from_secs(1)));

    // The runtime down: still nobody, and no hurry.
    {
        let mut model = harness.node.0.borrow_mut();
        model.disk_usage_pending = None;
        model.disk_usage_unknown = true;
    }
    let held = harness.evictor.evaluate(wake(&harness));
    assert_eq!(held.action, Action::AwaitChange);
    assert!(killed(&harness).is_empty());

    let (log, _guard) = LogCapture::start();
    harness.node.0.borrow_mut().disk_usage_unknown = false;
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(10)).await;
        harness.settle(wake(&harness)).await;
    }
    assert_eq!(killed(&harness), [cgroup("over")], "the critical pod lives");
    let spared = log
        .lines()
        .iter()
        .filter(|line| line.contains("over its local-storage limit, but a critical pod"))
        .count();
    assert_eq!(spared, 1, "said once: {:?}", log.lines());
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_tells_of_a_pod_over_its_limit_once_and_kills_nothing() {
    let (mut harness, _api) = limits_harness(vec![scratch_writer("over", 8)], true);
    let (log, _guard) = LogCapture::start();
    for _ in 0..3 {
        harness.settle(wake(&harness)).await;
        tokio::time::advance(Duration::from_secs(10)).await;
    }
    assert!(killed(&harness).is_empty());
    let decided = log
        .lines()
        .iter()
        .filter(|line| line.contains("eviction decided") && line.contains("emptydirfs.limit"))
        .count();
    assert_eq!(decided, 1, "{:?}", log.lines());
}

/// kubelet's synchronize returns once it evicted for local storage: no
/// threshold is decided in that round; the next one, at once, decides the
/// memory threshold. The pod over its limit gets kubelet's one second
/// (`immediateEvictionGracePeriodSeconds`), so its containers see SIGTERM.
#[tokio::test(start_paused = true)]
async fn a_local_storage_eviction_ends_the_round_with_a_seconds_grace() {
    let (mut harness, _api) = limits_harness(vec![scratch_writer("over", 8)], false);
    // Short of memory too: `calm` (500 MiB) is the memory victim.
    harness.node.0.borrow_mut().outside_pods = outside(510, 50);
    let first = harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        harness.evictor.evictions_running(),
        1,
        "no threshold this round"
    );
    assert_eq!(first.action, Action::Requeue(CLOSE_WATCH_INTERVAL));
    harness.evictor.evaluate(wake(&harness));
    assert_eq!(harness.evictor.evictions_running(), 2);
    while harness.evictor.evictions_running() > 0 {
        let (id, ended) = harness.evictor.next_ended().await;
        harness.evictor.end(id, ended);
    }
    let mut graces: Vec<(String, Duration)> = killed(&harness)
        .into_iter()
        .zip(harness.killer.graces.borrow().iter().copied())
        .collect();
    graces.sort();
    assert_eq!(
        graces,
        [
            (cgroup("calm"), Duration::ZERO),
            (cgroup("over"), IMMEDIATE_EVICTION_GRACE_PERIOD),
        ],
        "a hard threshold's kill has none, as documented"
    );
}

#[test]
fn a_victim_slow_to_give_its_memory_back_is_looked_at_less_and_less_often() {
    let first = eviction::memory_poll_interval(Duration::ZERO);
    assert_eq!(first, Duration::from_millis(5));
    let mut elapsed = Duration::ZERO;
    let mut looks = 0;
    // The 7.2 guest's slowest: 6 s from the SIGKILL to the memory back.
    while elapsed < Duration::from_secs(6) {
        let next = eviction::memory_poll_interval(elapsed);
        assert!(
            next <= (elapsed / 10).max(first),
            "a look {next:?} after {elapsed:?} delays the next decision by more than a tenth"
        );
        elapsed += next;
        looks += 1;
    }
    // Ten in the first 50 ms, then each a tenth later than the last: 61.
    // A fixed 5 ms: 1,200 whole engine runs.
    assert!(looks <= 64, "{looks} engine runs");
}

/// Lines of `log` with `message` and the field `key` equal to `value`
/// (quoted, as a string is written, or not).
fn lines_with(log: &LogCapture, message: &str, key: &str, value: &str) -> usize {
    let quoted = format!("{key}=\"{value}\"");
    let bare = format!("{key}={value}");
    log.lines()
        .iter()
        .filter(|line| line.contains(message))
        .filter(|line| {
            line.split_whitespace()
                .any(|field| field == quoted || field == bare)
        })
        .count()
}

/// A pod of `pids` tasks forking `per_second` times a second.
fn forking(name: &str, pids: u64, per_second: f64) -> PodSnapshot {
    let mut pod = pod(name, 10);
    pod.usage.pids = pids;
    pod.usage.forks_per_second = Some(ForkRate::try_from(per_second).unwrap());
    pod
}

#[rstest::rstest]
#[case::kubelets_ranking_takes_the_quiet_pod_for_the_threshold(
    PidRanking::Kubelet,
    "db",
    "threshold"
)]
#[case::the_fork_rate_takes_the_bomb_and_says_so(PidRanking::ForkRate, "bomb", "fork-rate")]
#[tokio::test(start_paused = true)]
async fn the_kill_reason_goes_from_the_decision_to_its_log_metric_and_event(
    #[case] pid_ranking: PidRanking,
    #[case] victim: &str,
    #[case] reason: &str,
) {
    let pods = vec![forking("db", 500, 0.0), forking("bomb", 420, 400.0)];
    let api = FakeApi::evicting(&pods, EvictOutcome::Evicted);
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig::of(vec![Threshold::hard(Signal::PidAvailable, tasks(100))]),
        pods,
        api: Some(api.clone()),
        pid_ranking,
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().pid_max = 1000;
    let (log, _guard) = LogCapture::start();
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness), [cgroup(victim)]);
    let key = format!("default/{victim}");
    assert_eq!(lines_with(&log, "eviction decided", "reason", reason), 1);
    assert_eq!(lines_with(&log, "pod killed", "victim", &key), 1);
    assert_eq!(lines_with(&log, "pod killed", "reason", reason), 1);
    let counted = harness
        .metrics
        .evictions
        .with_label_values(&["pid.available", "BestEffort", reason])
        .get();
    assert_eq!(counted, 1);
    let reports = api.0.borrow().reports.clone();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].message.annotations[KILL_REASON_KEY], reason);
}

/// A hook that cannot run: its run fails at once, whatever the clock.
fn missing_hook(dir: &std::path::Path) -> PreKillHook {
    PreKillHook {
        target: HookTarget::Command(dir.join("missing-hook")),
        timeout: Duration::from_secs(2),
    }
}

#[tokio::test(start_paused = true)]
async fn a_hook_that_fails_is_logged_and_counted_and_the_soft_eviction_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let hog = PodSnapshot {
        termination_grace_period_seconds: Some(10),
        ..pod("hog", 300)
    };
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig {
            max_pod_grace_period: Duration::from_secs(10),
            ..EvictionConfig::of(vec![soft_memory_available(100, SECOND)])
        },
        pods: vec![hog],
        outside_pods: outside(300, 50),
        pre_kill: Some(missing_hook(dir.path())),
        ..HarnessOptions::default()
    });
    let (log, _guard) = LogCapture::start();
    harness.evictor.evaluate(wake(&harness));
    tokio::time::advance(Duration::from_secs(1)).await;
    harness.settle(wake(&harness)).await;
    assert_eq!(
        *harness.killer.graces.borrow(),
        [Duration::from_secs(10)],
        "a hook that failed at once took nothing from the grace period"
    );
    assert_eq!(killed(&harness), [cgroup("hog")]);
    assert_eq!(
        lines_with(
            &log,
            "pre-kill hook failed; the eviction goes on",
            "victim",
            "default/hog"
        ),
        1,
        "{:?}",
        log.lines()
    );
    let hooks = |outcome: &str| {
        harness
            .metrics
            .pre_kill_hooks
            .with_label_values(&[outcome])
            .get()
    };
    assert_eq!(hooks("failed"), 1);
    assert_eq!(hooks("skipped"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_hard_eviction_runs_no_hook() {
    let dir = tempfile::tempdir().unwrap();
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("hog", 300)],
        outside_pods: outside(300, 50),
        pre_kill: Some(missing_hook(dir.path())),
        ..HarnessOptions::default()
    });
    let (log, _guard) = LogCapture::start();
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness), [cgroup("hog")]);
    assert!(
        log.lines()
            .iter()
            .all(|line| !line.contains("pre-kill hook"))
    );
    let skipped = harness
        .metrics
        .pre_kill_hooks
        .with_label_values(&["skipped"])
        .get();
    assert_eq!(skipped, 1);
}

#[tokio::test(start_paused = true)]
async fn a_pod_killed_for_memory_gives_back_its_tasks_before_pid_pressure_takes_another() {
    // A fork bomb holding memory and tasks: killed for memory (hard) while
    // pid.available waits out its soft grace period.
    let mut bomb = pod("bomb", 300);
    bomb.usage.pids = 900;
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig::of(hard_memory_then([Threshold::soft(
            Signal::PidAvailable,
            tasks(100),
            SECOND,
        )])),
        pods: vec![bomb, pod("web", 10)],
        outside_pods: outside(310, 50),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().pid_max = 1000;
    let (log, _guard) = LogCapture::start();
    harness.evictor.evaluate(wake(&harness));
    assert_eq!(harness.evictor.evictions_running(), 1, "{:?}", log.lines());
    let (id, ended) = harness.evictor.next_ended().await;
    // Its exited children are charged to it, and to the node, until they
    // are reaped: pid.available is still past its line.
    harness
        .node
        .0
        .borrow_mut()
        .unreaped
        .insert(cgroup("bomb"), 900);
    harness.evictor.end(id, ended);
    tokio::time::advance(Duration::from_secs(2)).await;
    harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        harness.evictor.evictions_running(),
        0,
        "web is not taken for the bomb's unreaped tasks"
    );
    harness.node.0.borrow_mut().unreaped.clear();
    harness.settle(wake(&harness)).await;
    assert_eq!(killed(&harness), [cgroup("bomb")], "web lives");
}

#[tokio::test(start_paused = true)]
async fn a_soft_decision_waits_for_an_eviction_under_way_for_another_resource() {
    // A fork bomb holding memory and tasks, given 30 s to go: its soft
    // memory eviction is under way when pid.available's grace ends.
    let mut bomb = PodSnapshot {
        termination_grace_period_seconds: Some(30),
        ..pod("bomb", 300)
    };
    bomb.usage.pids = 900;
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionConfig {
            max_pod_grace_period: Duration::from_secs(30),
            // No --eviction-hard: kubelet's default hard thresholds.
            ..EvictionConfig::of(hard_memory_then([
                Threshold::hard(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1)),
                Threshold::hard(Signal::NodeFsInodesFree, ThresholdValue::Percentage(0.05)),
                Threshold::hard(Signal::ImageFsAvailable, ThresholdValue::Percentage(0.15)),
                Threshold::hard(Signal::ImageFsInodesFree, ThresholdValue::Percentage(0.05)),
                soft_memory_available(100, SECOND),
                Threshold::soft(Signal::PidAvailable, tasks(100), 2 * SECOND),
            ]))
        },
        pods: vec![bomb, pod("web", 10)],
        outside_pods: outside(310, 50),
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().pid_max = 1000;
    harness.evictor.evaluate(wake(&harness));
    tokio::time::advance(Duration::from_secs(1)).await;
    harness.evictor.evaluate(wake(&harness));
    assert_eq!(harness.evictor.evictions_running(), 1);
    // Its processes exiting: the pod lists none, the node still counts
    // them until they are reaped.
    {
        let mut node = harness.node.0.borrow_mut();
        node.pods[0].usage.pids = 0;
        node.unreaped.insert(cgroup("bomb"), 900);
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    harness.evictor.evaluate(wake(&harness));
    assert_eq!(
        harness.evictor.evictions_running(),
        1,
        "web is not taken while the bomb's eviction is under way"
    );
}

/// Pod `name` found thrashing at a 256 MiB limit over a 10 s window.
fn thrashing(name: &str) -> (String, crate::decide::thrashing::Thrashing) {
    let found = crate::decide::thrashing::Thrashing {
        window: Duration::from_secs(10),
        refaulted_percent: 480,
        stalled_percent: None,
        usage_bytes: 256 * MIB,
        limit_bytes: 256 * MIB,
    };
    (format!("uid-{name}"), found)
}

#[tokio::test(start_paused = true)]
async fn a_pod_thrashing_at_its_limit_is_told_once_and_evicted_only_with_the_option() {
    for eviction in [false, true] {
        let pods = vec![pod("thrash", 256), pod("calm", 300)];
        let api = FakeApi::evicting(&pods, EvictOutcome::Evicted);
        api.0.borrow_mut().action = EvictionAction::Status;
        let mut harness = Harness::new(HarnessOptions {
            pods,
            // Far from memory.available's line: no threshold is met.
            outside_pods: outside(556, 400),
            api: Some(api.clone()),
            thrashing_eviction: eviction,
            ..HarnessOptions::default()
        });
        let (log, _guard) = LogCapture::start();
        for _ in 0..2 {
            harness.node.0.borrow_mut().thrashing = Some(vec![thrashing("thrash")]);
            harness.evictor.read_memory_stalls(&wake(&harness));
            harness.settle(wake(&harness)).await;
        }
        let told = log
            .lines()
            .iter()
            .filter(|line| line.contains("pod thrashing at its memory limit"))
            .count();
        let counted = harness
            .metrics
            .evictions
            .with_label_values(&["memory.available", "BestEffort", "thrashing"])
            .get();
        if !eviction {
            assert!(
                killed(&harness).is_empty(),
                "kubelet evicts for no such thing"
            );
            assert_eq!(told, 1, "said once while it thrashes: {:?}", log.lines());
            assert_eq!(counted, 0);
            continue;
        }
        assert_eq!(killed(&harness), [cgroup("thrash")], "it alone");
        assert_eq!(
            harness.killer.graces.borrow()[0],
            DEFAULT_TERMINATION_GRACE_PERIOD.min(harness.evictor.config.max_pod_grace_period),
            "a soft eviction's grace"
        );
        assert_eq!(counted, 1);
        let reports = api.0.borrow().reports.clone();
        assert_eq!(reports.len(), 1);
        assert!(reports[0].pod_limit, "no node event: no threshold was met");
        assert!(
            reports[0]
                .message
                .text
                .starts_with("Pod was thrashing at its memory limit: charged 256Mi of 256Mi"),
            "{}",
            reports[0].message.text
        );
        assert_eq!(
            reports[0]
                .message
                .annotations
                .get(KILL_REASON_KEY)
                .map(String::as_str),
            Some("thrashing")
        );
    }
}

/// A KEP-5986 finding for pod `name`.
fn container_pressure(name: &str, step: crate::decide::memory_high::Step) -> (String, PodFinding) {
    let finding = PodFinding {
        pod_cgroup: cgroup(name),
        step,
        description: "app: memory.high hit 0.0/s, memory.max hit 40.0/s".to_owned(),
    };
    (format!("uid-{name}"), finding)
}

#[tokio::test(start_paused = true)]
async fn container_pressure_relaxes_memory_high_and_evicts_one_pod_in_the_keps_order() {
    use crate::decide::memory_high::Step;
    let evict = |worst_ratio| Step::Evict { worst_ratio };
    let with_qos = |mut pod: PodSnapshot, qos| {
        pod.cgroup_qos = Some(qos);
        pod
    };
    let pods = vec![
        pod("mild", 50),
        pod("hot", 50),
        with_qos(pod("burstable", 50), QosClass::Burstable),
        with_qos(pod("guaranteed", 50), QosClass::Guaranteed),
        pod("throttled", 50),
    ];
    let api = FakeApi::evicting(&pods, EvictOutcome::Evicted);
    api.0.borrow_mut().action = EvictionAction::Status;
    let mut harness = Harness::new(HarnessOptions {
        pods,
        outside_pods: outside(250, 400),
        api: Some(api.clone()),
        ..HarnessOptions::default()
    });
    let (log, _guard) = LogCapture::start();
    harness.node.0.borrow_mut().container_pressure = Some(vec![
        container_pressure("burstable", evict(50.0)),
        container_pressure("mild", evict(2.0)),
        container_pressure("guaranteed", evict(90.0)),
        container_pressure("hot", evict(9.0)),
        container_pressure("throttled", Step::Relax(vec!["app".to_owned()])),
    ]);
    harness.evictor.read_memory_stalls(&wake(&harness));
    harness.settle(wake(&harness)).await;
    assert_eq!(
        harness.node.0.borrow().relaxed,
        [format!("{}/app", cgroup("throttled"))]
    );
    // BestEffort before Burstable whatever the ratio, then the ratio; one
    // pod a reading; a Guaranteed pod never.
    assert_eq!(killed(&harness), [cgroup("hot")]);
    let counted = |labels: &[&str]| harness.metrics.evictions.with_label_values(labels).get();
    assert_eq!(
        counted(&[
            "memory.high.pressure",
            "BestEffort",
            "container-memory-pressure"
        ]),
        1
    );
    assert_eq!(
        harness
            .metrics
            .memory_high_relaxations
            .with_label_values(&["relaxed"])
            .get(),
        1
    );
    let warnings = api.0.borrow().warnings.clone();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        (warnings[0].name.as_str(), warnings[0].reason),
        ("throttled", "MemoryHighRelaxed")
    );
    assert!(
        warnings[0]
            .message
            .starts_with("Container app was throttled at its memory.high"),
        "{}",
        warnings[0].message
    );
    let reports = api.0.borrow().reports.clone();
    assert_eq!(reports.len(), 1);
    assert_eq!(
        reports[0].message.text,
        "The pod's containers stayed under memory pressure past the 30s grace period: app: memory.high hit 0.0/s, memory.max hit 40.0/s. "
    );
    assert_eq!(
        reports[0]
            .message
            .annotations
            .get(KILL_REASON_KEY)
            .map(String::as_str),
        Some("container-memory-pressure")
    );
    // The exempt pod is said to be past the grace once while it lasts.
    harness.node.0.borrow_mut().container_pressure =
        Some(vec![container_pressure("guaranteed", evict(90.0))]);
    harness.evictor.read_memory_stalls(&wake(&harness));
    let exempt = log
        .lines()
        .iter()
        .filter(|line| line.contains("the pod is exempt"))
        .count();
    assert_eq!(exempt, 1, "{:?}", log.lines());
    assert_eq!(killed(&harness), [cgroup("hot")]);

    // Stage 1 set the relaxed pod's condition; its end clears it, and a pod
    // that never reached stage 1 has none to clear.
    harness.node.0.borrow_mut().container_pressure = Some(vec![
        container_pressure("throttled", Step::Recovered),
        container_pressure("mild", Step::Recovered),
    ]);
    harness.evictor.read_memory_stalls(&wake(&harness));
    let conditions: Vec<_> = api
        .0
        .borrow()
        .conditions
        .iter()
        .map(|condition| (condition.name.clone(), condition.under_pressure))
        .collect();
    assert_eq!(
        conditions,
        [
            ("throttled".to_owned(), true),
            ("throttled".to_owned(), false)
        ]
    );
    assert!(
        api.0.borrow().conditions[0]
            .message
            .contains("evictd raised memory.high to memory.max: app to max"),
        "{:?}",
        api.0.borrow().conditions[0]
    );
    assert_eq!(killed(&harness), [cgroup("hot")]);
}
