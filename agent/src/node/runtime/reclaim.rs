//! kubelet's node-level reclaim (pkg/kubelet/eviction/eviction_manager.go
//! `reclaimNodeLevelResources`, helpers.go `buildSignalToNodeReclaimFuncs`):
//! under disk pressure, delete dead containers and unused images through
//! the runtime, re-observe, and evict a pod only if a threshold (with its
//! minimum reclaim) is still met.
//!
//! This module is the runtime half: which reclaim a signal calls for, what
//! is dead or unused, and the removals (each logged). Re-observing and
//! deciding whether a pod must still go is the decision loop's.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::SystemTime,
};

use k8s_cri::v1::{Container, ContainerState, Image, PodSandbox, PodSandboxState};
use serde::Serialize;
use tracing::{info, warn};

use super::{RuntimeClient, RuntimeError, filesystems::DiskLayout};
use crate::decide::thresholds::Signal;

/// One of kubelet's node reclaim functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReclaimStep {
    /// `containerGC.DeleteAllUnusedContainers`.
    DeadContainers,
    /// `imageGC.DeleteUnusedImages`.
    UnusedImages,
}

/// What kubelet reclaims, in order, before evicting for `signal`
/// (`buildSignalToNodeReclaimFuncs`). Memory and PIDs: nothing.
pub fn steps_for(signal: Signal, layout: DiskLayout) -> &'static [ReclaimStep] {
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

/// The dead containers kubelet's container GC deletes under pressure:
/// every exited container, except that a pod whose sandbox is still ready
/// keeps the newest exited instance of each container name
/// (`MaxPerPodContainer`, 1 by default, so `kubectl logs --previous` still
/// works). Oldest first.
pub fn dead_containers<'a>(
    sandboxes: &[PodSandbox],
    containers: &'a [Container],
) -> Vec<&'a Container> {
    let ready: HashSet<&str> = sandboxes
        .iter()
        .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
        .map(|s| s.id.as_str())
        .collect();
    let mut exited: BTreeMap<(&str, &str), Vec<&Container>> = BTreeMap::new();
    for container in containers
        .iter()
        .filter(|c| c.state == ContainerState::ContainerExited as i32)
    {
        let name = container.metadata.as_ref().map_or("", |m| m.name.as_str());
        exited
            .entry((container.pod_sandbox_id.as_str(), name))
            .or_default()
            .push(container);
    }
    let mut dead = Vec::new();
    for ((sandbox, _), mut group) in exited {
        group.sort_by_key(|c| c.created_at);
        if ready.contains(sandbox) {
            group.pop();
        }
        dead.extend(group);
    }
    dead.sort_by_key(|c| c.created_at);
    dead
}

/// When kubelet's image manager first saw an image and last saw it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImageRecord {
    first_detected: SystemTime,
    last_used: SystemTime,
}

/// kubelet's image GC bookkeeping (`realImageGCManager.detectImages`):
/// each observation records when an image was first seen and the last time
/// a container (running or not) used it. Kept across observations, so
/// "least recently used" means what it means for kubelet.
#[derive(Debug, Default)]
pub struct ImageTracker {
    records: HashMap<String, ImageRecord>,
}

impl ImageTracker {
    /// Records `images` as seen at `now`, those used by `containers` as used
    /// now; forgets images that are gone.
    pub fn observe(&mut self, images: &[Image], containers: &[Container], now: SystemTime) {
        let in_use = images_in_use(images, containers);
        self.records
            .retain(|id, _| images.iter().any(|i| i.id == *id));
        for image in images {
            let record = self.records.entry(image.id.clone()).or_insert(ImageRecord {
                first_detected: now,
                last_used: now,
            });
            if in_use.contains(image.id.as_str()) {
                record.last_used = now;
            }
        }
    }

    /// The images kubelet's `DeleteUnusedImages` would delete, in its order
    /// (`byLastUsedAndDetected`: least recently used first, then first
    /// detected): used by no container, not pinned, not the sandbox image.
    /// Call [`observe`](Self::observe) with the same lists first.
    pub fn unused<'a>(
        &self,
        images: &'a [Image],
        containers: &[Container],
        sandbox_image: Option<&str>,
    ) -> Vec<&'a Image> {
        let in_use = images_in_use(images, containers);
        let mut unused: Vec<(&Image, ImageRecord)> = images
            .iter()
            .filter(|image| !image.pinned && !in_use.contains(image.id.as_str()))
            .filter(|image| !sandbox_image.is_some_and(|name| names(image).any(|n| n == name)))
            .filter_map(|image| Some((image, *self.records.get(&image.id)?)))
            .collect();
        unused.sort_by_key(|(image, record)| (record.last_used, record.first_detected, &image.id));
        unused.into_iter().map(|(image, _)| image).collect()
    }
}

/// Every name an image answers to: id, tags, digests.
fn names(image: &Image) -> impl Iterator<Item = &str> {
    std::iter::once(image.id.as_str())
        .chain(image.repo_tags.iter().map(String::as_str))
        .chain(image.repo_digests.iter().map(String::as_str))
}

/// Ids of the images some container uses, matched by any of their names
/// (containerd's `image_ref` is the id; other runtimes give a digest).
fn images_in_use<'a>(images: &'a [Image], containers: &[Container]) -> HashSet<&'a str> {
    let referenced: HashSet<&str> = containers
        .iter()
        .flat_map(|c| {
            [
                c.image_ref.as_str(),
                c.image_id.as_str(),
                c.image.as_ref().map_or("", |i| i.image.as_str()),
            ]
        })
        .filter(|name| !name.is_empty())
        .collect();
    images
        .iter()
        .filter(|image| names(image).any(|name| referenced.contains(name)))
        .map(|image| image.id.as_str())
        .collect()
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

/// Removes [`dead_containers`] through the runtime, logging each; a
/// container already gone is skipped. Returns what was removed.
pub async fn remove_dead_containers(
    client: &mut RuntimeClient,
) -> Result<Vec<Removal>, RuntimeError> {
    let sandboxes = client.list_pod_sandboxes().await?;
    let containers = client.list_containers().await?;
    let mut removed = Vec::new();
    for container in dead_containers(&sandboxes, &containers) {
        let name = container
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        match client.remove_container(&container.id).await {
            Ok(()) => {
                info!(
                    container = container.id,
                    name,
                    sandbox = container.pod_sandbox_id,
                    "node reclaim: removed a dead container"
                );
                removed.push(Removal::Container {
                    id: container.id.clone(),
                    name,
                    pod_sandbox_id: container.pod_sandbox_id.clone(),
                });
            }
            Err(RuntimeError::Call { source, .. }) if source.code() == tonic::Code::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// Removes the unused images ([`ImageTracker::unused`]) least recently
/// used first, logging each; updates `tracker` with what it lists. An image
/// the runtime refuses (a container started on it meanwhile) is logged and
/// skipped, as kubelet goes on to the next. Returns what was removed.
pub async fn remove_unused_images(
    client: &mut RuntimeClient,
    tracker: &mut ImageTracker,
    now: SystemTime,
) -> Result<Vec<Removal>, RuntimeError> {
    let images = client.list_images().await?;
    let containers = client.list_containers().await?;
    let sandbox_image = client.sandbox_image().await?;
    tracker.observe(&images, &containers, now);
    let mut removed = Vec::new();
    for image in tracker.unused(&images, &containers, sandbox_image.as_deref()) {
        match client.remove_image(&image.id).await {
            Ok(()) => {
                info!(image = image.id, tags = ?image.repo_tags, size_bytes = image.size,
                    "node reclaim: removed an unused image");
                removed.push(Removal::Image {
                    id: image.id.clone(),
                    tags: image.repo_tags.clone(),
                    size_bytes: image.size,
                });
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
