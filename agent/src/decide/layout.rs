//! Where a node keeps image layers and writable layers against nodefs:
//! kubelet's two flags `withImageFs` (`HasDedicatedImageFs`) and
//! `splitContainerImageFs` (`IsContainerFsSeparateFromImageFs`, KEP-4191),
//! which decide what a disk signal ranks pods by
//! (`buildSignalToRankFunc`), what node-level reclaim removes for it
//! (`buildSignalToNodeReclaimFuncs`) and where the containerfs thresholds
//! come from (`UpdateContainerFsThresholds`).
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskLayout {
    /// One filesystem for everything: imagefs is nodefs.
    Shared,
    /// Images and writable layers on a filesystem of their own (kubelet's
    /// `withImageFs`).
    DedicatedImageFs,
    /// Images on a filesystem of their own, writable layers on nodefs
    /// (kubelet's `withImageFs && splitContainerImageFs`).
    SplitImageFs,
}

impl DiskLayout {
    /// From the filesystems' device numbers (`st_dev`), as the runtime's
    /// `ImageFsInfo` names them; `None` for what kubelet refuses.
    pub(crate) fn from_devices(nodefs: u64, imagefs: u64, containerfs: u64) -> Option<Self> {
        match (imagefs == nodefs, containerfs == imagefs) {
            (true, true) => Some(Self::Shared),
            (false, true) => Some(Self::DedicatedImageFs),
            (false, false) if containerfs == nodefs => Some(Self::SplitImageFs),
            // Writable layers on a third filesystem, or on a dedicated one
            // while the images share nodefs: kubelet refuses both.
            _ => None,
        }
    }

    /// kubelet's `dedicatedImageFs`: an imagefs that is not nodefs. The
    /// container ephemeral-storage check (writable layers count only
    /// without one) takes this, in the split layout too.
    pub(crate) fn dedicated_imagefs(self) -> bool {
        self != Self::Shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_by_device() {
        assert_eq!(DiskLayout::from_devices(1, 1, 1), Some(DiskLayout::Shared));
        assert_eq!(
            DiskLayout::from_devices(1, 2, 2),
            Some(DiskLayout::DedicatedImageFs)
        );
        assert_eq!(
            DiskLayout::from_devices(1, 2, 1),
            Some(DiskLayout::SplitImageFs)
        );
        assert_eq!(DiskLayout::from_devices(1, 2, 3), None);
        assert_eq!(DiskLayout::from_devices(1, 1, 3), None);
        assert!(!DiskLayout::Shared.dedicated_imagefs());
        assert!(DiskLayout::DedicatedImageFs.dedicated_imagefs());
        assert!(DiskLayout::SplitImageFs.dedicated_imagefs());
    }
}
