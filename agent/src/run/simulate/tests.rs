//! `evictd simulate --snapshot RECORD`: a decision record replays to the
//! victims the engine chose when it was written.
use serde_json::json;

use super::*;
use crate::{
    config::PolicyArgs,
    decide::engine::Engine,
    report::decisions::{
        DecisionRecord,
        fixtures::{GIB, MIB, config, decide, held_outside_pods, snapshot},
    },
};

fn replay(record: &DecisionRecord, replay: Replay) -> serde_json::Value {
    let mut out = Vec::new();
    run(
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
fn a_hold_before_ranking_replays_to_no_victim() {
    let replayed = replay(&held_outside_pods(), Replay::RecordedThresholds);
    assert_eq!(replayed["victims"], json!([]), "{replayed}");
}
