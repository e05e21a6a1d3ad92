//! A file on a disk-backed filesystem and out of the page cache, for pods
//! whose reads must be charged to them and whose pages can be reclaimed
//! and refault: tmpfs pages are swap-backed, and with no swap they are
//! never reclaimed, so they never refault.
use std::{
    fs::{self, File},
    io::{self, Write as _},
    path::{Path, PathBuf},
};

const MIB: u64 = 1 << 20;

/// A cold file, removed on drop.
pub struct ColdFile(pub PathBuf);

impl ColdFile {
    /// `bytes` (whole MiB) in a file named from `name` under `dir`, which
    /// must not be tmpfs.
    pub fn new(dir: &Path, name: &str, bytes: u64) -> io::Result<Self> {
        let fs = nix::sys::statfs::statfs(dir)?;
        if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC {
            return Err(io::Error::other(format!(
                "{} is tmpfs: a file there never refaults",
                dir.display()
            )));
        }
        let path = dir.join(format!("evictd-{name}-{}", std::process::id()));
        let cold = Self(path);
        let mut file = File::create(&cold.0)?;
        let chunk = vec![0x5a_u8; MIB as usize];
        for _ in 0..bytes / MIB {
            file.write_all(&chunk)?;
        }
        file.sync_all()?;
        // Out of the cache (clean after the sync), so that the pod's reads
        // charge its pages to the pod.
        nix::fcntl::posix_fadvise(
            &file,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )?;
        Ok(cold)
    }

    pub fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for ColdFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}
