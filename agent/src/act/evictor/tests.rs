//! The loop's decisions on fakes of its seams (node, killer, API, kernel
//! bands), with tokio's clock paused: no root, no sleeping.
use super::*;
use crate::{
    act::wake::WakeCause,
    config::EvictionArgs,
    report::kubernetes::EvictOutcome,
    testing::{
        LogCapture,
        fakes::{FakeApi, Harness, HarnessOptions, MIB, NODE_CAPACITY, pod},
    },
};

/// Working set outside the pods that leaves `free_mib` MiB available with
/// `pods_mib` held by pods.
fn outside(pods_mib: u64, free_mib: u64) -> u64 {
    NODE_CAPACITY - (pods_mib + free_mib) * MIB
}

fn wake(harness: &Harness) -> Wake {
    harness.evictor.clock().wake(WakeCause::Kernel)
}

#[tokio::test(start_paused = true)]
async fn the_biggest_hog_goes_and_the_engine_decides_again_at_once() {
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("web", 100), pod("hog", 300)],
        outside_pods: outside(400, 50),
        ..HarnessOptions::default()
    });
    let evaluation = harness.evictor.evaluate(wake(&harness)).await;
    assert_eq!(
        *harness.killer.killed.borrow(),
        ["/node/kubepods/besteffort/podhog"],
        "one victim, then the node was fine"
    );
    assert_eq!(evaluation.action, Action::AwaitChange);
    assert_eq!(
        harness.node.0.borrow().observations,
        2,
        "one observation before the kill, one after"
    );
}

#[tokio::test(start_paused = true)]
async fn one_wake_up_evicts_at_most_the_round_limit() {
    // The pressure is outside the pods: every kill gives back 1 MiB.
    let pods = (0..MAX_ROUNDS_PER_WAKE + 4)
        .map(|i| pod(&format!("p{i}"), 1))
        .collect();
    let mut harness = Harness::new(HarnessOptions {
        pods,
        outside_pods: NODE_CAPACITY - 10 * MIB,
        ..HarnessOptions::default()
    });
    let (log, _guard) = LogCapture::start();
    let evaluation = harness.evictor.evaluate(wake(&harness)).await;
    assert_eq!(harness.killer.killed.borrow().len(), MAX_ROUNDS_PER_WAKE);
    assert_eq!(evaluation.action, Action::Requeue(CLOSE_WATCH_INTERVAL));
    assert!(log.contains("still under pressure after the maximum evictions for one trigger"));
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
        let evaluation = harness.evictor.evaluate(wake(&harness)).await;
        assert_eq!(evaluation.action, Action::Requeue(CLOSE_WATCH_INTERVAL));
    }
    let decided = log
        .lines()
        .iter()
        .filter(|line| line.contains("eviction decided"))
        .count();
    assert_eq!(decided, 1, "{:?}", log.lines());
    assert!(harness.killer.killed.borrow().is_empty(), "dry run");
    let evictions = harness
        .metrics
        .evictions
        .with_label_values(&["memory.available", "BestEffort"])
        .get();
    assert_eq!(evictions, 1);
}

/// A hog past a soft memory.available<100Mi whose 1s grace period has
/// passed, with an API that answers evictions with `answer`.
async fn soft_harness(answer: EvictOutcome) -> (Harness, FakeApi) {
    let pods = vec![pod("hog", 300)];
    let api = FakeApi::evicting(&pods, answer);
    let mut harness = Harness::new(HarnessOptions {
        eviction: EvictionArgs {
            eviction_hard: vec![String::new()],
            eviction_soft: vec!["memory.available<100Mi".into()],
            eviction_soft_grace_period: vec!["memory.available=1s".into()],
            ..EvictionArgs::default()
        },
        pods,
        outside_pods: outside(300, 50),
        api: Some(api.clone()),
        ..HarnessOptions::default()
    });
    let waiting = harness.evictor.evaluate(wake(&harness)).await;
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
        harness.evictor.evaluate(wake(&harness)).await;
    }
    assert_eq!(api.0.borrow().evictions, 1, "asked once");
    assert!(harness.killer.killed.borrow().is_empty(), "no local kill");
    assert_eq!(harness.node.0.borrow().pods.len(), 1, "the pod stays");
    assert!(log.contains("the Eviction API refused the soft eviction; the pod stays"));
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_eviction_falls_back_to_the_local_kill() {
    let (mut harness, api) = soft_harness(EvictOutcome::Unanswered).await;
    harness.evictor.evaluate(wake(&harness)).await;
    assert_eq!(api.0.borrow().evictions, 1);
    assert_eq!(
        *harness.killer.killed.borrow(),
        ["/node/kubepods/besteffort/podhog"]
    );
    let reports = &api.0.borrow().reports;
    assert_eq!(reports.len(), 1, "the local kill is reported");
    assert!(!reports[0].evicted_by_api);
}

#[tokio::test(start_paused = true)]
async fn an_accepted_eviction_is_left_to_the_api() {
    let (mut harness, api) = soft_harness(EvictOutcome::Evicted).await;
    harness.evictor.evaluate(wake(&harness)).await;
    assert!(harness.killer.killed.borrow().is_empty());
    let reports = &api.0.borrow().reports;
    assert_eq!(reports.len(), 1);
    assert!(reports[0].evicted_by_api);
}

#[tokio::test(start_paused = true)]
async fn a_failed_kill_is_reported_and_the_next_run_tries_again() {
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("hog", 300)],
        outside_pods: outside(300, 50),
        ..HarnessOptions::default()
    });
    *harness.killer.fail.borrow_mut() = true;
    let (log, _guard) = LogCapture::start();
    let evaluation = harness.evictor.evaluate(wake(&harness)).await;
    assert_eq!(evaluation.action, Action::Requeue(CLOSE_WATCH_INTERVAL));
    assert!(log.contains("eviction failed"));
    let failures = harness
        .metrics
        .eviction_failures
        .with_label_values(&["memory.available"])
        .get();
    assert_eq!(failures, 1);
    *harness.killer.fail.borrow_mut() = false;
    harness.evictor.evaluate(wake(&harness)).await;
    assert!(
        harness.node.0.borrow().pods.is_empty(),
        "killed on the next run"
    );
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
    let evaluation = harness.evictor.evaluate(wake(&harness)).await;
    assert_eq!(evaluation.action, Action::Requeue(CLOSE_WATCH_INTERVAL));
    assert_eq!(
        evaluation.memcg_levels,
        Some(vec![NODE_CAPACITY]),
        "capacity − 100Mi + inactive file"
    );
    harness.node.0.borrow_mut().page_cache = 0;
    let evaluation = harness.evictor.evaluate(wake(&harness)).await;
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
    let evaluation = harness.evictor.evaluate(wake(&harness)).await;
    assert_eq!(evaluation.action, Action::AwaitChange);
}
