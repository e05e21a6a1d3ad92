//! The runtime's filesystems, as kubelet learns them from `ImageFsInfo`:
//! the imagefs (where image layers are unpacked) and the containerfs (where
//! writable layers live: the same filesystem unless the runtime reports
//! `container_filesystems` apart, the split layout of KEP-4191), each
//! measured by statvfs, and how they sit against nodefs (kubelet's root
//! directory), decided by device number as cadvisor decides it for kubelet.
use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use k8s_cri::v1::{FilesystemUsage, ImageFsInfoResponse};
use serde::Serialize;

use super::{RuntimeClient, RuntimeError};
pub use crate::decide::layout::DiskLayout;
use crate::{
    decide::snapshot::FsStats,
    node::stats::{SignalsError, statvfs},
};

#[derive(Debug, thiserror::Error)]
pub enum FilesystemsError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("CRI ImageFsInfo on {}: the runtime reports no image filesystem", socket.display())]
    NoImageFs { socket: PathBuf },
    #[error("{what} {}: {source}", path.display())]
    Stat {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Statvfs(#[from] SignalsError),
    #[error(
        "the runtime keeps writable layers on {} (device {containerfs:#x}) apart from both its images (device {imagefs:#x}) and nodefs (device {nodefs:#x}); kubelet supports a separate containerfs only on nodefs",
        mountpoint.display()
    )]
    ContainerFsNotOnNodeFs {
        mountpoint: PathBuf,
        nodefs: u64,
        imagefs: u64,
        containerfs: u64,
    },
}

/// One filesystem the runtime reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimeFilesystem {
    /// The runtime's own directory on it (containerd: its snapshotter's).
    pub mountpoint: PathBuf,
    pub device: u64,
    /// The whole filesystem, by statvfs: what the imagefs and containerfs
    /// signals observe.
    pub stats: FsStats,
    /// What the runtime says its images (or writable layers) take there.
    pub runtime_used_bytes: Option<u64>,
    pub runtime_inodes_used: Option<u64>,
}

/// The imagefs and containerfs, and how they sit against nodefs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimeFilesystems {
    pub imagefs: RuntimeFilesystem,
    pub containerfs: RuntimeFilesystem,
    pub layout: DiskLayout,
}

impl RuntimeFilesystems {
    /// Asks the runtime (`ImageFsInfo`) and measures what it names;
    /// `nodefs` is kubelet's root directory (`--nodefs-path`).
    pub async fn observe(
        client: &mut RuntimeClient,
        nodefs: &Path,
    ) -> Result<Self, FilesystemsError> {
        let info = client.image_fs_info().await?;
        Self::from_info(&info, nodefs, client.socket())
    }

    /// [`observe`](Self::observe) on an answer already in hand.
    pub fn from_info(
        info: &ImageFsInfoResponse,
        nodefs: &Path,
        socket: &Path,
    ) -> Result<Self, FilesystemsError> {
        let image = info
            .image_filesystems
            .first()
            .ok_or_else(|| FilesystemsError::NoImageFs {
                socket: socket.to_owned(),
            })?;
        let imagefs = measure(image)?;
        // Without container_filesystems (containerd before 2.0 never sends
        // them) writable layers are on the imagefs, as kubelet assumes.
        let containerfs = match info.container_filesystems.first() {
            Some(container) => measure(container)?,
            None => imagefs.clone(),
        };
        let nodefs_device = device("nodefs", nodefs)?;
        let layout = DiskLayout::from_devices(nodefs_device, imagefs.device, containerfs.device)
            .ok_or_else(|| FilesystemsError::ContainerFsNotOnNodeFs {
                mountpoint: containerfs.mountpoint.clone(),
                nodefs: nodefs_device,
                imagefs: imagefs.device,
                containerfs: containerfs.device,
            })?;
        Ok(Self {
            imagefs,
            containerfs,
            layout,
        })
    }
}

fn measure(usage: &FilesystemUsage) -> Result<RuntimeFilesystem, FilesystemsError> {
    let mountpoint = PathBuf::from(
        usage
            .fs_id
            .as_ref()
            .map(|id| id.mountpoint.as_str())
            .unwrap_or_default(),
    );
    let device = device("runtime filesystem", &mountpoint)?;
    let stats = statvfs(&mountpoint)?.ok_or_else(|| FilesystemsError::Stat {
        what: "runtime filesystem",
        path: mountpoint.clone(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })?;
    Ok(RuntimeFilesystem {
        mountpoint,
        device,
        stats,
        runtime_used_bytes: usage.used_bytes.as_ref().map(|v| v.value),
        runtime_inodes_used: usage.inodes_used.as_ref().map(|v| v.value),
    })
}

fn device(what: &'static str, path: &Path) -> Result<u64, FilesystemsError> {
    std::fs::metadata(path)
        .map(|m| m.dev())
        .map_err(|source| FilesystemsError::Stat {
            what,
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use k8s_cri::v1::{FilesystemIdentifier, UInt64Value};

    use super::*;

    fn usage(mountpoint: &Path, used: u64) -> FilesystemUsage {
        FilesystemUsage {
            timestamp: 1,
            fs_id: Some(FilesystemIdentifier {
                mountpoint: mountpoint.display().to_string(),
            }),
            used_bytes: Some(UInt64Value { value: used }),
            inodes_used: Some(UInt64Value { value: 7 }),
        }
    }

    #[test]
    fn one_filesystem_for_all_is_shared_and_containerfs_is_the_imagefs() {
        let dir = tempfile::tempdir().unwrap();
        let snapshots = dir.path().join("snapshots");
        std::fs::create_dir(&snapshots).unwrap();
        let info = ImageFsInfoResponse {
            image_filesystems: vec![usage(&snapshots, 4096)],
            container_filesystems: vec![],
        };
        let found =
            RuntimeFilesystems::from_info(&info, dir.path(), Path::new("/cri.sock")).unwrap();
        assert_eq!(found.layout, DiskLayout::Shared);
        assert_eq!(found.imagefs.mountpoint, snapshots);
        assert_eq!(found.imagefs.runtime_used_bytes, Some(4096));
        assert_eq!(found.imagefs.runtime_inodes_used, Some(7));
        assert!(found.imagefs.stats.capacity_bytes > 0);
        assert_eq!(found.containerfs, found.imagefs);
    }

    #[test]
    fn a_runtime_without_an_image_filesystem_or_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let none = ImageFsInfoResponse::default();
        let err =
            RuntimeFilesystems::from_info(&none, dir.path(), Path::new("/cri.sock")).unwrap_err();
        assert!(matches!(err, FilesystemsError::NoImageFs { .. }), "{err}");
        let missing = ImageFsInfoResponse {
            image_filesystems: vec![usage(&dir.path().join("gone"), 0)],
            container_filesystems: vec![],
        };
        let err = RuntimeFilesystems::from_info(&missing, dir.path(), Path::new("/cri.sock"))
            .unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
    }
}
