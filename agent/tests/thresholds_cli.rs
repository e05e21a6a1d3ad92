//! `evictd thresholds` and the agent's start-up validation through the real
//! binary: JSON on stdout and exit 0, or exit 2 with one stderr line quoting
//! the offending text and nothing on stdout (shared/contracts/simulate.md).
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::process::{Command, Output};

fn evictd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_evictd"))
        .args(args)
        .output()
        .unwrap()
}

fn assert_usage_error(output: &Output, quoted: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty(), "{:?}", output.stdout);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(quoted), "{stderr}");
}

#[test]
fn thresholds_print_as_one_json_array() {
    let output = evictd(&[
        "thresholds",
        "--eviction-hard",
        "memory.available<150Mi,nodefs.available<10%",
        "--eviction-soft",
        "memory.available<300Mi",
        "--eviction-soft-grace-period",
        "memory.available=1m",
        "--eviction-minimum-reclaim",
        "memory.available=0Mi",
    ]);
    assert!(output.status.success());
    let thresholds: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        thresholds,
        serde_json::json!([
            {"signal": "memory.available", "operator": "LessThan",
             "value": {"quantity": 157286400}, "grace_period_seconds": 0,
             "min_reclaim": {"quantity": 0}},
            {"signal": "allocatableMemory.available", "operator": "LessThan",
             "value": {"quantity": 157286400}, "grace_period_seconds": 0,
             "min_reclaim": {"quantity": 0}},
            {"signal": "nodefs.available", "operator": "LessThan",
             "value": {"percentage": 0.1}, "grace_period_seconds": 0,
             "min_reclaim": {"quantity": 0}},
            {"signal": "memory.available", "operator": "LessThan",
             "value": {"quantity": 314572800}, "grace_period_seconds": 60,
             "min_reclaim": {"quantity": 0}},
        ])
    );
}

#[test]
fn bad_thresholds_are_usage_errors_quoting_the_text() {
    for (args, quoted) in [
        (vec!["--eviction-hard", "memory.free<1Gi"], "memory.free"),
        (vec!["--eviction-hard", "memory.available<-1Gi"], "-1Gi"),
        (vec!["--eviction-hard", "nodefs.available<150%"], "150%"),
        (
            vec!["--eviction-soft", "memory.available<1Gi"],
            "memory.available<1Gi",
        ),
        (
            vec!["--eviction-pressure-transition-period", "soon"],
            "soon",
        ),
        (
            vec!["--config", "/nonexistent/kubelet.yaml"],
            "/nonexistent/kubelet.yaml",
        ),
    ] {
        let mut thresholds = vec!["thresholds"];
        thresholds.extend(&args);
        assert_usage_error(&evictd(&thresholds), quoted);
        // The agent refuses the same configuration before it starts.
        let mut run = vec!["run"];
        run.extend(&args);
        assert_usage_error(&evictd(&run), quoted);
    }
}

#[test]
fn a_missing_node_cgroup_or_metadata_file_is_a_usage_error() {
    for command in ["snapshot", "run"] {
        let output = evictd(&[command, "--node-cgroup", "/no-such-node-cgroup"]);
        assert_usage_error(&output, "/no-such-node-cgroup");
        let output = evictd(&[command, "--pod-metadata", "/nonexistent/pods.json"]);
        assert_usage_error(&output, "/nonexistent/pods.json");
    }
}
