use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::{
    config::{EvictionArgs, PolicyArgs},
    decide::snapshot::Snapshot,
    decide::{
        engine::{Engine, VictimPolicy},
        thresholds::EvictionConfig,
    },
    run::simulate::{self, Replay},
};

const GIB: i64 = 1 << 30;
const MIB: i64 = 1 << 20;

/// memory.available<1Gi, held until 1.5Gi is available again.
fn config() -> EvictionConfig {
    EvictionArgs {
        eviction_hard: vec!["memory.available<1Gi".into()],
        eviction_minimum_reclaim: vec!["memory.available=512Mi".into()],
        ..EvictionArgs::default()
    }
    .resolve()
    .unwrap()
}

/// A 10 GiB node with `available` bytes available, and pods a (3 GiB over
/// its request), b (2 GiB) and c (1 GiB); `gone` are not there anymore.
fn snapshot(time: f64, available: i64, gone: &[&str]) -> Snapshot {
    let pod = |name: &str, usage: i64| {
        json!({"namespace": "default", "name": name,
               "containers": [{"name": "app", "requests": {"memory": "100Mi"}}],
               "usage": {"memory_working_set_bytes": usage}})
    };
    let pods: Vec<_> = [("a", 3 * GIB), ("b", 2 * GIB), ("c", GIB)]
        .into_iter()
        .filter(|(name, _)| !gone.contains(name))
        .map(|(name, usage)| pod(name, usage))
        .collect();
    serde_json::from_value(json!({
        "time": time,
        "node": {"memory": {"capacity_bytes": 10 * GIB, "working_set_bytes": 10 * GIB - available}},
        "pods": pods,
    }))
    .unwrap()
}

/// The engine's decision on `snapshot`, as the evictor hands it over.
fn decide(engine: &mut Engine, config: &EvictionConfig, snapshot: &Snapshot) -> PendingRecord {
    let now = Duration::from_secs_f64(snapshot.time);
    let assessment = engine.observe(now, &snapshot.node);
    let starvation = assessment.starvation.clone().unwrap();
    let choice = engine.choose(&assessment, &snapshot.pods, VictimPolicy::One);
    PendingRecord {
        time: snapshot.time,
        node: snapshot.node.clone(),
        pods: snapshot.pods.iter().cloned().map(Arc::new).collect(),
        exact: vec![true; snapshot.pods.len()],
        choice,
        thresholds: config.thresholds.clone().into(),
        thresholds_met: engine.thresholds_met_state(now),
        evict_set: false,
        pid_ranking: PidRanking::default(),
        at: Timestamp::now(),
        facts: DecisionFacts::of(
            &starvation,
            "kernel",
            Outcome::Evicted,
            StepTimes::default(),
        ),
    }
}

fn replay(record: &DecisionRecord, replay: Replay) -> serde_json::Value {
    let mut out = Vec::new();
    simulate::run(
        &EvictionConfig {
            thresholds: Vec::new(),
            ..config()
        },
        PolicyArgs::default(),
        replay,
        &serde_json::to_string(record).unwrap(),
        &mut out,
    )
    .unwrap();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn a_record_replays_to_its_victims_from_the_engine_state_it_recorded() {
    let config = config();
    let mut engine = Engine::new(config.clone());
    // 900 MiB available: a goes. Then 1.2 GiB: past the threshold, but
    // still short of its minimum reclaim, so b goes too.
    let first = decide(&mut engine, &config, &snapshot(0.0, 900 * MIB, &[]));
    assert_eq!(first.choice.victims[0].pod, "default/a");
    let second = decide(
        &mut engine,
        &config,
        &snapshot(10.0, GIB + 200 * MIB, &["a"]),
    );
    assert_eq!(second.choice.victims[0].pod, "default/b");
    let record = second.into_record();

    let replayed = replay(&record, Replay::RecordedThresholds);
    assert_eq!(replayed["victims"], json!(["default/b"]), "{replayed}");
    assert_eq!(replayed["ranking"], json!(["default/b", "default/c"]));
    // The thresholds met before are what made it: without them, nothing.
    let fresh = DecisionRecord {
        thresholds_met: Vec::new(),
        ..record.clone()
    };
    assert_eq!(
        replay(&fresh, Replay::RecordedThresholds)["victims"],
        json!([])
    );
    // Thresholds from the command line (none here) replace the record's.
    assert_eq!(
        replay(&record, Replay::CommandLineThresholds)["victims"],
        json!([])
    );
}

#[test]
fn the_ring_keeps_the_last_records_oldest_first() {
    let temp = tempfile::tempdir().unwrap();
    let dir = StateDir::open(temp.path()).unwrap();
    let records = DecisionRecords::start(dir.clone(), 3).unwrap();
    let config = config();
    for available in [100, 200, 300, 400, 500] {
        let mut engine = Engine::new(config.clone());
        records.record(decide(
            &mut engine,
            &config,
            &snapshot(0.0, available * MIB, &[]),
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let read = loop {
        let read = read_records(&dir).unwrap();
        if read.last().map(|r| r.decision.facts.observed) == Some(500 * MIB)
            || Instant::now() > deadline
        {
            break read;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let observed: Vec<i64> = read
        .iter()
        .map(|r| r.decision.facts.observed / MIB)
        .collect();
    assert_eq!(observed, [300, 400, 500]);
    assert!(!temp.path().join("decision-3.json").exists());
}

#[test]
fn explain_says_the_threshold_the_victim_the_ranking_and_the_times() {
    let config = config();
    let mut engine = Engine::new(config.clone());
    let mut pending = decide(&mut engine, &config, &snapshot(0.0, 900 * MIB, &[]));
    pending.facts.times_us = StepTimes {
        decision: 1234,
        exact_reads: 2,
        ..StepTimes::default()
    };
    let text = explain(&pending.into_record());
    for expected in [
        "memory.available: 900Mi available, hard threshold 1Gi (minimum reclaim 512Mi): 636Mi to reclaim",
        "trigger kernel: decided in 1.234 ms",
        "2 exact reads",
        "evicted: default/a (threshold, memory 3Gi, grace 0 s)",
        "ranking for memory (3 pods):",
        "1. default/a: memory",
        "<- victim",
        "3. default/c",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
}

#[test]
fn a_hold_before_ranking_replays_to_no_victim_and_is_told_without_a_ranking() {
    let config = config();
    let mut engine = Engine::new(config.clone());
    let mut pending = decide(&mut engine, &config, &snapshot(0.0, 900 * MIB, &[]));
    // As the evictor hands a hold over: the node, no pods, no choice.
    pending.pods.clear();
    pending.exact.clear();
    pending.choice = Choice::default();
    pending.facts.outcome = Outcome::HeldOutsidePods;
    pending.facts.times_us.decision = 250;
    let record = pending.into_record();
    let replayed = replay(&record, Replay::RecordedThresholds);
    assert_eq!(replayed["victims"], json!([]), "{replayed}");
    let text = explain(&record);
    for expected in [
        "memory.available: 900Mi available, hard threshold 1Gi",
        "trigger kernel: 0.250 ms after it",
        "held: the last kill gave back less than its pod held",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    assert!(!text.contains("ranking for"), "{text}");
}
