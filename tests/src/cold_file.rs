//! A file on a disk-backed filesystem and out of the page cache, for pods
//! whose reads must be charged to them and whose pages can be reclaimed
//! and refault: tmpfs pages are swap-backed, and with no swap they are
//! never reclaimed, so they never refault.
use std::{
    fs::{self, File},
    io::{self, Write as _},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::wait_until;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// How long the kernel gets to let go of the file's last cached pages.
const DROPPED_WITHIN: Duration = Duration::from_secs(5);

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
        // Readable too: mincore looks through a read-only mapping.
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&cold.0)?;
        let chunk = vec![0x5a_u8; MIB as usize];
        for _ in 0..bytes / MIB {
            file.write_all(&chunk)?;
        }
        file.sync_all()?;
        // Out of the cache (clean after the sync), so that the pod's reads
        // charge its pages to the pod: a page left cached stays charged to
        // this process and is counted in no pod's working set. The kernel
        // skips a page it holds for a moment (in a per-CPU batch, say), so
        // the test looks and asks again.
        let mut resident = 0;
        let dropped = wait_until(DROPPED_WITHIN, "the file out of the page cache", || {
            let advised = nix::fcntl::posix_fadvise(
                &file,
                0,
                0,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            );
            resident = resident_pages(&file, bytes).unwrap_or(u64::MAX);
            advised.is_ok() && resident == 0
        });
        match dropped {
            Ok(()) => Ok(cold),
            Err(_) => Err(io::Error::other(format!(
                "{resident} pages of {} stay in the page cache",
                cold.path()
            ))),
        }
    }

    pub fn path(&self) -> String {
        self.0.display().to_string()
    }
}

/// How many of the `bytes` of `file` are in the page cache: mincore(2)
/// on a mapping of it that touches none.
fn resident_pages(file: &File, bytes: u64) -> io::Result<u64> {
    let length = bytes as usize;
    let mut in_core = vec![0_u8; bytes.div_ceil(PAGE) as usize];
    // SAFETY: a fresh read-only mapping of the file, never dereferenced,
    // unmapped before return; `in_core` has a byte per page of it.
    unsafe {
        let mapping = libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        if mapping == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let looked = libc::mincore(mapping, length, in_core.as_mut_ptr());
        let error = io::Error::last_os_error();
        libc::munmap(mapping, length);
        if looked != 0 {
            return Err(error);
        }
    }
    Ok(in_core.iter().filter(|page| *page & 1 == 1).count() as u64)
}

impl Drop for ColdFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_just_written_is_in_the_page_cache_and_a_cold_one_is_not() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let cold = ColdFile::new(dir, "cold-file-unit", 4 * MIB).unwrap();
        let file = File::open(&cold.0).unwrap();
        assert_eq!(resident_pages(&file, 4 * MIB).unwrap(), 0);
        io::copy(&mut &file, &mut io::sink()).unwrap();
        assert_eq!(resident_pages(&file, 4 * MIB).unwrap(), 1024);
    }
}
