//! The pods on the node, found in cgroups as kubelet lays them out, with
//! what a metadata source says about them, and the node's signals: the live
//! [`Snapshot`] the engine decides on.
//!
//! kubelet's layouts under the node's cgroup (QoS class from the path):
//! - cgroupfs driver: `kubepods/pod<uid>` (Guaranteed),
//!   `kubepods/burstable/pod<uid>`, `kubepods/besteffort/pod<uid>`;
//! - systemd driver: `kubepods.slice/kubepods-pod<uid>.slice`,
//!   `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`,
//!   and besteffort likewise, with the uid's dashes written as underscores.
//!
//! Containers are cgroups below the pod's; usage is read at the pod's level,
//! which counts them all.
use std::{
    fs, io,
    path::{Path, PathBuf},
    sync::Arc,
};

use tracing::{debug, warn};

pub use crate::pod_metadata::MetadataFile;
use crate::{
    cgroup::{CgroupError, CgroupFs, is_gone},
    config::InventoryArgs,
    metrics::Metrics,
    signals::{NodeSignals, SignalsError, child_path},
    snapshot::{NodeStats, PodSnapshot, PodUsage, QosClass, Snapshot},
};

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(
        "--node-cgroup {path:?}: no such cgroup in the memory hierarchy ({dir}); create it or name an existing one"
    )]
    NoNodeCgroup { path: String, dir: PathBuf },
    #[error("--pod-metadata {path}: {source}")]
    MetadataRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--pod-metadata {path}: not a JSON list of pods in the snapshot schema: {source}")]
    MetadataParse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("listing pods under {path}: {source}")]
    List {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Signals(#[from] SignalsError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

impl InventoryError {
    /// Whether the user's input is at fault (exit status 2).
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            Self::NoNodeCgroup { .. } | Self::MetadataRead { .. } | Self::MetadataParse { .. }
        )
    }
}

/// What is known about pods beyond their cgroups (namespace, name,
/// priority, requests...): --pod-metadata's file, or the Kubernetes API's
/// pod store. Lookups must not block: the engine calls them mid-decision.
pub trait PodMetadataSource: Send {
    /// The pod with this uid, if the source knows it.
    fn lookup(&mut self, uid: &str) -> Result<Option<PodSnapshot>, InventoryError>;

    /// Where the source counts its own troubles, once the metrics exist.
    fn set_metrics(&mut self, _metrics: Arc<Metrics>) {}
}

/// A pod cgroup found on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    pub uid: String,
    pub qos: QosClass,
    /// Relative to the hierarchy root.
    pub path: String,
}

pub struct Inventory {
    signals: NodeSignals,
    metadata: Option<Box<dyn PodMetadataSource>>,
    /// Where this process sits in the memory hierarchy, to recognise the
    /// pod evictd itself runs in.
    own_cgroup: Option<String>,
}

impl Inventory {
    pub fn new(cgroupfs: CgroupFs, args: &InventoryArgs) -> Result<Self, InventoryError> {
        let node = format!("/{}", args.node_cgroup.trim_matches('/'));
        let dir = cgroupfs.memory_dir(&node);
        if !dir.is_dir() {
            return Err(InventoryError::NoNodeCgroup {
                path: args.node_cgroup.clone(),
                dir,
            });
        }
        let metadata = match &args.pod_metadata {
            Some(path) => Some(Box::new(MetadataFile::open(path)?) as Box<dyn PodMetadataSource>),
            None => None,
        };
        Ok(Self {
            own_cgroup: own_memory_cgroup(),
            signals: NodeSignals {
                cgroupfs,
                node,
                nodefs: args.nodefs_path.clone(),
                imagefs: args.imagefs_path.clone(),
            },
            metadata,
        })
    }

    /// Hands the metrics to the pod metadata source.
    pub fn set_metrics(&mut self, metrics: Arc<Metrics>) {
        if let Some(source) = self.metadata.as_mut() {
            source.set_metrics(metrics);
        }
    }

    /// Replaces the pod metadata source (the Kubernetes API's pod store,
    /// once it is started).
    pub fn set_metadata(&mut self, source: Box<dyn PodMetadataSource>) {
        self.metadata = Some(source);
    }

    pub fn cgroupfs(&self) -> &CgroupFs {
        &self.signals.cgroupfs
    }

    /// The node cgroup, relative to the hierarchy root.
    pub fn node_cgroup(&self) -> &str {
        &self.signals.node
    }

    /// The pods' cgroup, if it exists now.
    pub fn kubepods_cgroup(&self) -> Option<String> {
        self.signals.kubepods()
    }

    /// Every signal's input, read now.
    pub fn node(&self) -> Result<NodeStats, InventoryError> {
        Ok(self.signals.read()?)
    }

    /// Every pod, with usage read now. A pod removed while it is read is
    /// left out.
    pub fn pods(&mut self) -> Result<Vec<PodSnapshot>, InventoryError> {
        let Some(kubepods) = self.kubepods_cgroup() else {
            return Ok(Vec::new());
        };
        let found = find_pods(&self.signals.cgroupfs.memory_dir(&kubepods), &kubepods)?;
        let mut pods = Vec::with_capacity(found.len());
        for cgroup in found {
            match self.pod(cgroup)? {
                Some(pod) => pods.push(pod),
                None => continue,
            }
        }
        Ok(pods)
    }

    pub fn snapshot(&mut self, time: f64) -> Result<Snapshot, InventoryError> {
        Ok(Snapshot {
            time,
            node: self.node()?,
            pods: self.pods()?,
        })
    }

    fn pod(&mut self, cgroup: PodCgroup) -> Result<Option<PodSnapshot>, InventoryError> {
        let usage = match self.usage(&cgroup.path) {
            Ok(usage) => usage,
            Err(CgroupError::Gone(_)) => {
                debug!(pod = cgroup.path, "pod cgroup vanished while being read");
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let known = match self.metadata.as_mut() {
            Some(source) => source.lookup(&cgroup.uid)?,
            None => None,
        };
        let hosts_evictd = self
            .own_cgroup
            .as_deref()
            .is_some_and(|own| own == cgroup.path || own.starts_with(&format!("{}/", cgroup.path)));
        let pod = match known {
            Some(pod) => PodSnapshot {
                uid: cgroup.uid,
                usage,
                cgroup: Some(cgroup.path),
                cgroup_qos: Some(cgroup.qos),
                unknown: Vec::new(),
                hosts_evictd,
                ..pod
            },
            None => PodSnapshot {
                namespace: String::new(),
                name: format!("pod{}", cgroup.uid),
                is_static: is_static_pod_uid(&cgroup.uid),
                unknown: UNKNOWN_WITHOUT_METADATA
                    .iter()
                    .filter(|field| !(**field == "static" && is_static_pod_uid(&cgroup.uid)))
                    .map(|field| (*field).to_owned())
                    .collect(),
                uid: cgroup.uid,
                priority: 0,
                mirror: false,
                containers: Vec::new(),
                termination_grace_period_seconds: None,
                usage,
                cgroup: Some(cgroup.path),
                cgroup_qos: Some(cgroup.qos),
                hosts_evictd,
            },
        };
        Ok(Some(pod))
    }

    fn usage(&self, path: &str) -> Result<PodUsage, CgroupError> {
        let cgroupfs = &self.signals.cgroupfs;
        let memory = cgroupfs.read_memory(path)?;
        // Without the pod in a pids hierarchy, count its processes.
        let pids = match cgroupfs.read_pids(path) {
            Ok(pids) => pids,
            Err(CgroupError::Gone(_) | CgroupError::NoPidsController) => {
                count_processes(&cgroupfs.memory_dir(path))?
            }
            Err(e) => return Err(e),
        };
        Ok(PodUsage {
            memory_working_set_bytes: memory.working_set_bytes(),
            pids,
            ..PodUsage::default()
        })
    }
}

/// Fields a pod found only in cgroups carries as defaults, not knowledge.
/// Its requests count as zero in rankings, as for a pod that has none.
const UNKNOWN_WITHOUT_METADATA: [&str; 7] = [
    "namespace",
    "name",
    "priority",
    "static",
    "mirror",
    "containers",
    "termination_grace_period_seconds",
];

/// kubelet names a static pod (from a manifest file, never evicted) with
/// the md5 of its source as uid: 32 hex digits, where API pods have a
/// dashed UUID. A pod without metadata shaped so is protected as static.
fn is_static_pod_uid(uid: &str) -> bool {
    uid.len() == 32 && uid.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Pod cgroups under the pods' cgroup `dir` (whose path is `kubepods`).
fn find_pods(dir: &Path, kubepods: &str) -> Result<Vec<PodCgroup>, InventoryError> {
    let mut pods = Vec::new();
    for name in subdirectories(dir)? {
        if let Some(uid) = pod_uid(&name) {
            pods.push(PodCgroup {
                uid,
                qos: QosClass::Guaranteed,
                path: child_path(kubepods, &name),
            });
            continue;
        }
        let Some(qos) = qos_directory(&name) else {
            continue;
        };
        let qos_path = child_path(kubepods, &name);
        for pod_name in subdirectories(&dir.join(&name))? {
            if let Some(uid) = pod_uid(&pod_name) {
                pods.push(PodCgroup {
                    uid,
                    qos,
                    path: child_path(&qos_path, &pod_name),
                });
            }
        }
    }
    pods.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(pods)
}

fn subdirectories(dir: &Path) -> Result<Vec<String>, InventoryError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if is_gone(&e) => return Ok(Vec::new()),
        Err(source) => {
            return Err(InventoryError::List {
                path: dir.to_owned(),
                source,
            });
        }
    };
    Ok(entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect())
}

/// The QoS class a directory directly under kubepods stands for.
fn qos_directory(name: &str) -> Option<QosClass> {
    match name {
        "burstable" | "kubepods-burstable.slice" => Some(QosClass::Burstable),
        "besteffort" | "kubepods-besteffort.slice" => Some(QosClass::BestEffort),
        _ => None,
    }
}

/// The uid in a pod cgroup's name, dashes restored for the systemd driver.
fn pod_uid(name: &str) -> Option<String> {
    if let Some(uid) = name.strip_prefix("pod") {
        return (!uid.is_empty() && !uid.contains('.')).then(|| uid.to_owned());
    }
    let stem = name.strip_prefix("kubepods-")?.strip_suffix(".slice")?;
    let uid = ["burstable-pod", "besteffort-pod", "pod"]
        .into_iter()
        .find_map(|prefix| stem.strip_prefix(prefix))?;
    (!uid.is_empty()).then(|| uid.replace('_', "-"))
}

/// Processes in a cgroup and its descendants, where no pids controller
/// counts them.
fn count_processes(dir: &Path) -> Result<u64, CgroupError> {
    let procs = dir.join("cgroup.procs");
    let text = fs::read_to_string(&procs).map_err(|e| CgroupError::io(&procs, e))?;
    let mut count = text.lines().filter(|l| !l.trim().is_empty()).count() as u64;
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                match count_processes(&entry.path()) {
                    Ok(n) => count += n,
                    Err(CgroupError::Gone(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(count)
}

/// This process's memory cgroup from /proc/self/cgroup (the v1 memory line,
/// or the v2 line).
fn own_memory_cgroup() -> Option<String> {
    let text = match fs::read_to_string("/proc/self/cgroup") {
        Ok(text) => text,
        Err(e) => {
            warn!(error = %e, "cannot read /proc/self/cgroup; cannot tell which pod hosts evictd");
            return None;
        }
    };
    parse_own_cgroup(&text)
}

fn parse_own_cgroup(text: &str) -> Option<String> {
    let mut unified = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            return Some(path.to_owned());
        }
        if controllers.is_empty() {
            unified = Some(path.to_owned());
        }
    }
    unified
}

#[cfg(test)]
mod tests;
