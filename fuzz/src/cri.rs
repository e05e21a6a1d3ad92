//! The container runtime's CRI answers, as protobuf on the wire, through
//! what the agent makes of them: which sandboxes and containers count for
//! a pod's disk usage, each container's writable layer, the dead
//! containers kubelet's container GC would remove, the images its image GC
//! would remove, and the filesystems `ImageFsInfo` names.
use std::{
    collections::{BTreeSet, HashSet},
    path::Path,
    time::{Duration, SystemTime},
};

use evictd::node::runtime::{
    disk_usage,
    filesystems::RuntimeFilesystems,
    reclaim::{
        self,
        images::{ImageTracker, SandboxImages},
    },
};
use k8s_cri::v1::{
    Container, ContainerState, Image, ImageFsInfoResponse, ListContainerStatsResponse,
    ListContainersResponse, ListImagesResponse, ListPodSandboxResponse, PodSandbox,
    PodSandboxState,
};
use prost::Message as _;

/// One input: the runtime's answers to the calls the agent makes, each
/// exactly as the runtime sends it, and what the agent knows beside them.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CriAnswers {
    #[prost(message, optional, tag = "1")]
    pub sandboxes: Option<ListPodSandboxResponse>,
    #[prost(message, optional, tag = "2")]
    pub containers: Option<ListContainersResponse>,
    #[prost(message, optional, tag = "3")]
    pub stats: Option<ListContainerStatsResponse>,
    #[prost(message, optional, tag = "4")]
    pub images: Option<ListImagesResponse>,
    #[prost(message, optional, tag = "5")]
    pub image_fs_info: Option<ImageFsInfoResponse>,
    /// The images the sandboxes run, by their verbose status; the first
    /// is also the runtime's configured sandbox image.
    #[prost(string, repeated, tag = "6")]
    pub sandbox_images: Vec<String>,
    /// The pods whose cgroup kubelet keeps.
    #[prost(string, repeated, tag = "7")]
    pub live_pods: Vec<String>,
}

/// kubelet's label of a container's pod uid.
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

pub fn cri(data: &[u8]) {
    let Ok(answers) = CriAnswers::decode(data) else {
        return;
    };
    let sandboxes = answers.sandboxes.map(|r| r.items).unwrap_or_default();
    let containers = answers.containers.map(|r| r.containers).unwrap_or_default();
    let stats = answers.stats.map(|r| r.stats).unwrap_or_default();
    let images = answers.images.map(|r| r.images).unwrap_or_default();

    // Writable layers: one per container the runtime sized, as it sized it.
    let ids: HashSet<&str> = stats
        .iter()
        .filter_map(|s| Some(s.attributes.as_ref()?.id.as_str()))
        .collect();
    let sized = stats
        .iter()
        .filter(|s| {
            s.writable_layer
                .as_ref()
                .is_some_and(|layer| layer.used_bytes.is_some())
        })
        .count();
    let layers = disk_usage::writable_layers(stats.clone());
    assert!(layers.len() <= sized);
    assert!(layers.keys().all(|id| ids.contains(id.as_str())));

    // Counted sandboxes: per pod the ready ones, else exactly one.
    let counted = disk_usage::counted_sandboxes(&sandboxes);
    let pods: BTreeSet<&str> = sandboxes.iter().map(sandbox_uid).collect();
    for pod in &pods {
        let of_pod: Vec<_> = counted.iter().filter(|s| sandbox_uid(s) == *pod).collect();
        let ready = of_pod
            .iter()
            .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
            .count();
        assert!(
            ready == of_pod.len() && ready > 0 || of_pod.len() == 1,
            "pod {pod:?}: {of_pod:?}"
        );
    }
    let counted_ids: HashSet<&str> = counted.iter().map(|s| s.id.as_str()).collect();
    for container in disk_usage::counted_containers(&sandboxes, &containers) {
        assert!(counted_ids.contains(container.pod_sandbox_id.as_str()));
    }

    check_dead_containers(&sandboxes, &containers, &answers.live_pods);
    check_images(&images, &containers, &answers.sandbox_images);

    if let Some(info) = &answers.image_fs_info {
        // Paths of this machine the runtime names are only looked at
        // (stat, statvfs), never opened.
        let nodefs = std::env::temp_dir();
        if let Ok(filesystems) =
            RuntimeFilesystems::from_info(info, &nodefs, Path::new("/run/cri.sock"))
            && info.container_filesystems.is_empty()
        {
            assert_eq!(filesystems.containerfs, filesystems.imagefs, "{info:?}");
        }
    }
}

/// Never a running container; oldest first; and a live pod keeps the
/// newest dead container of each name.
fn check_dead_containers(sandboxes: &[PodSandbox], containers: &[Container], live_pods: &[String]) {
    let live: BTreeSet<String> = live_pods.iter().cloned().collect();
    let dead = reclaim::dead_containers(sandboxes, containers, &live);
    let running = ContainerState::ContainerRunning as i32;
    assert!(dead.iter().all(|c| c.state != running));
    assert!(dead.windows(2).all(|w| w[0].created_at <= w[1].created_at));
    assert!(dead.len() <= containers.len());
    let name_of = |container: &Container| {
        container
            .metadata
            .as_ref()
            .map_or("", |m| m.name.as_str())
            .to_owned()
    };
    let exited = || containers.iter().filter(|c| c.state != running);
    let units: BTreeSet<(&str, String)> = exited()
        .map(|c| (pod_of(sandboxes, c), name_of(c)))
        .filter(|(pod, _)| live.contains(*pod) && !pod.is_empty())
        .collect();
    for (pod, name) in units {
        let kept = exited().any(|c| {
            pod_of(sandboxes, c) == pod
                && name_of(c) == name
                && !dead.iter().any(|d| std::ptr::eq(*d, c))
        });
        assert!(
            kept,
            "live pod {pod:?} keeps no {name:?} container: {dead:?}"
        );
    }
}

fn sandbox_uid(sandbox: &PodSandbox) -> &str {
    sandbox.metadata.as_ref().map_or("", |m| m.uid.as_str())
}

/// A container's pod, as kubelet's evict units group them: its own label,
/// else its sandbox's (the last listed with that id, as a map of them
/// keeps).
fn pod_of<'a>(sandboxes: &'a [PodSandbox], container: &'a Container) -> &'a str {
    container
        .labels
        .get(POD_UID_LABEL)
        .map(String::as_str)
        .or_else(|| {
            sandboxes
                .iter()
                .rev()
                .filter(|s| s.id == container.pod_sandbox_id)
                .find_map(|s| Some(s.metadata.as_ref()?.uid.as_str()))
        })
        .unwrap_or_default()
}

/// Image GC: nothing just seen; then never a pinned image nor one a
/// container or sandbox uses, by any of its names.
fn check_images(images: &[Image], containers: &[Container], sandbox_images: &[String]) {
    let sandboxes = SandboxImages {
        configured: sandbox_images.first().cloned(),
        running: sandbox_images.to_vec(),
        unnamed: 0,
    };
    let minimum_age = Duration::from_secs(120);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut tracker = ImageTracker::new(minimum_age);
    tracker.observe(images, containers, now);
    assert!(
        tracker
            .unused(images, containers, &sandboxes, now)
            .is_empty(),
        "an image removed the moment it was first seen"
    );
    let later = now + minimum_age;
    let used: HashSet<&str> = containers
        .iter()
        .flat_map(|c| {
            [
                c.image_ref.as_str(),
                c.image_id.as_str(),
                c.image.as_ref().map_or("", |i| i.image.as_str()),
            ]
        })
        .chain(sandbox_images.iter().map(String::as_str))
        .filter(|name| !name.is_empty())
        .collect();
    for image in tracker.unused(images, containers, &sandboxes, later) {
        assert!(!image.pinned, "{image:?}");
        let names = std::iter::once(&image.id)
            .chain(&image.repo_tags)
            .chain(&image.repo_digests);
        for name in names {
            assert!(!used.contains(name.as_str()), "{image:?} is in use");
        }
    }
}
