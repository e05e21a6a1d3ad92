use std::time::{Duration, Instant};

use super::{
    fixtures::{MIB, config, decide, held_outside_pods, snapshot},
    *,
};
use crate::decide::engine::Engine;

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
fn a_hold_before_ranking_is_told_without_a_ranking() {
    let text = explain(&held_outside_pods());
    for expected in [
        "memory.available: 900Mi available, hard threshold 1Gi",
        "trigger kernel: 0.250 ms after it",
        "held: the last kill gave back less than its pod held",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    assert!(!text.contains("ranking for"), "{text}");
}
