//! A node, its pods and the engine's decision on them, for the record's
//! tests and for `run::simulate`'s, which replays a record.
use std::{sync::Arc, time::Duration};

use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::{DecisionFacts, DecisionRecord, Outcome, PendingRecord, StepTimes};
use crate::decide::{
    engine::{Choice, Engine, VictimPolicy},
    rank::PidRanking,
    snapshot::Snapshot,
    thresholds::{EvictionConfig, Threshold, ThresholdValue},
};

pub(crate) const GIB: i64 = 1 << 30;
pub(crate) const MIB: i64 = 1 << 20;

/// memory.available<1Gi, held until 1.5Gi is available again, as
/// `--eviction-hard memory.available<1Gi --eviction-minimum-reclaim
/// memory.available=512Mi` resolves: kubelet copies a hard memory.available
/// threshold to the pods' allocatable memory.
pub(crate) fn config() -> EvictionConfig {
    EvictionConfig::of(
        Threshold::hard_memory_available(GIB)
            .map(|threshold| Threshold {
                min_reclaim: ThresholdValue::Quantity(512 * MIB),
                ..threshold
            })
            .to_vec(),
    )
}

/// A 10 GiB node with `available` bytes available, and pods a (3 GiB over
/// its request), b (2 GiB) and c (1 GiB); `gone` are not there anymore.
pub(crate) fn snapshot(time: f64, available: i64, gone: &[&str]) -> Snapshot {
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
pub(crate) fn decide(
    engine: &mut Engine,
    config: &EvictionConfig,
    snapshot: &Snapshot,
) -> PendingRecord {
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

/// A hold for pressure outside the pods on a node with 900 MiB available,
/// as the evictor hands one over: the node, no pods, no choice, 250 µs
/// after its trigger.
pub(crate) fn held_outside_pods() -> DecisionRecord {
    let config = config();
    let mut engine = Engine::new(config.clone());
    let mut pending = decide(&mut engine, &config, &snapshot(0.0, 900 * MIB, &[]));
    pending.pods.clear();
    pending.exact.clear();
    pending.choice = Choice::default();
    pending.facts.outcome = Outcome::HeldOutsidePods;
    pending.facts.times_us.decision = 250;
    pending.into_record()
}
