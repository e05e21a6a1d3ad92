//! A bounded `du -x`: what kubelet's `DiskUsage` (pkg/volume/util/fs)
//! counts for a directory (blocks allocated, `st_blocks`, and inodes; each
//! hard-linked file once; on the directory's own filesystem; symlinks not
//! followed), walked so that nothing a pod puts in its volumes can make the
//! walk hang, escape its volume, grow the agent without bound, or blind it
//! to the other pods:
//!
//! - **Memory** stays flat: a directory is read a buffer of entries at a
//!   time through a descriptor held open for each level walked, so the walk
//!   holds one directory buffer per level, however many entries there are.
//!   kubelet's `filepath.Walk` reads each directory whole (300,000 names in
//!   one directory are 300,000 strings), and evictd's previous walk queued
//!   every entry of the tree before visiting any.
//! - **Entries, depth and time** are bounded per pod ([`WalkBounds`]): the
//!   pod's logs and volumes share one [`Walk`], and a walk cut short leaves
//!   a lower bound, which the caller knows ([`Shortfall`]).
//! - **Nothing is opened but directories**, each relative to its parent's
//!   descriptor with `O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK`: a symlink,
//!   FIFO, socket or device node is only `stat`ed, even one swapped in for
//!   a directory between its `stat` and its `open`; a directory on another
//!   filesystem (a mount point) is not entered.
//! - **A directory that cannot be read** (EACCES without
//!   `CAP_DAC_READ_SEARCH`, or refused by an LSM) is skipped, not fatal:
//!   its pod's figure becomes a lower bound, and no other pod's changes.
//!
//! Hard links: a file with N links counts 1/N at each link found, so a file
//! whose links are all in the walk counts once, as kubelet's set of seen
//! inodes has it, with no set to grow. A pod's hard links are all in the
//! volume they were made in: link(2) does not cross the volume's bind
//! mount (EXDEV).
use std::{
    ffi::{CString, OsStr},
    io,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use rustix::{
    fd::OwnedFd,
    fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, Stat},
    io::Errno,
};
use serde::Serialize;

use super::FsUsage;

/// How far one pod's walk may go in one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkBounds {
    /// Entries `stat`ed. About a second's work on a local disk with warm
    /// caches; far more files than a pod's logs and volumes hold but for
    /// a pod that means to outlast the walk.
    pub max_entries: u64,
    /// Directories open at once (one descriptor and one buffer of at most
    /// ~32 KiB each).
    pub max_depth: usize,
    /// The pod's share of a reading: the freshness window of the pods' disk
    /// usage (`link::USAGE_MAX_AGE`), past which its figure would be stale
    /// before it is used.
    pub max_time: Duration,
}

impl Default for WalkBounds {
    fn default() -> Self {
        Self {
            max_entries: 1_000_000,
            max_depth: 128,
            max_time: Duration::from_secs(10),
        }
    }
}

/// Why a pod's walk could not see all of its logs and volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Incomplete {
    /// A directory or entry the agent could not read.
    Unreadable,
    /// More entries than [`WalkBounds::max_entries`].
    Entries,
    /// Directories nested deeper than [`WalkBounds::max_depth`].
    Depth,
    /// Walking took longer than [`WalkBounds::max_time`].
    Time,
}

impl Incomplete {
    pub(crate) const ALL: [Incomplete; 4] = [
        Incomplete::Unreadable,
        Incomplete::Entries,
        Incomplete::Depth,
        Incomplete::Time,
    ];

    /// The `reason` label of `evictd_pods_disk_usage_incomplete`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Incomplete::Unreadable => "unreadable",
            Incomplete::Entries => "entries",
            Incomplete::Depth => "depth",
            Incomplete::Time => "time",
        }
    }
}

/// Where, and why, a pod's walk first fell short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shortfall {
    pub reason: Incomplete,
    pub path: PathBuf,
    /// What the kernel said, for [`Incomplete::Unreadable`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a [`Walk`] measured under one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Measured {
    /// At least this much: all of it when `whole`.
    pub usage: FsUsage,
    pub whole: bool,
}

/// One pod's walk through its logs and volumes, within one budget.
#[derive(Debug)]
pub struct Walk {
    bounds: WalkBounds,
    entries: u64,
    started: Instant,
    /// Set once the entries or the time are spent: nothing more is walked.
    spent: bool,
    /// How many times the walk fell short, to tell whether a path was seen
    /// whole; the first [`Shortfall`] is kept.
    falls: u64,
    shortfall: Option<Shortfall>,
}

/// How many entries between two looks at the clock.
const CLOCK_EVERY: u64 = 256;

impl Walk {
    pub(crate) fn new(bounds: WalkBounds) -> Self {
        Self {
            bounds,
            entries: 0,
            started: Instant::now(),
            spent: false,
            falls: 0,
            shortfall: None,
        }
    }

    /// `du -x path` within what is left of the budget; a missing path is
    /// nothing, and whole.
    pub(crate) fn du(&mut self, path: &Path) -> Measured {
        let falls = self.falls;
        let mut tally = Tally::default();
        self.walk(path, &mut tally);
        Measured {
            usage: tally.total(),
            whole: self.falls == falls,
        }
    }

    /// A path the caller could not list (a volumes directory): the walk
    /// falls short there.
    pub(crate) fn unreadable(&mut self, path: &Path, error: &io::Error) {
        self.fall_short(Incomplete::Unreadable, path, Some(error.to_string()));
    }

    /// Where the walk first fell short, if it did.
    pub fn shortfall(&self) -> Option<&Shortfall> {
        self.shortfall.as_ref()
    }

    pub(crate) fn into_shortfall(self) -> Option<Shortfall> {
        self.shortfall
    }

    fn fall_short(&mut self, reason: Incomplete, path: &Path, error: Option<String>) {
        self.falls += 1;
        self.shortfall.get_or_insert_with(|| Shortfall {
            reason,
            path: path.to_owned(),
            error,
        });
    }

    /// Counts one entry against the budget; false (and the walk falls
    /// short, at `path`) once the entries or the time are spent.
    fn take_entry(&mut self, path: impl FnOnce() -> PathBuf) -> bool {
        if !self.spent {
            self.entries += 1;
            let reason = if self.entries > self.bounds.max_entries {
                Some(Incomplete::Entries)
            } else if self.entries.is_multiple_of(CLOCK_EVERY)
                && self.started.elapsed() > self.bounds.max_time
            {
                Some(Incomplete::Time)
            } else {
                None
            };
            match reason {
                Some(reason) => {
                    self.spent = true;
                    self.fall_short(reason, &path(), None);
                }
                None => return true,
            }
        } else {
            self.falls += 1;
        }
        false
    }

    fn walk(&mut self, root: &Path, tally: &mut Tally) {
        let root_stat = match rustix::fs::statat(CWD, root, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => return,
            Err(e) => return self.fall_short(Incomplete::Unreadable, root, Some(e.to_string())),
        };
        if !self.take_entry(|| root.to_owned()) {
            return;
        }
        // Whatever links the root has, they are outside the walk.
        tally.count_whole(&root_stat);
        if !is_dir(&root_stat) {
            return;
        }
        let dir = match open_dir(CWD, root.as_os_str(), &root_stat) {
            Ok(Some(dir)) => dir,
            Ok(None) => return,
            Err(e) => return self.fall_short(Incomplete::Unreadable, root, Some(e.to_string())),
        };
        let device = root_stat.st_dev;
        // The directories open, outermost first, with the name each was
        // entered by (to name a path when the walk falls short there).
        let mut levels: Vec<(Dir, CString)> = vec![(dir, CString::default())];
        while let Some((dir, _)) = levels.last_mut() {
            let entry = match dir.read() {
                None => {
                    levels.pop();
                    continue;
                }
                Some(Ok(entry)) => entry,
                Some(Err(e)) => {
                    let path = path_of(root, &levels, None);
                    self.fall_short(Incomplete::Unreadable, &path, Some(e.to_string()));
                    levels.pop();
                    continue;
                }
            };
            let name = entry.file_name();
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            if !self.take_entry(|| path_of(root, &levels, Some(name))) {
                return;
            }
            let Some((dir, _)) = levels.last() else {
                return;
            };
            let Ok(parent) = dir.fd() else {
                return;
            };
            let stat = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                // Removed since it was listed.
                Err(Errno::NOENT) => continue,
                Err(e) => {
                    let path = path_of(root, &levels, Some(name));
                    self.fall_short(Incomplete::Unreadable, &path, Some(e.to_string()));
                    continue;
                }
            };
            // A mount below: another filesystem's usage, not this one's.
            if stat.st_dev != device {
                continue;
            }
            tally.count(&stat);
            if !is_dir(&stat) {
                continue;
            }
            if levels.len() >= self.bounds.max_depth {
                let path = path_of(root, &levels, Some(name));
                self.fall_short(Incomplete::Depth, &path, None);
                continue;
            }
            match open_dir(parent, OsStr::from_bytes(name.to_bytes()), &stat) {
                Ok(Some(child)) => levels.push((child, name.to_owned())),
                Ok(None) => {}
                Err(e) => {
                    let path = path_of(root, &levels, Some(name));
                    self.fall_short(Incomplete::Unreadable, &path, Some(e.to_string()));
                }
            }
        }
    }
}

fn is_dir(stat: &Stat) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::Directory
}

/// Opens directory `name` of `parent` that was `stat`ed as `expected`.
/// `None` when it is no longer that directory (removed, or replaced by
/// anything else: a symlink fails `O_NOFOLLOW`, anything but a directory
/// fails `O_DIRECTORY` before it is opened, another directory or a mount
/// differs in device or inode).
fn open_dir(
    parent: impl rustix::fd::AsFd,
    name: &OsStr,
    expected: &Stat,
) -> Result<Option<Dir>, Errno> {
    let flags =
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd: OwnedFd = match rustix::fs::openat(parent, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let opened = rustix::fs::fstat(&fd)?;
    if (opened.st_dev, opened.st_ino) != (expected.st_dev, expected.st_ino) {
        return Ok(None);
    }
    Dir::new(fd).map(Some)
}

/// The path of the directory open at the innermost level, or of its entry
/// `name`.
fn path_of(root: &Path, levels: &[(Dir, CString)], name: Option<&std::ffi::CStr>) -> PathBuf {
    let mut path = root.to_owned();
    let names = levels.iter().skip(1).map(|(_, name)| name.as_c_str());
    for part in names.chain(name) {
        path.push(OsStr::from_bytes(part.to_bytes()));
    }
    path
}

/// Bytes allocated, as `du` counts them: 512-byte blocks.
fn blocks_bytes(stat: &Stat) -> u64 {
    u64::try_from(stat.st_blocks)
        .unwrap_or(0)
        .saturating_mul(512)
}

/// Fixed-point fraction bits for the share of a hard-linked file.
const SHARE_BITS: u32 = 20;

/// Usage summed entry by entry; a file with N links adds 1/N of itself.
#[derive(Debug, Default)]
struct Tally {
    whole: FsUsage,
    /// Shares of hard-linked files, in units of 2^-SHARE_BITS: a share is
    /// off by less than one unit, a million links by less than a byte.
    shared_bytes: u128,
    shared_inodes: u128,
}

impl Tally {
    fn count_whole(&mut self, stat: &Stat) {
        self.whole.add(FsUsage {
            bytes: blocks_bytes(stat),
            inodes: 1,
        });
    }

    fn count(&mut self, stat: &Stat) {
        let bytes = blocks_bytes(stat);
        // nlink_t is u64 on x86_64, u32 elsewhere: u128 takes both.
        let links = u128::from(stat.st_nlink);
        // A directory's link count is its subdirectories', not hard links.
        if links <= 1 || is_dir(stat) {
            self.whole.add(FsUsage { bytes, inodes: 1 });
        } else {
            self.shared_bytes += (u128::from(bytes) << SHARE_BITS) / links;
            self.shared_inodes += (1u128 << SHARE_BITS) / links;
        }
    }

    fn total(&self) -> FsUsage {
        let round = |shares: u128| {
            u64::try_from((shares + (1 << (SHARE_BITS - 1))) >> SHARE_BITS).unwrap_or(u64::MAX)
        };
        let mut total = self.whole;
        total.add(FsUsage {
            bytes: round(self.shared_bytes),
            inodes: round(self.shared_inodes),
        });
        total
    }
}

#[cfg(test)]
mod tests;
