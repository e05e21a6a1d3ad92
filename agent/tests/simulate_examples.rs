//! The documented examples that need thresholds other than kubelet's
//! defaults, run through `simulate::run` with the configuration the docs
//! give (the same path the `simulate` command takes after parsing flags).
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::time::Duration;

use evictd::{
    config::PolicyArgs,
    decide::thresholds::{EvictionConfig, Operator, Signal, Threshold, ThresholdValue},
    run::simulate,
};

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;

fn threshold(signal: Signal, value: i64, min_reclaim: i64, grace: Option<u64>) -> Threshold {
    Threshold {
        signal,
        operator: Operator::LessThan,
        value: ThresholdValue::Quantity(value),
        grace_period: Duration::from_secs(grace.unwrap_or(0)),
        min_reclaim: ThresholdValue::Quantity(min_reclaim),
        hard: grace.is_none(),
    }
}

fn config(thresholds: Vec<Threshold>, max_pod_grace_period: u64) -> EvictionConfig {
    EvictionConfig {
        thresholds,
        max_pod_grace_period: Duration::from_secs(max_pod_grace_period),
        // kubelet's default --eviction-pressure-transition-period.
        pressure_transition_period: Duration::from_secs(300),
    }
}

fn run(config: &EvictionConfig, file: &str, evict_set: bool) -> Vec<String> {
    let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let policy = PolicyArgs {
        evict_set,
        ..PolicyArgs::default()
    };
    simulate::run_file(
        config,
        policy,
        simulate::Replay::CommandLineThresholds,
        path.as_ref(),
        &mut out,
    )
    .unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Node-pressure Eviction, "Minimum eviction reclaim": evictionHard
/// memory.available 500Mi, nodefs.available 1Gi, imagefs.available 100Gi;
/// evictionMinimumReclaim 0Mi, 500Mi, 2Gi. Once nodefs.available is below
/// 1Gi the kubelet reclaims until it reaches 1.5Gi. With --evict-set, each
/// decision takes the fewest pods that get there.
#[test]
fn minimum_reclaim_keeps_reclaiming_to_threshold_plus_minimum() {
    let config = config(
        vec![
            threshold(Signal::MemoryAvailable, 500 * MI, 0, None),
            threshold(Signal::NodeFsAvailable, GI, 500 * MI, None),
            threshold(Signal::ImageFsAvailable, 100 * GI, 2 * GI, None),
        ],
        0,
    );
    let lines = run(&config, "minimum-reclaim.json", true);
    // t=0: 624Mi short of 1.5Gi, c (700Mi) alone covers it. t=10: above
    // 1Gi but below 1.5Gi, so still met; b (400Mi) covers the 324Mi left.
    // t=20: at 1.5Gi, resolved; DiskPressure stays for the transition period.
    assert_eq!(
        lines,
        [
            r#"{"time":0,"observations":{"memory.available":8589934592,"nodefs.available":943718400,"nodefs.inodesFree":900000},"thresholds_met":["nodefs.available"],"node_conditions":["DiskPressure"],"starved_resource":"ephemeral-storage","ranking":["default/c","default/b","default/a","default/d"],"victims":["default/c"],"starved_signal":"nodefs.available","deficit":654311424,"victim_grace_period_seconds":[0]}"#,
            r#"{"time":10,"observations":{"memory.available":8589934592,"nodefs.available":1258291200,"nodefs.inodesFree":900000},"thresholds_met":["nodefs.available"],"node_conditions":["DiskPressure"],"starved_resource":"ephemeral-storage","ranking":["default/b","default/a","default/d"],"victims":["default/b"],"starved_signal":"nodefs.available","deficit":339738624,"victim_grace_period_seconds":[0]}"#,
            r#"{"time":20,"observations":{"memory.available":8589934592,"nodefs.available":1610612736,"nodefs.inodesFree":900000},"thresholds_met":[],"node_conditions":["DiskPressure"],"starved_resource":null,"ranking":[],"victims":[],"starved_signal":null,"deficit":null,"victim_grace_period_seconds":[]}"#,
        ]
    );
}

/// kubelet-eviction.md, "Eviction scenarios / Memory": hard 100Mi, soft
/// 300Mi with a 30s grace period; here with --eviction-max-pod-grace-period
/// 10.
#[test]
fn soft_threshold_waits_for_its_grace_period_and_the_condition_for_the_transition() {
    let config = config(
        vec![
            threshold(Signal::MemoryAvailable, 100 * MI, 0, None),
            threshold(Signal::MemoryAvailable, 300 * MI, 0, Some(30)),
        ],
        10,
    );
    let lines = run(&config, "soft-memory.json", false);
    // t=0, 10: soft threshold met, in its grace period: MemoryPressure, but
    // nothing starved. t=30: due; the victim gets min(its 30s default, 10s).
    // t=40: below the hard threshold, evicted at once. From t=50 relieved;
    // the condition stays until 300s after it was last met (t=40).
    assert_eq!(
        lines,
        [
            r#"{"time":0,"observations":{"memory.available":262144000},"thresholds_met":["memory.available"],"node_conditions":["MemoryPressure"],"starved_resource":null,"ranking":[],"victims":[],"starved_signal":null,"deficit":null,"victim_grace_period_seconds":[]}"#,
            r#"{"time":10,"observations":{"memory.available":262144000},"thresholds_met":["memory.available"],"node_conditions":["MemoryPressure"],"starved_resource":null,"ranking":[],"victims":[],"starved_signal":null,"deficit":null,"victim_grace_period_seconds":[]}"#,
            r#"{"time":30,"observations":{"memory.available":262144000},"thresholds_met":["memory.available"],"node_conditions":["MemoryPressure"],"starved_resource":"memory","ranking":["default/batch","default/web"],"victims":["default/batch"],"starved_signal":"memory.available","deficit":52428800,"victim_grace_period_seconds":[10]}"#,
            r#"{"time":40,"observations":{"memory.available":83886080},"thresholds_met":["memory.available"],"node_conditions":["MemoryPressure"],"starved_resource":"memory","ranking":["default/batch","default/web"],"victims":["default/batch"],"starved_signal":"memory.available","deficit":20971520,"victim_grace_period_seconds":[0]}"#,
            r#"{"time":50,"observations":{"memory.available":2147483648},"thresholds_met":[],"node_conditions":["MemoryPressure"],"starved_resource":null,"ranking":[],"victims":[],"starved_signal":null,"deficit":null,"victim_grace_period_seconds":[]}"#,
            r#"{"time":339,"observations":{"memory.available":2147483648},"thresholds_met":[],"node_conditions":["MemoryPressure"],"starved_resource":null,"ranking":[],"victims":[],"starved_signal":null,"deficit":null,"victim_grace_period_seconds":[]}"#,
            r#"{"time":340,"observations":{"memory.available":2147483648},"thresholds_met":[],"node_conditions":[],"starved_resource":null,"ranking":[],"victims":[],"starved_signal":null,"deficit":null,"victim_grace_period_seconds":[]}"#,
        ]
    );
}

/// Node-pressure Eviction: "When the kubelet evicts pods in response to
/// inode or PID starvation, it uses the Priority to determine the eviction
/// order"; kubelet then takes the larger PID count first.
#[test]
fn pid_pressure_ranks_by_priority() {
    let config = config(vec![threshold(Signal::PidAvailable, 1000, 0, None)], 0);
    let lines = run(&config, "pid-pressure.json", false);
    assert_eq!(
        lines,
        [
            r#"{"time":0,"observations":{"memory.available":9663676416,"pid.available":768},"thresholds_met":["pid.available"],"node_conditions":["PIDPressure"],"starved_resource":"pids","ranking":["default/shell","default/worker","default/idle","default/forker"],"victims":["default/shell"],"starved_signal":"pid.available","deficit":232,"victim_grace_period_seconds":[0]}"#,
        ]
    );
}
