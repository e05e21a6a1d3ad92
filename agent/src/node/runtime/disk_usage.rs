//! Each pod's disk usage as kubelet's CRI stats provider and eviction
//! manager count it (pkg/kubelet/stats/cri_stats_provider.go,
//! pkg/kubelet/eviction/helpers.go `podDiskUsage`):
//!
//! - each container's writable layer, from the runtime
//!   (`ListContainerStats`: containerd measures the snapshot's upper
//!   directory, refreshed every `stats_collect_period`, 10 s by default);
//! - each container's logs: the directory of its `log_path`
//!   (`/var/log/pods/<ns>_<name>_<uid>/<container>/`, every restart's
//!   `N.log`), measured here as `du -x` would;
//! - the pod's local volumes under kubelet's pods directory
//!   (`<root>/pods/<uid>/volumes/<plugin>/<name>`): emptyDir (unless memory
//!   backed), configMap, downwardAPI and gitRepo, kubelet's
//!   `IsLocalEphemeralVolume`; and its `etc-hosts` file.
//!
//! Which containers count is kubelet's choice too: per pod the ready
//! sandboxes (else the newest), and per container name the running
//! instances (else the newest), as `removeTerminatedPods` and
//! `removeTerminatedContainers` pick them.
//!
//! A pod's logs and volumes are walked within one bounded [`Walk`]: what a
//! pod keeps there (unreadable directories, millions of files, deep trees)
//! can cut short its own figure, never another pod's, and never fails the
//! reading. A figure cut short is a lower bound, marked
//! ([`PodDiskUsage::incomplete`]), which the ranking and the local-storage
//! limits treat so that hiding usage never makes a pod safer.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs, io,
    path::{Path, PathBuf},
};

use k8s_cri::v1::{Container, ContainerState, ContainerStats, PodSandbox, PodSandboxState};
use serde::Serialize;
pub use walk::{Incomplete, Shortfall, Walk, WalkBounds};

use super::{RuntimeClient, RuntimeError};
use crate::decide::snapshot::PodUsage;

mod walk;

/// Volume plugins whose data is the pod's local ephemeral storage (kubelet's
/// `IsLocalEphemeralVolume`), as their directories are named.
const LOCAL_VOLUME_PLUGINS: [&str; 4] = [
    "kubernetes.io~empty-dir",
    "kubernetes.io~configmap",
    "kubernetes.io~downward-api",
    "kubernetes.io~git-repo",
];
const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";

#[derive(Debug, thiserror::Error)]
pub enum DiskUsageError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// Bytes allocated (`st_blocks`, as `du` counts) and inodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FsUsage {
    pub bytes: u64,
    pub inodes: u64,
}

impl FsUsage {
    fn add(&mut self, other: FsUsage) {
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.inodes = self.inodes.saturating_add(other.inodes);
    }
}

/// One counted container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerDiskUsage {
    pub name: String,
    pub id: String,
    /// The writable layer; `None` when the runtime did not report it.
    pub rootfs: Option<FsUsage>,
    /// Its log directory; `None` when the runtime gave no log path.
    pub logs: Option<FsUsage>,
}

impl ContainerDiskUsage {
    /// What kubelet's eviction message names for ephemeral storage:
    /// writable layer plus logs, only when both are known.
    pub(crate) fn ephemeral_storage_bytes(&self) -> Option<u64> {
        Some(self.rootfs?.bytes.saturating_add(self.logs?.bytes))
    }
}

/// One local volume of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeUsage {
    /// The volume's name in the pod spec.
    pub name: String,
    /// Its plugin directory, e.g. `kubernetes.io~empty-dir`.
    pub plugin: String,
    pub usage: FsUsage,
}

/// One pod's disk usage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PodDiskUsage {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<ContainerDiskUsage>,
    pub volumes: Vec<VolumeUsage>,
    pub etc_hosts: Option<FsUsage>,
    /// What the walk of the pod's logs and volumes could not see: its
    /// figures are then at least what they say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<IncompleteUsage>,
}

/// Where a pod's walk fell short, and which of its volumes it did not see
/// whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IncompleteUsage {
    #[serde(flatten)]
    pub shortfall: Shortfall,
    /// `(plugin directory, volume name)` of each volume seen in part or not
    /// at all.
    pub volumes: Vec<(String, String)>,
}

impl PodDiskUsage {
    fn rootfs(&self) -> FsUsage {
        sum(self.containers.iter().filter_map(|c| c.rootfs))
    }

    fn logs(&self) -> FsUsage {
        sum(self.containers.iter().filter_map(|c| c.logs))
    }

    fn local_volumes(&self) -> FsUsage {
        sum(self.volumes.iter().map(|v| v.usage))
    }

    /// The snapshot's disk fields (memory and pids are left as they are):
    /// which of them a disk signal counts is the ranking's business
    /// (`rank::DiskMeasure`, kubelet's `buildSignalToRankFunc`).
    pub fn fill(&self, usage: &mut PodUsage) {
        let (rootfs, logs, volumes) = (self.rootfs(), self.logs(), self.local_volumes());
        usage.rootfs_bytes = rootfs.bytes;
        usage.logs_bytes = logs.bytes;
        usage.local_volume_bytes = volumes.bytes;
        usage.inodes = sum([rootfs, logs, volumes]).inodes;
        usage.disk_incomplete = self.incomplete.is_some();
        usage.rootfs_inodes = Some(rootfs.inodes);
        usage.logs_inodes = Some(logs.inodes);
        usage.local_volume_inodes = Some(volumes.inodes);
    }

    /// The pod's ephemeral storage as kubelet's `calcEphemeralStorage`
    /// totals it for the pod-level limit: writable layers, logs, local
    /// volumes and the etc-hosts file.
    pub(crate) fn ephemeral_storage_bytes(&self) -> u64 {
        sum([
            self.rootfs(),
            self.logs(),
            self.local_volumes(),
            self.etc_hosts.unwrap_or_default(),
        ])
        .bytes
    }

    /// The emptyDir volume `name`'s usage, if the pod has it on disk.
    pub fn empty_dir(&self, name: &str) -> Option<FsUsage> {
        self.volumes
            .iter()
            .find(|v| v.plugin == EMPTY_DIR_PLUGIN && v.name == name)
            .map(|v| v.usage)
    }

    /// Whether the emptyDir volume `name` was seen whole. A volume not
    /// found is, unless the walk fell short (it may be behind a volumes
    /// directory that could not be listed).
    pub(crate) fn empty_dir_whole(&self, name: &str) -> bool {
        let Some(incomplete) = &self.incomplete else {
            return true;
        };
        self.empty_dir(name).is_some()
            && !incomplete
                .volumes
                .iter()
                .any(|(plugin, volume)| plugin == EMPTY_DIR_PLUGIN && volume == name)
    }
}

fn sum(usages: impl IntoIterator<Item = FsUsage>) -> FsUsage {
    usages.into_iter().fold(FsUsage::default(), |mut total, u| {
        total.add(u);
        total
    })
}

/// Every pod the runtime runs, by uid, measured now. `pods_dir` is
/// kubelet's `<root-dir>/pods`; each pod's logs and volumes are walked
/// within `bounds`.
pub async fn read(
    client: &mut RuntimeClient,
    pods_dir: &Path,
    bounds: WalkBounds,
) -> Result<BTreeMap<String, PodDiskUsage>, DiskUsageError> {
    let sandboxes = client.list_pod_sandboxes().await?;
    let containers = client.list_containers().await?;
    let writable_layers = writable_layers(client.list_container_stats().await?);
    let mut pods: BTreeMap<String, PodDiskUsage> = BTreeMap::new();
    for sandbox in counted_sandboxes(&sandboxes) {
        let Some(meta) = &sandbox.metadata else {
            continue;
        };
        let pod = pods.entry(meta.uid.clone()).or_default();
        pod.namespace.clone_from(&meta.namespace);
        pod.name.clone_from(&meta.name);
    }
    let uid_of: HashMap<&str, &str> = sandboxes
        .iter()
        .filter_map(|s| Some((s.id.as_str(), s.metadata.as_ref()?.uid.as_str())))
        .collect();
    // Each counted container's log directory, by pod, from the runtime
    // first: the walks come after, with no CRI call between them.
    let mut log_dirs: HashMap<&str, Vec<Option<PathBuf>>> = HashMap::new();
    for container in counted_containers(&sandboxes, &containers) {
        let Some(uid) = uid_of.get(container.pod_sandbox_id.as_str()) else {
            continue;
        };
        let Some(pod) = pods.get_mut(*uid) else {
            continue;
        };
        let log_dir = match client.container_status(&container.id).await {
            Ok(status) if !status.log_path.is_empty() => Some(
                Path::new(&status.log_path)
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_default(),
            ),
            Ok(_) => None,
            // Removed since it was listed.
            Err(RuntimeError::Call { source, .. }) if source.code() == tonic::Code::NotFound => {
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        pod.containers.push(ContainerDiskUsage {
            name: container
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            rootfs: writable_layers.get(&container.id).copied(),
            logs: None,
            id: container.id.clone(),
        });
        log_dirs.entry(*uid).or_default().push(log_dir);
    }
    let mut log_dirs_seen = HashSet::new();
    for (uid, pod) in &mut pods {
        let mut walk = Walk::new(bounds);
        let dirs = log_dirs.remove(uid.as_str()).unwrap_or_default();
        for (container, dir) in pod.containers.iter_mut().zip(dirs) {
            // Restarts share their container's directory: count it once.
            container.logs = dir.map(|dir| {
                if log_dirs_seen.insert(dir.clone()) {
                    walk.du(&dir).usage
                } else {
                    FsUsage::default()
                }
            });
        }
        let pod_dir = pods_dir.join(uid);
        let (volumes, unseen) = local_volumes(&mut walk, &pod_dir.join("volumes"));
        pod.volumes = volumes;
        let etc_hosts = walk.du(&pod_dir.join("etc-hosts")).usage;
        pod.etc_hosts = (etc_hosts.inodes > 0).then_some(etc_hosts);
        pod.incomplete = walk.into_shortfall().map(|shortfall| IncompleteUsage {
            shortfall,
            volumes: unseen,
        });
    }
    Ok(pods)
}

/// Each container's writable layer by container id, from the runtime's
/// `ListContainerStats`; a container it gives no layer size for is left
/// out (counted as unknown, not as empty).
pub fn writable_layers(stats: Vec<ContainerStats>) -> HashMap<String, FsUsage> {
    stats
        .into_iter()
        .filter_map(|stats| {
            let id = stats.attributes?.id;
            let layer = stats.writable_layer?;
            Some((
                id,
                FsUsage {
                    bytes: layer.used_bytes?.value,
                    inodes: layer.inodes_used.map_or(0, |v| v.value),
                },
            ))
        })
        .collect()
}

/// The sandboxes whose containers count: per pod uid the ready ones, or
/// else the newest (kubelet's `removeTerminatedPods`).
pub fn counted_sandboxes(sandboxes: &[PodSandbox]) -> Vec<&PodSandbox> {
    let mut by_uid: BTreeMap<&str, Vec<&PodSandbox>> = BTreeMap::new();
    for sandbox in sandboxes {
        let uid = sandbox.metadata.as_ref().map_or("", |m| m.uid.as_str());
        by_uid.entry(uid).or_default().push(sandbox);
    }
    let mut counted = Vec::new();
    for (_, group) in by_uid {
        let ready: Vec<&PodSandbox> = group
            .iter()
            .copied()
            .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
            .collect();
        if ready.is_empty() {
            counted.extend(group.into_iter().max_by_key(|s| s.created_at));
        } else {
            counted.extend(ready);
        }
    }
    counted
}

/// The containers whose usage counts: those of [`counted_sandboxes`], and
/// per (sandbox's pod, container name) the running ones or else the
/// newest (kubelet's `removeTerminatedContainers`).
pub fn counted_containers<'a>(
    sandboxes: &[PodSandbox],
    containers: &'a [Container],
) -> Vec<&'a Container> {
    let counted: HashMap<&str, &str> = counted_sandboxes(sandboxes)
        .into_iter()
        .map(|s| {
            let uid = s.metadata.as_ref().map_or("", |m| m.uid.as_str());
            (s.id.as_str(), uid)
        })
        .collect();
    let mut by_name: BTreeMap<(&str, &str), Vec<&Container>> = BTreeMap::new();
    for container in containers {
        let Some(uid) = counted.get(container.pod_sandbox_id.as_str()) else {
            continue;
        };
        let name = container.metadata.as_ref().map_or("", |m| m.name.as_str());
        by_name.entry((uid, name)).or_default().push(container);
    }
    let mut result = Vec::new();
    for (_, mut group) in by_name {
        group.sort_by_key(|c| c.created_at);
        let running: Vec<&Container> = group
            .iter()
            .copied()
            .filter(|c| c.state == ContainerState::ContainerRunning as i32)
            .collect();
        if group.len() == 1 || running.is_empty() {
            result.extend(group.last().copied());
        } else {
            result.extend(running);
        }
    }
    result
}

/// The local ephemeral volumes in a pod's `volumes` directory, and the
/// `(plugin, name)` of those not seen whole; a missing directory is none.
/// Memory-backed emptyDirs (tmpfs) use no disk.
fn local_volumes(walk: &mut Walk, volumes_dir: &Path) -> (Vec<VolumeUsage>, Vec<(String, String)>) {
    let mut found = Vec::new();
    let mut unseen = Vec::new();
    for plugin in LOCAL_VOLUME_PLUGINS {
        let plugin_dir = volumes_dir.join(plugin);
        let entries = match fs::read_dir(&plugin_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                walk.unreadable(&plugin_dir, &e);
                continue;
            }
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if is_tmpfs(&path) {
                continue;
            }
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let measured = walk.du(&path);
            if !measured.whole {
                unseen.push((plugin.to_owned(), name.clone()));
            }
            found.push(VolumeUsage {
                name,
                plugin: plugin.to_owned(),
                usage: measured.usage,
            });
        }
    }
    found.sort_by(|a, b| (&a.plugin, &a.name).cmp(&(&b.plugin, &b.name)));
    (found, unseen)
}

fn is_tmpfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

#[cfg(test)]
mod tests;
