//! `evictd thresholds` through the real binary, as users and external checks
//! run it (shared/contracts/simulate.md): one JSON array on stdout and exit 0,
//! or nothing on stdout, one line on stderr and exit 2.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::{
    fs,
    process::{Command, Output},
};

use serde_json::{Value, json};

fn evictd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_evictd"))
        .args(args)
        .output()
        .unwrap()
}

/// The printed thresholds; the run must succeed with nothing on stderr.
fn thresholds(flags: &[&str]) -> Value {
    let output = evictd(&[&["thresholds"], flags].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON array: {stdout}");
    serde_json::from_str(&stdout).unwrap()
}

/// The run must fail as the contract says; its one stderr line.
fn usage_error(args: &[&str]) -> String {
    let output = evictd(args);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(output.stdout.is_empty(), "{args:?}: nothing on stdout");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
    stderr
}

fn hard(signal: &str, value: Value) -> Value {
    json!({"signal": signal, "operator": "LessThan", "value": value,
           "grace_period_seconds": 0, "min_reclaim": {"quantity": 0}})
}

#[test]
fn without_flags_kubelets_linux_defaults_print() {
    assert_eq!(
        thresholds(&[]),
        json!([
            hard("memory.available", json!({"quantity": 104857600})),
            hard(
                "allocatableMemory.available",
                json!({"quantity": 104857600})
            ),
            hard("nodefs.available", json!({"percentage": 0.1})),
            hard("nodefs.inodesFree", json!({"percentage": 0.05})),
            hard("imagefs.available", json!({"percentage": 0.15})),
            hard("imagefs.inodesFree", json!({"percentage": 0.05})),
        ])
    );
}

#[test]
fn flags_print_in_the_contracts_shape() {
    let printed = thresholds(&[
        "--eviction-hard=memory.available<150Mi,nodefs.available<10%",
        "--eviction-soft",
        "memory.available<1Gi",
        "--eviction-soft-grace-period=memory.available=1m30s",
        "--eviction-minimum-reclaim=memory.available=0Mi,nodefs.available=500Mi",
    ]);
    assert_eq!(
        printed,
        json!([
            hard("memory.available", json!({"quantity": 157286400})),
            hard("allocatableMemory.available", json!({"quantity": 157286400})),
            {"signal": "nodefs.available", "operator": "LessThan",
             "value": {"percentage": 0.1}, "grace_period_seconds": 0,
             "min_reclaim": {"quantity": 524288000}},
            {"signal": "memory.available", "operator": "LessThan",
             "value": {"quantity": 1073741824}, "grace_period_seconds": 90,
             "min_reclaim": {"quantity": 0}},
        ])
    );
}

#[test]
fn an_empty_eviction_hard_clears_the_defaults() {
    assert_eq!(thresholds(&["--eviction-hard="]), json!([]));
}

#[test]
fn a_kubelet_config_file_is_read_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubelet.yaml");
    fs::write(
        &path,
        "apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         cgroupDriver: systemd\n\
         evictionHard:\n  memory.available: 200Mi\n\
         mergeDefaultEvictionSettings: false\n\
         enforceNodeAllocatable: []\n",
    )
    .unwrap();
    let path = path.to_str().unwrap();
    assert_eq!(
        thresholds(&["--config", path]),
        json!([hard("memory.available", json!({"quantity": 209715200}))])
    );
    assert_eq!(
        thresholds(&["--config", path, "--eviction-hard=pid.available<1k"]),
        json!([hard("pid.available", json!({"quantity": 1000}))])
    );
}

#[test]
fn bad_input_is_one_line_quoting_it_and_exit_2() {
    for (args, quoted) in [
        (
            &["thresholds", "--eviction-hard=memory.free<1Gi"][..],
            "memory.free",
        ),
        (
            &["thresholds", "--eviction-hard=memory.available"],
            "memory.available",
        ),
        (
            &["thresholds", "--eviction-hard=memory.available<-1Gi"],
            "-1Gi",
        ),
        (
            &["thresholds", "--eviction-hard=nodefs.available<101%"],
            "101%",
        ),
        // kubelet's parseThresholdStatement: a quantity must be positive.
        (
            &["thresholds", "--eviction-hard=memory.available<0"],
            "\"0\"",
        ),
        (
            &[
                "simulate",
                "--snapshot",
                "/nonexistent/snapshot.json",
                "--eviction-hard=pid.available<0Ki",
            ],
            "\"0Ki\"",
        ),
        (
            &["thresholds", "--eviction-soft=memory.available<1Gi"],
            "memory.available<1Gi",
        ),
        (
            &["thresholds", "--eviction-max-pod-grace-period", "-5"],
            "-5",
        ),
        (
            &["thresholds", "--config", "/nonexistent/kubelet.yaml"],
            "/nonexistent/kubelet.yaml",
        ),
        // The agent stops at startup on the same errors, before touching
        // anything.
        (&["run", "--eviction-hard=memory.available<12Xi"], "12Xi"),
        (&["--eviction-pressure-transition-period=5"], "\"5\""),
    ] {
        let line = usage_error(args);
        assert!(line.contains(quoted), "{args:?}: {line}");
    }
}

/// As kubelet's map flags do, the last value of a signal given twice wins;
/// evictd warns on stderr and goes on.
#[test]
fn a_signal_given_twice_keeps_its_last_value_with_a_warning() {
    let output = evictd(&[
        "thresholds",
        "--eviction-hard=memory.available<1Gi",
        "--eviction-hard=memory.available<2Gi",
    ]);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one warning: {stderr}");
    assert!(
        stderr.contains("warning") && stderr.contains("memory.available"),
        "{stderr}"
    );
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        printed,
        json!([
            hard("memory.available", json!({"quantity": 2147483648_u64})),
            hard(
                "allocatableMemory.available",
                json!({"quantity": 2147483648_u64})
            ),
        ])
    );
}

#[test]
fn a_missing_node_cgroup_or_metadata_file_is_a_usage_error() {
    for command in ["snapshot", "run"] {
        let line = usage_error(&[command, "--node-cgroup", "/no-such-node-cgroup"]);
        assert!(line.contains("/no-such-node-cgroup"), "{line}");
        let line = usage_error(&[command, "--pod-metadata", "/nonexistent/pods.json"]);
        assert!(line.contains("/nonexistent/pods.json"), "{line}");
    }
}
