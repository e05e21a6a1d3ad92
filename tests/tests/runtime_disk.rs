//! kubelet's disk side against a real containerd (`--container-runtime-
//! endpoint`): containerd's root, and so the node's imagefs, is a small
//! loop-mounted filesystem of its own; evictd learns it from `ImageFsInfo`,
//! ranks pods by the writable layers the runtime reports, and removes
//! unused images before it evicts anyone. A pod whose emptyDir outgrows
//! its `sizeLimit` (from the API's pod spec) is evicted with no pressure
//! at all.
//!
//! The agent runs under the DaemonSet's seccomp profile where it acts, and
//! as the DaemonSet runs it where a tenant attacks the disk walk: exactly
//! the container's capabilities and profile, in a cgroup with its memory
//! limit. A pod's directory of another uid, 0700, blinds no one, and hides
//! nothing from a limit; 300,000 empty files in an emptyDir are walked
//! within the agent's memory limit, and memory is still decided.
//! Each test starts its own containerd and leaves nothing behind (the
//! filesystem is unmounted with containerd's mounts, also on failure).
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]
use std::{os::unix::fs::PermissionsExt as _, path::Path, process::Command, time::Duration};

use evictd_integration::{
    Agent, ApiServer, CriNode, Faults, IMAGE, OciImage, PodSpec, SCRATCH_PATH, agent_binary,
    agent_container, api_pod, cgroupfs_path, daemonset_capabilities, daemonset_memory_limit,
    http_get, metric, run_evictd, start_as_daemonset, wait_until,
};
use serde_json::{Value, json};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const SECCOMP: &str = env!("CARGO_BIN_EXE_evictd-seccomp");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// containerd's root: big enough for the workload image twice (its blobs
/// and its unpacked layer) and the pods' writable layers.
const ROOT_DISK: u64 = 384 * MIB;
/// The imagefs threshold the agent is given.
const THRESHOLD_MIB: u64 = 64;
/// How far below the threshold each test takes the imagefs.
const SHORT_MIB: u64 = 32;
/// containerd measures writable layers every second here
/// (`stats_collect_period`).
const MEASURED_DEADLINE: Duration = Duration::from_secs(30);
const KILLED: i32 = 128 + 9;

/// Two BestEffort pods of the same priority: `filler` (little memory) and
/// `big-memory`.
fn pods() -> Vec<PodSpec> {
    let filler = "00000000-0000-4000-8000-0000000000d1";
    let big = "00000000-0000-4000-8000-0000000000d2";
    vec![
        PodSpec::new(
            "filler",
            filler,
            cgroupfs_path("besteffort/", filler),
            0,
            json!({}),
        ),
        PodSpec::new(
            "big-memory",
            big,
            cgroupfs_path("besteffort/", big),
            0,
            json!({}),
        ),
    ]
}

fn node() -> Option<CriNode> {
    node_with(pods())
}

/// `pods`, among them [`pods`]'s `big-memory` holding 128 MiB, on a node
/// whose containerd root is a small disk of its own.
fn node_with(pods: Vec<PodSpec>) -> Option<CriNode> {
    let mut node =
        CriNode::new_with(pods, NODE_MEMORY, WORKLOAD.as_ref(), Some(ROOT_DISK)).unwrap()?;
    node.workload("big-memory")
        .unwrap()
        .alloc(128 * MIB)
        .unwrap();
    Some(node)
}

fn available(path: &Path) -> u64 {
    let stats = nix::sys::statvfs::statvfs(path).unwrap();
    stats.blocks_available() * stats.fragment_size()
}

/// What takes the imagefs to [`SHORT_MIB`] below the threshold.
fn to_fill(node: &CriNode) -> u64 {
    let free = available(&node.containerd.root());
    let target = (THRESHOLD_MIB - SHORT_MIB) * MIB;
    assert!(free > target + 64 * MIB, "{free} bytes free on {ROOT_DISK}");
    free - target
}

/// Takes the imagefs [`SHORT_MIB`] below the threshold through `filler`'s
/// writable layer, and waits for the runtime to have measured it; the
/// bytes written.
fn fill_imagefs(node: &mut CriNode) -> u64 {
    let bytes = to_fill(node);
    let reply = node
        .workload("filler")
        .unwrap()
        .command(&format!("write {bytes} /fill"))
        .unwrap();
    assert_eq!(reply, bytes.to_string());
    wait_until(MEASURED_DEADLINE, "containerd to measure the layer", || {
        node.writable_layer_bytes("filler").unwrap() >= bytes
    })
    .unwrap();
    bytes
}

/// The agent with `args`, under the seccomp profile the DaemonSet gives
/// it (deploy/seccomp/evictd.json, applied as a runtime applies a
/// Localhost profile): the CRI client, the disk walk, the removals and the
/// kill must all be allowed.
fn start_confined(args: &[Vec<String>]) -> Agent {
    let mut command = Command::new(SECCOMP);
    command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/seccomp/evictd.json"
        ))
        .arg(agent_binary())
        .args(args.concat());
    Agent::spawn(command).unwrap()
}

/// The imagefs threshold, a quick resync, and no minimum image age: the
/// tests import their images moments before the agent starts.
fn agent_args() -> Vec<String> {
    vec![
        "--eviction-hard".into(),
        format!("imagefs.available<{THRESHOLD_MIB}Mi"),
        "--resync-interval".into(),
        "200ms".into(),
        "--minimum-image-ttl-duration=0s".into(),
    ]
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel, containerd and a loop device: run with cargo xtask test"]
fn the_pod_filling_its_writable_layer_is_evicted_not_the_one_holding_memory() {
    let Some(mut node) = node() else {
        return;
    };
    // The agent starts on a node already short of disk, once the runtime
    // has measured the layer: its first reading is then the pods' real
    // usage (a reading serves 10 s, as kubelet's would).
    let bytes = fill_imagefs(&mut node);
    // `evictd snapshot` shows what the agent will rank by.
    let mut snapshot_args = vec!["snapshot".to_owned()];
    snapshot_args.extend(node.runtime_agent_args());
    let snapshot_args: Vec<&str> = snapshot_args.iter().map(String::as_str).collect();
    let (status, out) = run_evictd(&snapshot_args).unwrap();
    assert!(status.success(), "{out}");
    let snapshot: Value = serde_json::from_str(&out).unwrap();
    let pod = |name: &str| {
        snapshot["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()
            .clone()
    };
    assert!(
        pod("filler")["usage"]["rootfs_bytes"].as_u64().unwrap() >= bytes,
        "{out}"
    );
    assert!(pod("big-memory")["usage"]["rootfs_bytes"].as_u64().unwrap() < MIB);
    let imagefs = &snapshot["node"]["imagefs"];
    assert!(imagefs["available_bytes"].as_u64().unwrap() < THRESHOLD_MIB * MIB);
    assert_eq!(snapshot["node"]["containerfs"], *imagefs);

    let mut agent = start_confined(&[node.runtime_agent_args(), node.state_args(), agent_args()]);
    agent.log.expect("container runtime connected", &[]);
    let filesystems = agent.log.expect(
        "container runtime filesystems",
        &[("layout", "DedicatedImageFs")],
    );
    assert!(
        filesystems["imagefs"]
            .as_str()
            .unwrap()
            .starts_with(&node.containerd.root().display().to_string()),
        "{filesystems}"
    );
    let decided = agent
        .log
        .expect_eviction("default/filler", "ephemeral-storage");
    assert_eq!(decided["signal"], "imagefs.available", "{decided}");
    let status = node.wait_exited("filler").unwrap();
    assert_eq!(status.exit_code, KILLED, "{status:?}");
    assert!(node.alive("big-memory"), "the memory holder was killed");
    // Nothing the runtime could remove: the one image runs every pod.
    assert!(
        agent
            .log
            .all("node reclaim: removed an unused image")
            .is_empty()
    );
    assert_eq!(agent.log.all("eviction decided").len(), 1);
    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success());
    assert!(log.problems().is_empty(), "{:#?}", log.problems());
}

const UNUSED_IMAGE: &str = "evictd.local/big:unused";

/// [`node`] with an image no container uses filling the imagefs to
/// [`SHORT_MIB`] below the threshold: its blob and its unpacked layer each
/// take half of what the node must lose.
fn node_with_unused_image() -> Option<CriNode> {
    let node = node()?;
    let layer = to_fill(&node) / 2;
    let archive = node.containerd.dir().join("big-image.tar");
    OciImage::new()
        .file("/big", vec![0x5a; usize::try_from(layer).unwrap()])
        .write_archive(UNUSED_IMAGE, &archive)
        .unwrap();
    node.containerd.import(&archive).unwrap();
    std::fs::remove_file(&archive).unwrap();
    assert!(available(&node.containerd.root()) < THRESHOLD_MIB * MIB);
    Some(node)
}

fn image_tags(node: &CriNode) -> Vec<String> {
    let images = node
        .containerd
        .call("ListImages", |mut client| async move {
            client
                .list_images()
                .await
                .map_err(|e| tonic::Status::unknown(e.to_string()))
        })
        .unwrap();
    images.into_iter().flat_map(|i| i.repo_tags).collect()
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel, containerd and a loop device: run with cargo xtask test"]
fn an_unused_image_is_removed_and_no_pod_is_evicted() {
    let Some(node) = node_with_unused_image() else {
        return;
    };
    let threshold = THRESHOLD_MIB * MIB;
    let mut agent = start_confined(&[node.runtime_agent_args(), node.state_args(), agent_args()]);
    let address = agent.log.metrics_address();
    let removed = agent
        .log
        .expect("node reclaim: removed an unused image", &[]);
    assert!(
        removed["tags"]
            .as_str()
            .unwrap()
            .contains("evictd.local/big:unused"),
        "{removed}"
    );
    assert!(available(&node.containerd.root()) > threshold);
    assert!(!image_tags(&node).iter().any(|t| t == UNUSED_IMAGE));
    // The agent has looked at the node again since, and found enough.
    let series = r#"evictd_signal_available{signal="imagefs.available"}"#;
    wait_until(
        Duration::from_secs(30),
        "the agent to observe the reclaimed imagefs",
        || {
            http_get(&address, "/metrics")
                .ok()
                .and_then(|text| metric(&text, series))
                .is_some_and(|value| value > threshold as f64)
        },
    )
    .unwrap();
    let reclaimed = http_get(&address, "/metrics").unwrap();
    assert_eq!(
        metric(
            &reclaimed,
            r#"evictd_node_reclaim_removals_total{kind="image"}"#
        ),
        Some(1.0)
    );
    assert!(agent.log.all("eviction decided").is_empty());
    let mut node = node;
    for name in ["filler", "big-memory"] {
        assert!(node.alive(name), "{name} was killed");
    }
    // The image every pod runs stays.
    assert!(
        agent
            .log
            .all("node reclaim: removed an unused image")
            .iter()
            .all(|line| !line["tags"].as_str().unwrap_or_default().contains(IMAGE))
    );
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel, containerd and a loop device: run with cargo xtask test"]
fn a_dry_run_says_what_node_reclaim_would_remove_and_removes_nothing() {
    let Some(mut node) = node_with_unused_image() else {
        return;
    };
    let mut args = agent_args();
    args.push("--dry-run".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = node.start_agent_with_runtime(&args).unwrap();
    let would = agent
        .log
        .expect("--dry-run: node reclaim would remove", &[]);
    assert!(
        would["removal"].as_str().unwrap().contains(UNUSED_IMAGE),
        "{would}"
    );
    // Nothing was freed, so the decision goes on, and kills nothing.
    let decided = agent.log.expect("eviction decided", &[]);
    assert_eq!(decided["signal"], "imagefs.available", "{decided}");
    assert_eq!(decided["dry_run"], true, "{decided}");
    assert!(image_tags(&node).iter().any(|t| t == UNUSED_IMAGE));
    assert!(
        agent
            .log
            .all("node reclaim: removed an unused image")
            .is_empty()
    );
    for name in ["filler", "big-memory"] {
        assert!(node.alive(name), "{name} was killed");
    }
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}

/// kubelet's `imageMinimumGCAge` (2m by default): an image pulled moments
/// ago, for a container not yet created, is not removed, even under disk
/// pressure; the decision goes on without it (a dry run: nobody is killed).
#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel, containerd and a loop device: run with cargo xtask test"]
fn an_image_pulled_moments_ago_is_not_removed() {
    let Some(mut node) = node_with_unused_image() else {
        return;
    };
    let mut args: Vec<String> = agent_args()
        .into_iter()
        .filter(|arg| !arg.starts_with("--minimum-image-ttl-duration"))
        .collect();
    args.push("--dry-run".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = node.start_agent_with_runtime(&args).unwrap();
    let decided = agent.log.expect("eviction decided", &[]);
    assert_eq!(decided["signal"], "imagefs.available", "{decided}");
    assert!(
        agent
            .log
            .all("--dry-run: node reclaim would remove")
            .iter()
            .all(|line| !line["removal"]
                .as_str()
                .unwrap_or_default()
                .contains(UNUSED_IMAGE)),
        "a young image offered for removal"
    );
    assert!(image_tags(&node).iter().any(|t| t == UNUSED_IMAGE));
    for name in ["filler", "big-memory"] {
        assert!(node.alive(name), "{name} was killed");
    }
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
    // When it was first seen is kept for the next agent.
    let kept = std::fs::read_to_string(node.state_dir().join("images-first-seen.json")).unwrap();
    assert!(kept.contains("sha256:"), "{kept}");
}

const NODE_NAME: &str = "node-a";
/// The emptyDir limit of `scratchy`, and what each pod writes there.
const SIZE_LIMIT: &str = "4Mi";
const SCRATCH_WRITE: u64 = 8 * MIB;
/// Pods are held to their limits every 10 s, on a disk reading at most
/// 10 s old; reports follow the kill on another thread.
const LIMIT_DEADLINE: Duration = Duration::from_secs(60);

/// `scratchy`, whose `scratch` emptyDir has a [`SIZE_LIMIT`], and
/// `bystander`, whose emptyDir has none.
fn scratch_pods() -> Vec<PodSpec> {
    let scratchy = "00000000-0000-4000-8000-0000000000e1";
    let bystander = "00000000-0000-4000-8000-0000000000e2";
    let mut pods = vec![
        PodSpec::new(
            "scratchy",
            scratchy,
            cgroupfs_path("besteffort/", scratchy),
            0,
            json!({}),
        ),
        PodSpec::new(
            "bystander",
            bystander,
            cgroupfs_path("besteffort/", bystander),
            0,
            json!({}),
        ),
    ];
    pods[0].metadata["empty_dirs"] = json!([{"name": "scratch", "size_limit": SIZE_LIMIT}]);
    pods[1].metadata["empty_dirs"] = json!([{"name": "scratch"}]);
    pods
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel and containerd: run with cargo xtask test"]
fn a_pod_over_its_empty_dir_size_limit_is_evicted_with_kubelets_message_without_pressure() {
    let pods = scratch_pods();
    let api_pods = pods.iter().map(|pod| api_pod(pod, NODE_NAME)).collect();
    let Some(mut node) = CriNode::new(pods, NODE_MEMORY, WORKLOAD.as_ref()).unwrap() else {
        return;
    };
    let server = ApiServer::start(api_pods, Faults::default()).unwrap();
    // Far from every threshold: only the pod's own limit can evict it.
    let thresholds = vec![
        "--eviction-hard".to_owned(),
        "memory.available<32Mi".to_owned(),
    ];
    let mut agent = start_confined(&[
        node.runtime_api_agent_args(NODE_NAME, server.kubeconfig()),
        thresholds,
    ]);
    agent.log.expect(
        "pods listed from the Kubernetes API",
        &[("node", NODE_NAME)],
    );
    for name in ["scratchy", "bystander"] {
        let written = node
            .workload(name)
            .unwrap()
            .command(&format!("write {SCRATCH_WRITE} {SCRATCH_PATH}/fill"))
            .unwrap();
        assert_eq!(written, SCRATCH_WRITE.to_string());
    }
    let message =
        format!("Usage of EmptyDir volume \"scratch\" exceeds the limit \"{SIZE_LIMIT}\". ");
    // The next check may still find the reading taken before the write.
    wait_until(LIMIT_DEADLINE, "the eviction of scratchy", || {
        agent
            .log
            .count("eviction decided", "victim", "default/scratchy")
            > 0
    })
    .unwrap();
    let decided = agent
        .log
        .expect_eviction("default/scratchy", "ephemeral-storage");
    assert_eq!(decided["signal"], "emptydirfs.limit", "{decided}");
    assert_eq!(decided["eviction_message"], message.as_str(), "{decided}");
    assert!(decided["used_bytes"].as_u64().unwrap() >= SCRATCH_WRITE);
    let status = node.wait_exited("scratchy").unwrap();
    assert_eq!(status.exit_code, KILLED, "{status:?}");
    assert!(
        node.alive("bystander"),
        "the pod without a limit was killed"
    );

    // kubelet's status and pod event; no node event, as no threshold was
    // met.
    server
        .wait_for_request(LIMIT_DEADLINE, "the pod's Evicted event", |r| {
            r.method == "POST" && r.body["reason"] == "Evicted"
        })
        .unwrap();
    let writes = server.writes();
    let summary: Vec<(&str, &str)> = writes
        .iter()
        .map(|r| (r.method.as_str(), r.path.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            ("PATCH", "/api/v1/namespaces/default/pods/scratchy/status"),
            ("POST", "/api/v1/namespaces/default/events"),
        ]
    );
    assert_eq!(writes[0].body["status"]["message"], message.as_str());
    assert_eq!(writes[0].body["status"]["reason"], "Evicted");
    assert_eq!(writes[1].body["message"], message.as_str());
    assert_eq!(writes[1].body["involvedObject"]["name"], "scratchy");

    let address = agent.log.metrics_address();
    let metrics = http_get(&address, "/metrics").unwrap();
    assert_eq!(
        metric(
            &metrics,
            r#"evictd_evictions_total{qos="BestEffort",reason="pod-limit",signal="emptydirfs.limit"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(agent.log.all("eviction decided").len(), 1);
    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success());
    assert!(log.problems().is_empty(), "{:#?}", log.problems());
}

/// The agent as the DaemonSet runs it on `node`, with `capabilities` (the
/// DaemonSet's, or fewer), in a cgroup of its own limited to the agent
/// container's memory limit.
fn start_as_daemonset_on(node: &CriNode, capabilities: &[String], args: &[Vec<String>]) -> Agent {
    let limit = daemonset_memory_limit(&agent_container().unwrap()).unwrap();
    node.tree.create(AGENT_CGROUP).unwrap();
    node.tree.set_memory_limit(AGENT_CGROUP, limit).unwrap();
    start_as_daemonset(
        SECCOMP.as_ref(),
        capabilities,
        &node.tree,
        AGENT_CGROUP,
        &args.concat(),
    )
    .unwrap()
}

/// Where the agent runs, beside the node's pods (not among them).
const AGENT_CGROUP: &str = "agent";

/// The DaemonSet's capabilities, checked to include the one that reads
/// every pod's directories.
fn daemonset_caps() -> Vec<String> {
    let capabilities = daemonset_capabilities(&agent_container().unwrap());
    assert!(
        capabilities.iter().any(|cap| cap == "dac_read_search"),
        "{capabilities:?}"
    );
    capabilities
}

/// A pod with a `scratch` emptyDir limited to [`SIZE_LIMIT`].
fn limited_pod(name: &str, uid: &str) -> PodSpec {
    let mut pod = PodSpec::new(name, uid, cgroupfs_path("besteffort/", uid), 0, json!({}));
    pod.metadata["empty_dirs"] = json!([{"name": "scratch", "size_limit": SIZE_LIMIT}]);
    pod
}

fn empty_dir_message() -> String {
    format!("Usage of EmptyDir volume \"scratch\" exceeds the limit \"{SIZE_LIMIT}\". ")
}

/// The value of `series` on the agent's endpoint at `address`, once
/// `done` holds for it (waited for).
fn metric_once(address: &str, series: &str, done: impl Fn(f64) -> bool) -> f64 {
    let mut value = None;
    wait_until(Duration::from_secs(30), series, || {
        value = http_get(address, "/metrics")
            .ok()
            .and_then(|text| metric(&text, series));
        value.is_some_and(&done)
    })
    .unwrap();
    value.unwrap()
}

const UNREADABLE: &str = r#"evictd_pods_disk_usage_incomplete{reason="unreadable"}"#;

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel, containerd and a loop device: run with cargo xtask test"]
fn a_pods_directory_of_another_uid_hides_its_usage_from_no_limit_and_blinds_no_other_pod() {
    let mut pods = pods();
    pods.push(limited_pod(
        "secretive",
        "00000000-0000-4000-8000-0000000000f1",
    ));
    pods.push(limited_pod(
        "scratchy",
        "00000000-0000-4000-8000-0000000000f2",
    ));
    let Some(mut node) = node_with(pods) else {
        return;
    };
    // A tenant's database directory: another uid's, mode 0700, holding
    // twice the volume's limit. uid 0 without CAP_DAC_READ_SEARCH cannot
    // list it.
    let private = node.scratch_dir("secretive").unwrap().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::write(private.join("data"), vec![0x5a; SCRATCH_WRITE as usize]).unwrap();
    for path in [private.join("data"), private.clone()] {
        std::os::unix::fs::chown(&path, Some(1000), Some(1000)).unwrap();
    }
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Another pod over the same limit in plain sight.
    let scratchy = node.scratch_dir("scratchy").unwrap().join("fill");
    std::fs::write(&scratchy, vec![0x5a; SCRATCH_WRITE as usize]).unwrap();
    // And the imagefs short of its threshold through one pod's layer.
    fill_imagefs(&mut node);

    // Without the capability (a DaemonSet that leaves it out), in shadow
    // mode: the hidden directory costs its own pod, and only it.
    let without: Vec<String> = daemonset_caps()
        .into_iter()
        .filter(|cap| cap != "dac_read_search")
        .collect();
    let dry_run = vec!["--dry-run".to_owned()];
    let mut agent = start_as_daemonset_on(
        &node,
        &without,
        &[node.runtime_agent_args(), agent_args(), dry_run],
    );
    let address = agent.log.metrics_address();
    let told = agent.log.expect(
        "pod's logs and volumes not measured whole: its disk usage is at least what was seen; it ranks first for disk, and is held to any local-storage limit it sets as over it (unless only time cut the walk short)",
        &[("pod", "default/secretive"), ("reason", "unreadable")],
    );
    assert_eq!(told["path"], private.display().to_string(), "{told}");
    let hidden = agent
        .log
        .expect("eviction decided", &[("victim", "default/secretive")]);
    assert_eq!(hidden["signal"], "emptydirfs.limit", "{hidden}");
    // What was seen: the volume's directories, not the data.
    let seen = hidden["used_bytes"].as_u64().unwrap();
    assert!(seen < SCRATCH_WRITE, "{hidden}");
    assert_eq!(
        hidden["eviction_message"],
        format!(
            "Usage of EmptyDir volume \"scratch\" could not be measured whole (a directory evictd cannot read): at least {seen} bytes, against the limit \"{SIZE_LIMIT}\". "
        )
        .as_str(),
        "{hidden}"
    );
    let plain = agent
        .log
        .expect("eviction decided", &[("victim", "default/scratchy")]);
    assert_eq!(
        plain["eviction_message"],
        empty_dir_message().as_str(),
        "{plain}"
    );
    let imagefs = agent
        .log
        .expect("eviction decided", &[("victim", "default/filler")]);
    assert_eq!(imagefs["signal"], "imagefs.available", "{imagefs}");
    assert_eq!(metric_once(&address, UNREADABLE, |v| v >= 1.0), 1.0);
    for name in ["secretive", "scratchy", "filler", "big-memory"] {
        assert!(node.alive(name), "{name} was killed in a dry run");
    }
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());

    // As the DaemonSet runs it: the directory is read, its 8 MiB count.
    let mut agent = start_as_daemonset_on(
        &node,
        &daemonset_caps(),
        &[node.runtime_agent_args(), agent_args()],
    );
    let address = agent.log.metrics_address();
    let secretive = agent
        .log
        .expect_eviction("default/secretive", "ephemeral-storage");
    assert_eq!(
        secretive["eviction_message"],
        empty_dir_message().as_str(),
        "{secretive}"
    );
    assert!(secretive["used_bytes"].as_u64().unwrap() >= SCRATCH_WRITE);
    agent
        .log
        .expect_eviction("default/scratchy", "ephemeral-storage");
    let filler = agent
        .log
        .expect_eviction("default/filler", "ephemeral-storage");
    assert_eq!(filler["signal"], "imagefs.available", "{filler}");
    for name in ["secretive", "scratchy", "filler"] {
        assert_eq!(node.wait_exited(name).unwrap().exit_code, KILLED, "{name}");
    }
    assert!(node.alive("big-memory"), "the memory holder was killed");
    assert_eq!(metric_once(&address, UNREADABLE, |v| v == 0.0), 0.0);
    assert_eq!(agent.log.all("eviction decided").len(), 3);
    let (status, mut log) = agent.stop().unwrap();
    assert!(status.success());
    assert!(log.problems().is_empty(), "{:#?}", log.problems());
}

/// Empty files a tenant leaves in its emptyDir: each costs the walk an
/// entry and no block, and the directory itself a few MiB of names.
const CROWD: usize = 300_000;
/// What walking them may add to the agent's resident memory: a few
/// directory buffers, and the allocator's slack. The walk that queued
/// every entry first took about 130 MiB for them.
const WALK_GROWTH_BOUND: u64 = 16 * MIB;

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel and containerd: run with cargo xtask test"]
fn three_hundred_thousand_empty_files_are_walked_within_the_agents_memory_limit() {
    let crowded = "00000000-0000-4000-8000-0000000000f3";
    let hog = "00000000-0000-4000-8000-0000000000f4";
    let quiet = "00000000-0000-4000-8000-0000000000f5";
    let pods = vec![
        limited_pod("crowded", crowded),
        PodSpec::new("hog", hog, cgroupfs_path("besteffort/", hog), 0, json!({})),
        PodSpec::new(
            "quiet",
            quiet,
            cgroupfs_path("burstable/", quiet),
            1000,
            json!({"requests": {"memory": "64Mi"}}),
        ),
    ];
    let Some(mut node) = CriNode::new(pods, NODE_MEMORY, WORKLOAD.as_ref()).unwrap() else {
        return;
    };
    node.workload("quiet").unwrap().alloc(48 * MIB).unwrap();
    let limit = daemonset_memory_limit(&agent_container().unwrap()).unwrap();
    let thresholds = vec![
        "--eviction-hard".to_owned(),
        "memory.available<96Mi".to_owned(),
    ];
    let mut agent = start_as_daemonset_on(
        &node,
        &daemonset_caps(),
        &[node.runtime_agent_args(), thresholds],
    );
    let address = agent.log.metrics_address();
    let pid = agent.pid();
    // The crowded pod's limit has the agent read the pods' disk every 10 s;
    // after the first reading, its memory before the crowd arrives, and
    // its peak from then on (clear_refs 5 resets VmHWM to VmRSS).
    metric_once(&address, "evictd_disk_usage_reading_seconds_count", |n| {
        n >= 1.0
    });
    let before = status_bytes(pid, "VmRSS");
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    // Made aside and moved in whole: the next reading finds them all.
    let aside = node.containerd.dir().join("many");
    std::fs::create_dir(&aside).unwrap();
    for n in 0..CROWD {
        std::fs::File::create(aside.join(format!("empty-file-{n:06}"))).unwrap();
    }
    std::fs::rename(&aside, node.scratch_dir("crowded").unwrap().join("many")).unwrap();
    // Walked whole: the names alone take the directory past the limit.
    wait_until(LIMIT_DEADLINE, "the eviction of crowded", || {
        agent
            .log
            .count("eviction decided", "victim", "default/crowded")
            > 0
    })
    .unwrap();
    let decided = agent
        .log
        .expect_eviction("default/crowded", "ephemeral-storage");
    assert_eq!(
        decided["eviction_message"],
        empty_dir_message().as_str(),
        "{decided}"
    );
    assert_eq!(node.wait_exited("crowded").unwrap().exit_code, KILLED);
    let peak = status_bytes(pid, "VmHWM");
    assert_eq!(node.tree.oom_kill_count(AGENT_CGROUP).unwrap(), 0);
    eprintln!(
        "agent resident memory {before} bytes before {CROWD} files, peak {peak} while walking them (limit {limit})"
    );
    assert!(
        peak.saturating_sub(before) < WALK_GROWTH_BOUND && peak < limit,
        "{before} bytes resident before, {peak} at the peak, limit {limit}"
    );
    for reason in ["unreadable", "entries", "depth", "time"] {
        let series = format!("evictd_pods_disk_usage_incomplete{{reason=\"{reason}\"}}");
        assert_eq!(metric_once(&address, &series, |_| true), 0.0, "{series}");
    }
    // And memory is decided as ever.
    node.workload("hog")
        .unwrap()
        .grow_until_stopped(16 * MIB, NODE_MEMORY)
        .unwrap();
    agent.log.expect_eviction("default/hog", "memory");
    assert_eq!(node.wait_exited("hog").unwrap().exit_code, KILLED);
    assert!(node.alive("quiet"), "quiet was killed");
    assert_eq!(node.tree.oom_kill_count(AGENT_CGROUP).unwrap(), 0);
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}

/// A memory line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}
