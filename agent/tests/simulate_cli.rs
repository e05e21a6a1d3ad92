//! `evictd simulate` through the real binary, as users and external checks
//! run it (shared/contracts/simulate.md), with kubelet's default thresholds:
//! memory.available<100Mi, nodefs.available<10%, nodefs.inodesFree<5%,
//! imagefs.available<15%, imagefs.inodesFree<5%.
//!
//! The node and pods reproduce the Kubernetes documentation's ranking rules
//! ("Node-pressure Eviction", "Pod selection for kubelet eviction") and the
//! design doc kubelet-eviction.md ("Evict pods", with and without imagefs).
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::{
    path::PathBuf,
    process::{Command, Output},
};

fn data(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file)
}

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_evictd"))
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

/// Runs a snapshot file that must succeed; its stdout lines.
fn decisions(file: &str, flags: &[&str]) -> Vec<String> {
    let path = data(file);
    let mut args = vec!["--snapshot", path.to_str().unwrap()];
    args.extend(flags);
    let output = simulate(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Pods above their memory request go first, by priority and then by how
/// far above; pods within their request last, by priority. QoS does not
/// matter, and the static pod ranked first is never evicted.
#[test]
fn memory_ranking_follows_the_documented_order() {
    let expected = concat!(
        r#"{"time":0,"observations":{"memory.available":-524288000},"#,
        r#""thresholds_met":["memory.available"],"node_conditions":["MemoryPressure"],"#,
        r#""starved_resource":"memory","#,
        r#""ranking":["kube-system/kube-proxy","default/burstable-over","default/besteffort","#,
        r#""default/burstable-over-important","default/low-priority-guaranteed","#,
        r#""default/guaranteed","default/burstable-under"],"#,
        r#""victims":["default/burstable-over"],"#,
        r#""starved_signal":"memory.available","deficit":629145600,"victim_grace_period_seconds":[0]}"#
    );
    assert_eq!(decisions("memory-ranking.json", &[]), [expected]);
}

/// Requests as kubelet's `GetResourceRequestQuantity` computes them: a
/// sidecar beside the containers, an init container alone, overhead on top,
/// pod-level requests instead of the containers'. Only `plain` is above its
/// request; the rest go by usage − request, closest to their request first.
#[test]
fn memory_ranking_counts_sidecars_init_containers_overhead_and_pod_level_requests() {
    let lines = decisions("pod-requests.json", &[]);
    assert_eq!(lines.len(), 1);
    let decision: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        decision["ranking"],
        serde_json::json!([
            "default/plain",
            "default/overhead",
            "default/sidecar",
            "default/init",
            "default/pod-level"
        ]),
        "{decision}"
    );
    assert_eq!(decision["victims"], serde_json::json!(["default/plain"]));
}

/// --evict-set: 600Mi must come back; burstable-over (500Mi) cannot do it
/// alone, the first pod in the ranking that can is burstable-over-important.
#[test]
fn evict_set_takes_the_earliest_pod_that_covers_alone() {
    let lines = decisions("memory-ranking.json", &["--evict-set"]);
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].contains(r#""victims":["default/burstable-over-important"],"#),
        "{}",
        lines[0]
    );
}

/// Without imagefs, nodefs pressure ranks pods by local volumes + logs +
/// writable layers, above their ephemeral-storage request first.
#[test]
fn disk_without_imagefs_counts_every_byte_of_the_pod() {
    let expected = concat!(
        r#"{"time":0,"observations":{"memory.available":9663676416,"#,
        r#""nodefs.available":9663676416,"nodefs.inodesFree":6000000},"#,
        r#""thresholds_met":["nodefs.available"],"node_conditions":["DiskPressure"],"#,
        r#""starved_resource":"ephemeral-storage","#,
        r#""ranking":["default/cache","default/builder","default/web","default/logger"],"#,
        r#""victims":["default/cache"],"#,
        // 10% is kubelet's float32 0.1 of the capacity, 160 bytes over 10Gi.
        r#""starved_signal":"nodefs.available","deficit":1073741984,"victim_grace_period_seconds":[0]}"#
    );
    assert_eq!(decisions("disk-shared-fs.json", &[]), [expected]);
}

/// With a dedicated imagefs, nodefs pressure ranks by local volumes + logs,
/// then imagefs pressure by writable layers; DiskPressure holds throughout.
#[test]
fn disk_with_imagefs_counts_what_the_starved_filesystem_holds() {
    let nodefs = concat!(
        r#"{"time":0,"observations":{"memory.available":9663676416,"#,
        r#""nodefs.available":5368709120,"nodefs.inodesFree":6000000,"#,
        r#""imagefs.available":107374182400,"imagefs.inodesFree":6000000},"#,
        r#""thresholds_met":["nodefs.available"],"node_conditions":["DiskPressure"],"#,
        r#""starved_resource":"ephemeral-storage","#,
        r#""ranking":["default/cache","default/logger","default/web","default/builder"],"#,
        r#""victims":["default/cache"],"#,
        r#""starved_signal":"nodefs.available","deficit":5368709280,"victim_grace_period_seconds":[0]}"#
    );
    let imagefs = concat!(
        r#"{"time":10,"observations":{"memory.available":9663676416,"#,
        r#""nodefs.available":53687091200,"nodefs.inodesFree":6000000,"#,
        r#""imagefs.available":21474836480,"imagefs.inodesFree":6000000},"#,
        r#""thresholds_met":["imagefs.available"],"node_conditions":["DiskPressure"],"#,
        r#""starved_resource":"ephemeral-storage","#,
        r#""ranking":["default/builder","default/web","default/cache","default/logger"],"#,
        r#""victims":["default/builder"],"#,
        r#""starved_signal":"imagefs.available","deficit":10737419520,"victim_grace_period_seconds":[0]}"#
    );
    assert_eq!(
        decisions("disk-dedicated-imagefs.json", &[]),
        [nodefs, imagefs]
    );
}

/// The decisions of a snapshot file, parsed.
/// Enhancements #1631: at equal priority kubelet takes the pod with the
/// most processes, a database's quiet workers before the fork bomb beside
/// it; `--pid-ranking fork-rate` takes the bomb. A pod without a rate
/// ranks as one that does not fork, and priority still comes first.
#[test]
fn fork_rate_ranking_takes_the_fork_bomb_where_kubelet_takes_the_most_processes() {
    let ranking = |flags: &[&str]| {
        let mut args = vec!["--eviction-hard", "pid.available<100"];
        args.extend(flags);
        let lines = decisions("fork-bomb.json", &args);
        assert_eq!(lines.len(), 1);
        let decision: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(decision["starved_resource"], "pids");
        (decision["ranking"].clone(), decision["victims"].clone())
    };
    let kubelet = (
        serde_json::json!([
            "default/db",
            "default/bomb",
            "default/unmeasured",
            "default/cron",
            "kube-system/important"
        ]),
        serde_json::json!(["default/db"]),
    );
    assert_eq!(ranking(&[]), kubelet);
    assert_eq!(ranking(&["--pid-ranking", "kubelet"]), kubelet);
    assert_eq!(
        ranking(&["--pid-ranking", "fork-rate"]),
        (
            serde_json::json!([
                "default/bomb",
                "default/cron",
                "default/db",
                "default/unmeasured",
                "kube-system/important"
            ]),
            serde_json::json!(["default/bomb"]),
        )
    );
}

#[test]
fn an_unknown_pid_ranking_or_a_negative_fork_rate_is_a_usage_error() {
    let output = simulate(&[
        "--snapshot",
        data("fork-bomb.json").to_str().unwrap(),
        "--pid-ranking",
        "forks",
    ]);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty());
    assert!(stderr.contains("\"forks\""), "{stderr}");

    let path = tempdir().join("negative-forks.json");
    std::fs::write(
        &path,
        r#"{"node": {"memory": {"capacity_bytes": 1, "working_set_bytes": 0}},
            "pods": [{"namespace": "a", "name": "b", "containers": [],
                      "usage": {"forks_per_second": -2}}]}"#,
    )
    .unwrap();
    let output = simulate(&["--snapshot", path.to_str().unwrap()]);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("forks_per_second -2"), "{stderr}");
}

fn parsed(file: &str) -> Vec<serde_json::Value> {
    decisions(file, &[])
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The split image filesystem (KEP-4191): containerfs on nodefs's device,
/// imagefs on its own. nodefs (and containerfs, whose threshold is
/// nodefs's) rank by logs + volumes + writable layers; imagefs by the
/// images, which no pod holds: priority, then usage less request.
#[test]
fn a_split_image_filesystem_ranks_nodefs_by_everything_and_imagefs_by_images() {
    let lines = parsed("disk-split-imagefs.json");
    let nodefs = &lines[0];
    assert_eq!(
        nodefs["thresholds_met"],
        serde_json::json!(["nodefs.available", "containerfs.available"])
    );
    assert_eq!(
        nodefs["observations"]["containerfs.available"],
        5368709120u64
    );
    assert_eq!(nodefs["starved_signal"], "nodefs.available");
    assert_eq!(
        nodefs["ranking"],
        serde_json::json!([
            "default/cache",
            "default/builder",
            "default/web",
            "default/logger"
        ])
    );
    let imagefs = &lines[1];
    assert_eq!(
        imagefs["thresholds_met"],
        serde_json::json!(["imagefs.available"])
    );
    assert_eq!(
        imagefs["ranking"],
        serde_json::json!([
            "default/cache",
            "default/web",
            "default/builder",
            "default/logger"
        ])
    );
    assert_eq!(imagefs["victims"], serde_json::json!(["default/cache"]));
}

/// Inodes apart, per filesystem, with a dedicated imagefs: imagefs (and
/// containerfs, whose threshold is imagefs's) rank by writable-layer
/// inodes, nodefs by logs and volumes; a pod with only a total ranks by it.
#[test]
fn inodes_rank_by_what_the_starved_filesystem_holds() {
    let lines = parsed("disk-inodes-dedicated-imagefs.json");
    let imagefs = &lines[0];
    assert_eq!(
        imagefs["thresholds_met"],
        serde_json::json!(["imagefs.inodesFree", "containerfs.inodesFree"])
    );
    assert_eq!(imagefs["starved_resource"], "inodes");
    assert_eq!(imagefs["starved_signal"], "imagefs.inodesFree");
    assert_eq!(
        imagefs["ranking"],
        serde_json::json!([
            "default/total-only",
            "default/layers",
            "default/volume",
            "default/chatty"
        ])
    );
    let nodefs = &lines[1];
    assert_eq!(
        nodefs["thresholds_met"],
        serde_json::json!(["nodefs.inodesFree"])
    );
    assert_eq!(
        nodefs["ranking"],
        serde_json::json!([
            "default/volume",
            "default/total-only",
            "default/chatty",
            "default/layers"
        ])
    );
    // One filesystem: every inode, every inode signal.
    let shared = &parsed("disk-inodes-shared-fs.json")[0];
    assert_eq!(
        shared["thresholds_met"],
        serde_json::json!([
            "nodefs.inodesFree",
            "imagefs.inodesFree",
            "containerfs.inodesFree"
        ])
    );
    assert_eq!(shared["ranking"], nodefs["ranking"]);
    // A split imagefs holds images alone: no pod's inodes count there.
    let split = &parsed("disk-inodes-split-imagefs.json")[0];
    assert_eq!(
        split["thresholds_met"],
        serde_json::json!(["imagefs.inodesFree"])
    );
    assert_eq!(
        split["ranking"],
        serde_json::json!([
            "default/layers",
            "default/volume",
            "default/chatty",
            "default/total-only"
        ])
    );
}

#[test]
fn a_calm_node_ranks_nobody() {
    let dir = tempdir();
    let path = dir.join("calm.json");
    std::fs::write(
        &path,
        r#"{"node": {"memory": {"capacity_bytes": 1073741824, "working_set_bytes": 0}},
            "pods": [{"namespace": "a", "name": "b", "containers": []}]}"#,
    )
    .unwrap();
    let output = simulate(&["--snapshot", path.to_str().unwrap()]);
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        concat!(
            r#"{"time":0,"observations":{"memory.available":1073741824},"thresholds_met":[],"#,
            r#""node_conditions":[],"starved_resource":null,"ranking":[],"victims":[],"#,
            r#""starved_signal":null,"deficit":null,"victim_grace_period_seconds":[]}"#,
            "\n"
        )
    );
}

/// A private directory for generated inputs, left in the target
/// directory, which is scratch space.
fn tempdir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "simulate-cli-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Invalid input: exit 2, nothing on stdout, one line on stderr quoting
/// the file and the offending text, even when earlier snapshots are valid.
#[test]
fn invalid_input_is_a_usage_error_with_nothing_on_stdout() {
    let node = r#"{"memory": {"capacity_bytes": 1073741824, "working_set_bytes": 1073741824}}"#;
    let cases = [
        (
            "not-json.json",
            "{\"node\": ".to_owned(),
            "EOF while parsing",
        ),
        (
            "no-memory.json",
            r#"{"node": {}}"#.to_owned(),
            "missing field `memory`",
        ),
        (
            "bad-quantity.json",
            format!(
                r#"[{{"node": {node}}}, {{"node": {node}, "pods": [{{"namespace": "a", "name": "b", "containers": [{{"name": "c", "requests": {{"memory": "12Xi"}}}}]}}]}}]"#
            ),
            r#"quantity "12Xi""#,
        ),
        (
            "no-name.json",
            format!(r#"{{"node": {node}, "pods": [{{"namespace": "a", "containers": []}}]}}"#),
            "missing field `name`",
        ),
        (
            "backwards.json",
            format!(r#"[{{"time": 5, "node": {node}}}, {{"time": 4.5, "node": {node}}}]"#),
            "snapshot [1]: time 4.5 is earlier than the snapshot before it",
        ),
        (
            "negative.json",
            format!(r#"{{"time": -1, "node": {node}}}"#),
            "time -1 is negative",
        ),
        (
            "infinite.json",
            format!(r#"{{"time": 1e999, "node": {node}}}"#),
            "number out of range",
        ),
    ];
    let dir = tempdir();
    for (file, text, quoted) in cases {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        let output = simulate(&["--snapshot", path.to_str().unwrap()]);
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(2), "{file}: {stderr}");
        assert!(output.stdout.is_empty(), "{file}");
        assert_eq!(stderr.lines().count(), 1, "{file}: {stderr}");
        assert!(
            stderr.contains(&format!("{:?}", path.to_str().unwrap())),
            "{stderr}"
        );
        assert!(stderr.contains(quoted), "{file}: {stderr}");
    }
}

#[test]
fn an_unreadable_file_is_a_usage_error() {
    let output = simulate(&["--snapshot", "/nonexistent/snapshot.json"]);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    assert_eq!(
        stderr,
        "evictd: cannot read snapshot file \"/nonexistent/snapshot.json\": No such file or directory (os error 2)\n"
    );
}
