//! One look at the node's disk through the runtime: the imagefs and
//! containerfs it names, and every pod's disk usage. The live agent takes
//! one on its runtime thread when a disk decision asks for it
//! (`link`); `evictd snapshot` takes one and prints it.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{
    RuntimeClient, RuntimeError,
    disk_usage::{self, DiskUsageError, PodDiskUsage, WalkBounds},
    filesystems::{FilesystemsError, RuntimeFilesystems},
};
use crate::decide::snapshot::Snapshot;

#[derive(Debug, thiserror::Error)]
pub enum ReadingError {
    #[error(transparent)]
    Filesystems(#[from] FilesystemsError),
    #[error(transparent)]
    Usage(#[from] DiskUsageError),
}

impl ReadingError {
    /// The failed runtime call, if the runtime is what failed.
    pub(crate) fn runtime(&self) -> Option<&RuntimeError> {
        match self {
            Self::Filesystems(FilesystemsError::Runtime(e))
            | Self::Usage(DiskUsageError::Runtime(e)) => Some(e),
            _ => None,
        }
    }
}

/// Where the imagefs and containerfs signals are measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FsPaths {
    pub imagefs: PathBuf,
    pub containerfs: PathBuf,
}

#[derive(Debug, Clone)]
pub struct DiskReading {
    pub filesystems: RuntimeFilesystems,
    /// Every pod the runtime runs, by uid.
    pub pods: BTreeMap<String, PodDiskUsage>,
}

impl DiskReading {
    /// Asks the runtime and walks the pods' directories under kubelet's
    /// root (`--nodefs-path`). Blocks on the walk: call it off the
    /// decision loop.
    pub async fn read(
        client: &mut RuntimeClient,
        kubelet_root: &Path,
    ) -> Result<Self, ReadingError> {
        let filesystems = RuntimeFilesystems::observe(client, kubelet_root).await?;
        let pods =
            disk_usage::read(client, &kubelet_root.join("pods"), WalkBounds::default()).await?;
        Ok(Self { filesystems, pods })
    }

    /// The snapshot's imagefs and containerfs as the runtime names them,
    /// and its pods' disk fields.
    pub fn fill(&self, snapshot: &mut Snapshot) {
        snapshot.node.imagefs = Some(self.filesystems.imagefs.stats);
        snapshot.node.containerfs = Some(self.filesystems.containerfs.stats);
        fill_pods(&self.pods, &mut snapshot.pods);
    }
}

/// Each pod's disk fields from `usage` (by uid); a pod the runtime does not
/// run keeps its own.
pub(crate) fn fill_pods(
    usage: &BTreeMap<String, PodDiskUsage>,
    pods: &mut [crate::decide::snapshot::PodSnapshot],
) {
    for pod in pods {
        if let Some(disk) = usage.get(&pod.uid) {
            disk.fill(&mut pod.usage);
        }
    }
}
