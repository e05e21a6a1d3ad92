//! The agent's CRI client (`evictd::node::runtime`) against a real containerd
//! and pods made as kubelet makes them (`CriNode`): the runtime's
//! filesystems, each pod's disk usage as kubelet counts it (writable
//! layer, logs, emptyDir), a local-storage limit evaluated on that usage,
//! and node-level reclaim (dead containers, unused images) through CRI.
//! Part of the containerd tier: skipped without containerd, except under
//! CI=true.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]
use std::{
    collections::BTreeSet,
    time::{Duration, SystemTime},
};

use evictd::{
    decide::snapshot::{PodSnapshot, PodUsage},
    node::runtime::{
        disk_usage::{self, PodDiskUsage},
        filesystems::{DiskLayout, RuntimeFilesystems},
        local_storage,
        reclaim::{self, ImageTracker, Removal, SandboxImages},
    },
};
use evictd_integration::{
    CONTAINER, CriNode, IMAGE, OciImage, PodSpec, SCRATCH_PATH, SCRATCH_VOLUME, cgroupfs_path,
    wait_until,
};
use k8s_cri::v1::ContainerState;
use serde_json::json;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// containerd refreshes writable-layer usage every second here
/// (`stats_collect_period`); a few periods on a loaded machine.
const STATS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

fn best_effort(name: &'static str, n: u32) -> PodSpec {
    let uid: &'static str =
        Box::leak(format!("00000000-0000-4000-8000-0000000000c{n}").into_boxed_str());
    PodSpec::new(name, uid, cgroupfs_path("besteffort/", uid), 0, json!({}))
}

fn usage_of(node: &CriNode, name: &str) -> Option<PodDiskUsage> {
    let mut client = node.containerd.client().unwrap();
    let pods_dir = node.pods_dir();
    let mut pods = node
        .containerd
        .block_on(disk_usage::read(
            &mut client,
            &pods_dir,
            disk_usage::WalkBounds::default(),
        ))
        .unwrap();
    pods.remove(node.pod(name).unwrap().spec.uid.as_str())
}

#[test]
#[ignore = "needs root and containerd: run with cargo xtask test"]
fn each_pods_disk_usage_is_counted_as_kubelet_counts_it() {
    let Some(mut node) = CriNode::new(
        vec![best_effort("writer", 1), best_effort("logger", 2)],
        NODE_MEMORY,
        WORKLOAD.as_ref(),
    )
    .unwrap() else {
        return;
    };
    let writer = node.workload("writer").unwrap();
    writer
        .command(&format!("write {} /layer.bin", 24 * MIB))
        .unwrap();
    writer
        .command(&format!("write {} {SCRATCH_PATH}/blob", 8 * MIB))
        .unwrap();
    node.workload("logger")
        .unwrap()
        .command(&format!("log {}", 2 * MIB))
        .unwrap();

    let mut client = node.containerd.client().unwrap();
    // containerd measures its snapshotter's usage on its stats period:
    // until then ImageFsInfo reports 0 bytes used.
    let mut found = None;
    wait_until(STATS_DEADLINE, "the imagefs usage", || {
        let observed = node
            .containerd
            .block_on(RuntimeFilesystems::observe(
                &mut client,
                &node.kubelet_dir(),
            ))
            .unwrap();
        let measured = observed.imagefs.runtime_used_bytes > Some(MIB);
        found = Some(observed);
        measured
    })
    .unwrap();
    let found = found.unwrap();
    // containerd's root is on the same filesystem as this kubelet dir.
    assert_eq!(found.layout, DiskLayout::Shared, "{found:?}");
    assert!(
        found.imagefs.mountpoint.starts_with(node.containerd.dir()),
        "{found:?}"
    );
    assert_eq!(found.containerfs, found.imagefs);
    assert!(found.imagefs.stats.capacity_bytes > found.imagefs.stats.available_bytes);
    assert!(found.imagefs.runtime_used_bytes > Some(MIB), "{found:?}");
    let sandbox_image = node.containerd.block_on(client.sandbox_image()).unwrap();
    assert_eq!(sandbox_image.as_deref(), Some(IMAGE));

    let mut writer = None;
    wait_until(STATS_DEADLINE, "the writable layer's usage", || {
        writer = usage_of(&node, "writer");
        writer
            .as_ref()
            .and_then(|pod| pod.containers.first()?.rootfs)
            .is_some_and(|rootfs| rootfs.bytes >= 24 * MIB)
    })
    .unwrap();
    let writer = writer.unwrap();
    assert_eq!(writer.name, "writer");
    assert_eq!(writer.containers.len(), 1, "{writer:?}");
    assert_eq!(writer.containers[0].name, CONTAINER);
    assert_eq!(
        writer.containers[0].id,
        node.pod("writer").unwrap().container_id
    );
    let scratch = writer.empty_dir(SCRATCH_VOLUME).unwrap();
    assert!(
        scratch.bytes >= 8 * MIB && scratch.bytes < 9 * MIB,
        "{scratch:?}"
    );
    let logger = usage_of(&node, "logger").unwrap();
    let logs = logger.containers[0].logs.unwrap();
    assert!(logs.bytes >= 2 * MIB, "{logger:?}");
    // The logger wrote no file, the writer no log: each count is its own.
    assert!(
        logger.containers[0].rootfs.unwrap().bytes < MIB,
        "{logger:?}"
    );
    assert!(writer.containers[0].logs.unwrap().bytes < MIB, "{writer:?}");

    let mut snapshot = PodUsage::default();
    writer.fill(&mut snapshot);
    assert!(snapshot.rootfs_bytes >= 24 * MIB);
    assert_eq!(snapshot.local_volume_bytes, scratch.bytes);
    // Inodes apart: the scratch file and its directory, the layer's file.
    assert!(snapshot.local_volume_inodes >= Some(2), "{snapshot:?}");
    assert!(snapshot.rootfs_inodes >= Some(1), "{snapshot:?}");
    assert!(snapshot.logs_inodes >= Some(1), "{snapshot:?}");

    // The emptyDir's sizeLimit, as kubelet enforces it.
    let pod = |containers: serde_json::Value, size_limit: Option<&str>| -> PodSnapshot {
        serde_json::from_value(json!({
            "namespace": "default", "name": "writer", "containers": containers,
            "empty_dirs": [{"name": SCRATCH_VOLUME, "size_limit": size_limit}],
        }))
        .unwrap()
    };
    let over = local_storage::evaluate(&pod(json!([]), Some("4Mi")), &writer, false).unwrap();
    assert_eq!(
        over.message(),
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"4Mi\". "
    );
    assert_eq!(
        local_storage::evaluate(&pod(json!([]), Some("64Mi")), &writer, false),
        None
    );
    // A container limit below its writable layer plus logs.
    let limited = json!([{"name": CONTAINER, "limits": {"ephemeral-storage": "16Mi"}}]);
    let over = local_storage::evaluate(&pod(limited, None), &writer, false).unwrap();
    // The pod (layer + scratch) is over the sum of its limits first.
    assert_eq!(
        over.message(),
        "Pod ephemeral local storage usage exceeds the total limit of containers 16Mi. "
    );
}

#[test]
#[ignore = "needs root and containerd: run with cargo xtask test"]
fn node_reclaim_removes_dead_containers_and_unused_images_through_cri() {
    let Some(mut node) = CriNode::new(
        vec![best_effort("keep", 3), best_effort("done", 4)],
        NODE_MEMORY,
        WORKLOAD.as_ref(),
    )
    .unwrap() else {
        return;
    };
    let spare = ["evictd.local/spare-a:1", "evictd.local/spare-b:1"];
    for (n, name) in spare.iter().enumerate() {
        let archive = node.containerd.dir().join(format!("spare-{n}.tar"));
        OciImage::new()
            .file("/payload", vec![n as u8 + 1; 4 * MIB as usize])
            .entrypoint(&["/payload"])
            .write_archive(name, &archive)
            .unwrap();
        node.containerd.import(&archive).unwrap();
    }
    node.stop_pod("done").unwrap();
    let done = node.pod("done").unwrap().container_id.clone();
    assert_eq!(
        node.wait_exited("done").unwrap().state,
        ContainerState::ContainerExited as i32
    );

    let mut client = node.containerd.client().unwrap();
    // The runtime says what each sandbox runs: never removed.
    let sandboxes = node
        .containerd
        .block_on(SandboxImages::ask(&mut client))
        .unwrap();
    assert_eq!(sandboxes.unnamed, 0, "{sandboxes:?}");
    assert_eq!(sandboxes.running.len(), 2, "{sandboxes:?}");
    assert!(
        sandboxes.running.iter().all(|image| image == IMAGE),
        "{sandboxes:?}"
    );
    let removed = node
        .containerd
        .block_on(reclaim::remove_dead_containers(
            &mut client,
            &BTreeSet::new(),
        ))
        .unwrap();
    assert_eq!(
        removed,
        [Removal::Container {
            id: done.clone(),
            name: CONTAINER.to_owned(),
            pod_sandbox_id: node.pod("done").unwrap().sandbox_id.clone(),
        }]
    );
    let containers = node.containerd.block_on(client.list_containers()).unwrap();
    assert!(containers.iter().all(|c| c.id != done));

    let mut remove_unused = |minimum_age| {
        node.containerd
            .block_on(reclaim::remove_unused_images(
                &mut client,
                &mut ImageTracker::new(minimum_age),
                SystemTime::now(),
            ))
            .unwrap()
    };
    // Just imported: too young for kubelet's default minimum age.
    let young = remove_unused(reclaim::images::DEFAULT_MINIMUM_AGE);
    assert!(young.is_empty(), "{young:?}");
    let removed = remove_unused(Duration::ZERO);
    let mut removed_tags: Vec<String> = removed
        .iter()
        .flat_map(|r| match r {
            Removal::Image {
                tags, size_bytes, ..
            } => {
                assert!(*size_bytes >= 4 * MIB, "{r:?}");
                tags.clone()
            }
            Removal::Container { .. } => panic!("{r:?}"),
        })
        .collect();
    removed_tags.sort();
    assert_eq!(removed_tags, spare);
    // The workload image runs the pods and is the sandbox image: kept.
    let images = node.containerd.block_on(client.list_images()).unwrap();
    assert!(
        images
            .iter()
            .any(|i| i.repo_tags.iter().any(|t| t == IMAGE))
    );
    assert!(
        images
            .iter()
            .all(|i| !i.repo_tags.iter().any(|t| spare.contains(&t.as_str())))
    );
    assert!(node.alive("keep"));
}
