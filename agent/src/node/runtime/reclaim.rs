//! kubelet's node-level reclaim (pkg/kubelet/eviction/eviction_manager.go
//! `reclaimNodeLevelResources`, helpers.go `buildSignalToNodeReclaimFuncs`):
//! under disk pressure, delete dead containers and unused images through
//! the runtime, re-observe, and evict a pod only if a threshold (with its
//! minimum reclaim) is still met.
//!
//! This module is the runtime half: which reclaim a signal calls for
//! (`steps_for`), what is dead ([`dead_containers`], kubelet's container
//! GC) or unused ([`images`], kubelet's image GC), the removals (each
//! logged), and where each signal's round stands (`rounds`). Deciding
//! whether a pod must still go is the decision loop's.
use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_cri::v1::{Container, ContainerState, PodSandbox, PodSandboxState};
use serde::Serialize;
use tracing::{info, warn};

use super::{RuntimeClient, RuntimeError, filesystems::DiskLayout};
use crate::{decide::thresholds::Signal, logs};

pub mod images;
pub(crate) mod rounds;

pub use images::{ImageTracker, SandboxImages};
pub(crate) use rounds::{NodeReclaim, ReclaimRequest, ReclaimRounds};

/// The label kubelet puts on every container with its pod's uid
/// (`types.KubernetesPodUIDLabel`), by which its container GC groups them.
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// One of kubelet's node reclaim functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ReclaimStep {
    /// `containerGC.DeleteAllUnusedContainers`.
    DeadContainers,
    /// `imageGC.DeleteUnusedImages`.
    UnusedImages,
}

/// What kubelet reclaims, in order, before evicting for `signal`
/// (`buildSignalToNodeReclaimFuncs`). Memory and PIDs: nothing.
pub(crate) fn steps_for(signal: Signal, layout: DiskLayout) -> &'static [ReclaimStep] {
    use ReclaimStep::{DeadContainers, UnusedImages};
    use Signal::*;
    const BOTH: &[ReclaimStep] = &[DeadContainers, UnusedImages];
    match (layout, signal) {
        (_, MemoryAvailable | AllocatableMemoryAvailable | PidAvailable) => &[],
        // One filesystem: everything frees space on it.
        (DiskLayout::Shared, _) => BOTH,
        // Writable layers and images on the imagefs; nodefs holds logs and
        // volumes, which only evictions free.
        (DiskLayout::DedicatedImageFs, NodeFsAvailable | NodeFsInodesFree) => &[],
        (DiskLayout::DedicatedImageFs, _) => BOTH,
        // Images alone on the imagefs; writable layers on nodefs.
        (DiskLayout::SplitImageFs, ImageFsAvailable | ImageFsInodesFree) => &[UnusedImages],
        (DiskLayout::SplitImageFs, _) => &[DeadContainers],
    }
}

/// The dead containers kubelet's container GC deletes under pressure
/// (`DeleteAllUnusedContainers`: kuberuntime_gc.go `evictContainers` with
/// every source ready and `evictNonDeletedPods`): every container not
/// running, in kubelet's evict units, one per pod uid (its container's
/// label, else its sandbox's) and container name, whichever sandbox it
/// ran in. A pod kubelet would remove (`ShouldPodRuntimeBeRemoved`:
/// terminated or unknown) loses every unit whole; a live pod keeps the
/// newest container of each (`MaxPerPodContainer`, 1 by default), so
/// `kubectl logs --previous` still works after its sandbox was recreated.
///
/// evictd does not see kubelet's pod workers: a pod counts as live when
/// `live_pods` (the pods whose cgroup kubelet keeps) holds its uid, when
/// one of its sandboxes is ready, or when one of its containers runs.
/// Oldest first.
pub fn dead_containers<'a>(
    sandboxes: &[PodSandbox],
    containers: &'a [Container],
    live_pods: &BTreeSet<String>,
) -> Vec<&'a Container> {
    let sandbox_uid: BTreeMap<&str, &str> = sandboxes
        .iter()
        .filter_map(|s| Some((s.id.as_str(), s.metadata.as_ref()?.uid.as_str())))
        .collect();
    let pod_uid = |container: &'a Container| {
        container
            .labels
            .get(POD_UID_LABEL)
            .map(String::as_str)
            .or_else(|| sandbox_uid.get(container.pod_sandbox_id.as_str()).copied())
            .unwrap_or_default()
    };
    let running = ContainerState::ContainerRunning as i32;
    let mut live: HashSet<&str> = live_pods.iter().map(String::as_str).collect();
    live.extend(
        sandboxes
            .iter()
            .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
            .filter_map(|s| Some(s.metadata.as_ref()?.uid.as_str())),
    );
    live.extend(
        containers
            .iter()
            .filter(|c| c.state == running)
            .map(pod_uid),
    );
    let mut units: BTreeMap<(&str, &str), Vec<&Container>> = BTreeMap::new();
    for container in containers.iter().filter(|c| c.state != running) {
        let name = container.metadata.as_ref().map_or("", |m| m.name.as_str());
        units
            .entry((pod_uid(container), name))
            .or_default()
            .push(container);
    }
    let mut dead = Vec::new();
    for ((uid, _), mut unit) in units {
        unit.sort_by_key(|c| c.created_at);
        if live.contains(uid) && !uid.is_empty() {
            unit.pop();
        }
        dead.extend(unit);
    }
    dead.sort_by_key(|c| c.created_at);
    dead
}

/// One thing removed to free disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Removal {
    Container {
        id: String,
        name: String,
        pod_sandbox_id: String,
    },
    Image {
        id: String,
        tags: Vec<String>,
        /// What the runtime says it takes (shared layers may free less).
        size_bytes: u64,
    },
}

impl Removal {
    fn container(container: &Container) -> Self {
        Self::Container {
            id: container.id.clone(),
            name: container
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            pod_sandbox_id: container.pod_sandbox_id.clone(),
        }
    }

    fn image(image: &k8s_cri::v1::Image) -> Self {
        Self::Image {
            id: image.id.clone(),
            tags: image.repo_tags.clone(),
            size_bytes: image.size,
        }
    }
}

/// [`dead_containers`] as the runtime lists them now.
async fn list_dead_containers(
    client: &mut RuntimeClient,
    live_pods: &BTreeSet<String>,
) -> Result<Vec<Container>, RuntimeError> {
    let sandboxes = client.list_pod_sandboxes().await?;
    let containers = client.list_containers().await?;
    Ok(dead_containers(&sandboxes, &containers, live_pods)
        .into_iter()
        .cloned()
        .collect())
}

/// What [`remove_dead_containers`] would remove now, removing nothing.
pub(crate) async fn would_remove_dead_containers(
    client: &mut RuntimeClient,
    live_pods: &BTreeSet<String>,
) -> Result<Vec<Removal>, RuntimeError> {
    let dead = list_dead_containers(client, live_pods).await?;
    Ok(dead.iter().map(Removal::container).collect())
}

/// Removes [`dead_containers`] through the runtime, logging each; a
/// container already gone is skipped. Returns what was removed.
pub async fn remove_dead_containers(
    client: &mut RuntimeClient,
    live_pods: &BTreeSet<String>,
) -> Result<Vec<Removal>, RuntimeError> {
    let mut removed = Vec::new();
    for container in list_dead_containers(client, live_pods).await? {
        match client.remove_container(&container.id).await {
            Ok(()) => {
                info!(
                    container = container.id,
                    name = container.metadata.as_ref().map_or("", |m| m.name.as_str()),
                    sandbox = container.pod_sandbox_id,
                    "node reclaim: removed a dead container"
                );
                removed.push(Removal::container(&container));
            }
            Err(RuntimeError::Call { source, .. }) if source.code() == tonic::Code::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// [`ImageTracker::unused`] as the runtime lists the images, containers
/// and sandboxes now; `tracker` observes the lists first.
async fn list_unused_images(
    client: &mut RuntimeClient,
    tracker: &mut ImageTracker,
    now: std::time::SystemTime,
) -> Result<Vec<k8s_cri::v1::Image>, RuntimeError> {
    let images = client.list_images().await?;
    let containers = client.list_containers().await?;
    let sandboxes = SandboxImages::ask(client).await?;
    tracker.observe(&images, &containers, now);
    Ok(tracker
        .unused(&images, &containers, &sandboxes, now)
        .into_iter()
        .cloned()
        .collect())
}

/// What [`remove_unused_images`] would remove now, removing nothing.
pub(crate) async fn would_remove_unused_images(
    client: &mut RuntimeClient,
    tracker: &mut ImageTracker,
    now: std::time::SystemTime,
) -> Result<Vec<Removal>, RuntimeError> {
    let unused = list_unused_images(client, tracker, now).await?;
    Ok(unused.iter().map(Removal::image).collect())
}

/// Removes the unused images ([`ImageTracker::unused`]) least recently
/// used first, logging each; updates `tracker` with what it lists. An image
/// the runtime refuses (a container started on it meanwhile) is logged and
/// skipped, as kubelet goes on to the next. Returns what was removed.
pub async fn remove_unused_images(
    client: &mut RuntimeClient,
    tracker: &mut ImageTracker,
    now: std::time::SystemTime,
) -> Result<Vec<Removal>, RuntimeError> {
    let mut removed = Vec::new();
    for image in list_unused_images(client, tracker, now).await? {
        match client.remove_image(&image.id).await {
            Ok(()) => {
                info!(image = image.id, tags = ?image.repo_tags, size_bytes = logs::bytes(image.size).logged(),
                    "node reclaim: removed an unused image");
                removed.push(Removal::image(&image));
            }
            Err(RuntimeError::Call { source, .. }) if source.code() == tonic::Code::NotFound => {}
            Err(RuntimeError::Call { source, .. }) => {
                warn!(image = image.id, error = %source, "node reclaim: the runtime kept an image");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;
