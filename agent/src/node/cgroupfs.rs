//! cgroupfs: where the memory, pids and (v1) freezer controllers are
//! mounted, and fresh reads of the values the kernel programs track.
use std::{
    collections::HashMap,
    fs,
    io::{self, Read as _},
    os::{
        fd::{AsFd, BorrowedFd},
        unix::fs::{FileExt as _, MetadataExt as _},
    },
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock, PoisonError},
};

use crate::decide::memory_high::ContainerReading;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The cgroup was removed while being read: routine for pod cgroups.
    #[error("{0}: cgroup is gone")]
    Gone(PathBuf),
    #[error("{path}: cannot parse {text:?}")]
    Parse { path: PathBuf, text: String },
    #[error(
        "no cgroup hierarchy with the memory controller is mounted (looked in /proc/self/mountinfo)"
    )]
    NoMemoryController,
    #[error("no cgroup hierarchy with the pids controller is mounted")]
    NoPidsController,
}

impl CgroupError {
    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        if is_gone(&source) {
            Self::Gone(path.to_owned())
        } else {
            Self::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}

/// Whether `error` means the cgroup was removed: ENOENT for a path looked
/// up after the removal, ENODEV for a file opened before it (kernfs
/// deactivates the files of a removed cgroup, so a read between `open` and
/// `read` fails so).
pub(crate) fn is_gone(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ENODEV)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// A one-number cgroup file kept open. Each read is one `pread` at offset
/// 0, which makes kernfs generate the value afresh: one system call where
/// reading by path takes five (open, statx, two reads, close), about a
/// tenth of the time, which is what a decision listing hundreds of pods
/// spends most of its time on.
#[derive(Debug)]
pub(crate) struct OpenValue {
    path: PathBuf,
    file: fs::File,
}

impl OpenValue {
    /// Opens the one-number file at `path` to be read again and again.
    pub(crate) fn open(path: PathBuf) -> Result<Self, CgroupError> {
        let file = fs::File::open(&path).map_err(|e| CgroupError::io(&path, e))?;
        Ok(Self { path, file })
    }

    /// The value now; [`CgroupError::Gone`] once the cgroup was removed
    /// (kernfs answers ENODEV for a removed cgroup's open files).
    pub(crate) fn read_u64(&self) -> Result<u64, CgroupError> {
        // A u64 has at most 20 digits, plus the newline; a text that fills
        // the buffer is read whole, so that it reads as it does by path.
        let mut buf = [0u8; 32];
        let len = self
            .file
            .read_at(&mut buf, 0)
            .map_err(|e| CgroupError::io(&self.path, e))?;
        let text = if len < buf.len() {
            String::from_utf8_lossy(&buf[..len])
        } else {
            read_whole_at_zero(&self.file)
                .map_err(|e| CgroupError::io(&self.path, e))?
                .into()
        };
        text.trim().parse().map_err(|_| CgroupError::Parse {
            path: self.path.clone(),
            text: text.trim().to_owned(),
        })
    }
}

impl AsFd for OpenValue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// A pod cgroup's memory files kept open: the bytes charged, which a
/// memory listing ranks every pod by, and memory.stat, which makes that
/// the working set for the few pods a decision turns on. Each is one
/// `pread` where reading by path takes five system calls.
#[derive(Debug)]
pub struct OpenMemory {
    charged: OpenValue,
    stat: fs::File,
    stat_path: PathBuf,
    inactive_file_field: &'static str,
    /// v2's memory.pressure, read for the pod's stall counters
    /// ([`crate::node::stalls`]): opened at their first reading, a timer's
    /// work, not by the listing a decision may wait for. `None` on v1,
    /// which has none.
    pressure: Option<OnceLock<Option<fs::File>>>,
}

impl OpenMemory {
    /// Descriptors each holds, at most.
    pub(crate) const FILES: usize = 3;

    /// The text of memory.stat and, on v2, of memory.pressure, read now.
    pub(crate) fn stall_texts(&self) -> Result<StallTexts, CgroupError> {
        let stat =
            read_whole_at_zero(&self.stat).map_err(|e| CgroupError::io(&self.stat_path, e))?;
        let path = self.stat_path.with_file_name(PRESSURE);
        let file = match &self.pressure {
            None => None,
            Some(kept) => match kept.get() {
                Some(file) => file.as_ref(),
                None => match fs::File::open(&path) {
                    Ok(file) => kept.get_or_init(|| Some(file)).as_ref(),
                    // A kernel booted with psi=0 has no such file: no
                    // stall counters, for good.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        kept.get_or_init(|| None).as_ref()
                    }
                    // Anything else is this reading's failure, tried again
                    // at the next, not a pod without PSI from now on.
                    Err(e) => return Err(CgroupError::io(&path, e)),
                },
            },
        };
        let pressure = match file {
            Some(file) => Some(read_bounded_at_zero(file).map_err(|e| CgroupError::io(&path, e))?),
            None => None,
        };
        Ok(StallTexts { stat, pressure })
    }

    /// The bytes charged now; [`CgroupError::Gone`] once the cgroup was
    /// removed.
    pub fn charged(&self) -> Result<u64, CgroupError> {
        self.charged.read_u64()
    }

    /// [`CgroupFs::read_memory`] through the open files.
    pub fn read(&self) -> Result<MemoryReading, CgroupError> {
        let usage_bytes = self.charged()?;
        let text =
            read_whole_at_zero(&self.stat).map_err(|e| CgroupError::io(&self.stat_path, e))?;
        Ok(MemoryReading {
            usage_bytes,
            inactive_file_bytes: keyed_field(&text, &self.stat_path, self.inactive_file_field)?,
        })
    }
}

/// A cgroup's memory.stat, and its memory.pressure where it has one (v2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StallTexts {
    pub stat: String,
    pub pressure: Option<String>,
}

/// v2's per-cgroup memory PSI file.
const PRESSURE: &str = "memory.pressure";

/// The most of memory.pressure read: its two lines are about 140 bytes
/// with 20-digit totals, so a text that fills this is not PSI's.
const PRESSURE_MAX_BYTES: usize = 512;

/// The text of a small kernel file from offset 0 in one `pread`, refused
/// (InvalidData) when it fills [`PRESSURE_MAX_BYTES`].
fn read_bounded_at_zero(file: &fs::File) -> io::Result<String> {
    let mut buf = [0u8; PRESSURE_MAX_BYTES];
    let len = file.read_at(&mut buf, 0)?;
    if len == buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {PRESSURE_MAX_BYTES} bytes"),
        ));
    }
    String::from_utf8(buf[..len].to_vec())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Text files read again and again (the node's own cgroup files, the
/// procfs files of its signals), kept open. Each read is one `pread` at
/// offset 0, which makes kernfs and procfs generate the text afresh, where
/// reading by path costs an open, a statx, a read per doubling of the
/// buffer and a close: most of what an idle agent's resync costs. A file
/// whose cgroup was removed (ENODEV) is opened again by path, once.
#[derive(Debug, Default)]
pub struct KeptOpen {
    files: Mutex<HashMap<PathBuf, fs::File>>,
}

/// A clone opens its own files as it reads them.
impl Clone for KeptOpen {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl KeptOpen {
    /// The whole text of `path` now, as [`fs::read_to_string`] gives it.
    pub(crate) fn read_to_string(&self, path: &Path) -> io::Result<String> {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(file) = files.get(path) {
            match read_whole_at_zero(file) {
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                    files.remove(path);
                }
                read => return read,
            }
        }
        let file = fs::File::open(path)?;
        let text = read_whole_at_zero(&file)?;
        files.insert(path.to_owned(), file);
        Ok(text)
    }
}

/// The text of `file` from offset 0, read in one `pread` when it fits the
/// buffer; a text that fills it is read again whole into a larger one.
fn read_whole_at_zero(file: &fs::File) -> io::Result<String> {
    let mut buf = vec![0u8; 4096];
    loop {
        let len = file.read_at(&mut buf, 0)?;
        if len < buf.len() {
            buf.truncate(len);
            return String::from_utf8(buf)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
        }
        buf.resize(buf.len() * 2, 0);
    }
}

/// Mount points of the controllers evictd reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupFs {
    pub version: CgroupVersion,
    pub memory_root: PathBuf,
    pub pids_root: Option<PathBuf>,
    /// The v1 freezer hierarchy, which the kill executor uses to stop a pod
    /// forking while it is killed. Always `None` on v2, whose freezer is
    /// `cgroup.freeze` in every cgroup and whose `cgroup.kill` needs none.
    pub freezer_root: Option<PathBuf>,
}

/// Memory of one cgroup as kubelet sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReading {
    /// Bytes charged (v1 `memory.usage_in_bytes`, v2 `memory.current`): the
    /// value the kernel programs compare with thresholds.
    pub usage_bytes: u64,
    pub inactive_file_bytes: u64,
}

impl MemoryReading {
    /// kubelet's working set: usage minus inactive file pages.
    pub fn working_set_bytes(&self) -> u64 {
        self.usage_bytes.saturating_sub(self.inactive_file_bytes)
    }
}

/// A cgroup's active file pages and how many file pages refaulted since
/// it was made (its descendants' included), from memory.stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileCache {
    pub active_file_bytes: u64,
    pub refaulted_file_pages: u64,
}

impl CgroupFs {
    /// A cgroup filesystem of `version` with only a memory hierarchy, at
    /// `memory_root`: the unit tests' directories of plain files.
    #[cfg(test)]
    pub(crate) fn memory_only(version: CgroupVersion, memory_root: &Path) -> Self {
        Self {
            version,
            memory_root: memory_root.to_owned(),
            pids_root: None,
            freezer_root: None,
        }
    }

    /// Finds the controllers from `/proc/self/mountinfo`. A cgroup2 mount
    /// counts only if it offers the memory controller (on a hybrid host the
    /// unified mount has none).
    pub fn discover() -> Result<Self, CgroupError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = fs::read_to_string(path).map_err(|e| CgroupError::io(path, e))?;
        Self::from_mountinfo(&text, |root| {
            fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default()
        })
    }

    fn from_mountinfo(
        mountinfo: &str,
        v2_controllers: impl Fn(&Path) -> String,
    ) -> Result<Self, CgroupError> {
        let mut v1_memory = None;
        let mut v1_pids = None;
        let mut v1_freezer = None;
        let mut v2 = None;
        for line in mountinfo.lines() {
            // id parent major:minor root mount-point options [optional...] - fstype source super-options
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mount_point) = left.split(' ').nth(4) else {
                continue;
            };
            let mut right = right.split(' ');
            let (Some(fstype), Some(_source), Some(super_options)) =
                (right.next(), right.next(), right.next())
            else {
                continue;
            };
            let mount_point = PathBuf::from(mount_point);
            match fstype {
                "cgroup" => {
                    let options: Vec<&str> = super_options.split(',').collect();
                    if options.contains(&"memory") {
                        keep_first_or_topmost(&mut v1_memory, &mount_point);
                    }
                    if options.contains(&"pids") {
                        keep_first_or_topmost(&mut v1_pids, &mount_point);
                    }
                    if options.contains(&"freezer") {
                        keep_first_or_topmost(&mut v1_freezer, &mount_point);
                    }
                }
                "cgroup2" => {
                    let controllers = v2_controllers(&mount_point);
                    if controllers.split_whitespace().any(|c| c == "memory") {
                        let has_pids = controllers.split_whitespace().any(|c| c == "pids");
                        let mut root = v2.as_ref().map(|(root, _)| PathBuf::clone(root));
                        keep_first_or_topmost(&mut root, &mount_point);
                        if root.as_ref() == Some(&mount_point) {
                            v2 = Some((mount_point, has_pids));
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(memory_root) = v1_memory {
            return Ok(Self {
                version: CgroupVersion::V1,
                memory_root,
                pids_root: v1_pids,
                freezer_root: v1_freezer,
            });
        }
        match v2 {
            Some((root, has_pids)) => Ok(Self {
                version: CgroupVersion::V2,
                pids_root: has_pids.then(|| root.clone()),
                memory_root: root,
                freezer_root: None,
            }),
            None => Err(CgroupError::NoMemoryController),
        }
    }

    /// Directory of cgroup `path` (relative to the hierarchy root, e.g.
    /// `/kubepods/burstable`) in the memory hierarchy.
    pub fn memory_dir(&self, path: &str) -> PathBuf {
        join(&self.memory_root, path)
    }

    pub fn pids_dir(&self, path: &str) -> Result<PathBuf, CgroupError> {
        let root = self
            .pids_root
            .as_ref()
            .ok_or(CgroupError::NoPidsController)?;
        Ok(join(root, path))
    }

    /// Directory of cgroup `path` in the v1 freezer hierarchy, if mounted.
    pub(crate) fn freezer_dir(&self, path: &str) -> Option<PathBuf> {
        self.freezer_root.as_ref().map(|root| join(root, path))
    }

    /// The kernel's cgroup id: the inode number of the cgroup directory.
    pub(crate) fn cgroup_id(dir: &Path) -> Result<u64, CgroupError> {
        fs::metadata(dir)
            .map(|m| m.ino())
            .map_err(|e| CgroupError::io(dir, e))
    }

    pub fn read_memory(&self, path: &str) -> Result<MemoryReading, CgroupError> {
        self.memory_reading(None, path)
    }

    /// [`CgroupFs::read_memory`] through files kept open.
    pub fn read_memory_kept(
        &self,
        files: &KeptOpen,
        path: &str,
    ) -> Result<MemoryReading, CgroupError> {
        self.memory_reading(Some(files), path)
    }

    fn memory_reading(
        &self,
        files: Option<&KeptOpen>,
        path: &str,
    ) -> Result<MemoryReading, CgroupError> {
        if self.version == CgroupVersion::V2 && is_root(path) {
            return read_root_stat(files, &self.memory_root);
        }
        let dir = self.memory_dir(path);
        Ok(MemoryReading {
            usage_bytes: read_u64(files, &dir.join(self.usage_file_name()))?,
            inactive_file_bytes: stat_field(
                files,
                &dir.join("memory.stat"),
                self.inactive_file_field(),
            )?,
        })
    }

    /// [`FileCache`] of the cgroup at `path` (the root's on either
    /// version: memory.stat is there on both), through `files` where given.
    pub fn read_file_cache(
        &self,
        files: Option<&KeptOpen>,
        path: &str,
    ) -> Result<FileCache, CgroupError> {
        let path = self.memory_dir(path).join("memory.stat");
        let text = read_text(files, &path)?;
        let (active, refaults) = match self.version {
            CgroupVersion::V1 => ("total_active_file", "total_workingset_refault_file"),
            CgroupVersion::V2 => ("active_file", "workingset_refault_file"),
        };
        Ok(FileCache {
            active_file_bytes: keyed_field(&text, &path, active)?,
            refaulted_file_pages: keyed_field(&text, &path, refaults)?,
        })
    }

    /// The file of a (non-root on v2) cgroup's bytes charged.
    fn usage_file_name(&self) -> &'static str {
        match self.version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        }
    }

    /// memory.stat's inactive file pages of the cgroup and its descendants
    /// (v1's `total_` lines are the hierarchical ones).
    fn inactive_file_field(&self) -> &'static str {
        match self.version {
            CgroupVersion::V1 => "total_inactive_file",
            CgroupVersion::V2 => "inactive_file",
        }
    }

    /// Bytes charged to the cgroup alone: one small file, where
    /// [`CgroupFs::read_memory`] also reads `memory.stat`.
    pub fn read_memory_usage(&self, path: &str) -> Result<u64, CgroupError> {
        match self.memory_usage_file(path) {
            Some(file) => read_u64(None, &file),
            None => read_root_stat(None, &self.memory_root).map(|m| m.usage_bytes),
        }
    }

    /// How many times cgroup `path`'s charges met its memory limit since
    /// it was made: v1's `memory.failcnt`, v2's memory.events `max` (its
    /// subtree's included).
    pub(crate) fn memory_limit_hits(&self, path: &str) -> Result<u64, CgroupError> {
        let dir = self.memory_dir(path);
        match self.version {
            CgroupVersion::V1 => read_u64(None, &dir.join("memory.failcnt")),
            CgroupVersion::V2 => {
                let path = dir.join("memory.events");
                keyed_field(&read_text(None, &path)?, &path, "max")
            }
        }
    }

    /// The cgroups directly below `path` (a pod's containers, on v2), by
    /// name, at most `most`: a pod allowed to make cgroups below its own
    /// makes the agent read no more. The second value says whether some
    /// were left out.
    pub(crate) fn child_cgroups(
        &self,
        path: &str,
        most: usize,
    ) -> Result<(Vec<String>, bool), CgroupError> {
        let dir = self.memory_dir(path);
        let entries = fs::read_dir(&dir).map_err(|e| CgroupError::io(&dir, e))?;
        let mut children = Vec::new();
        let mut left_out = false;
        for entry in entries {
            let entry = entry.map_err(|e| CgroupError::io(&dir, e))?;
            if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            if children.len() == most {
                left_out = true;
                break;
            }
            if let Ok(name) = entry.file_name().into_string() {
                children.push(name);
            }
        }
        children.sort_unstable();
        Ok((children, left_out))
    }

    /// Cgroup `path`'s KEP-5986 files (v2): memory.events `high` and
    /// `max`, memory.pressure `some avg10` (none with psi=0), memory.high
    /// and memory.max. Each is the kernel's, read bounded.
    pub(crate) fn container_pressure(
        &self,
        path: &str,
        read_at_ns: u64,
    ) -> Result<ContainerReading, CgroupError> {
        let dir = self.memory_dir(path);
        let read = |name: &str| {
            let path = dir.join(name);
            fs::File::open(&path)
                .and_then(|file| read_bounded_at_zero(&file))
                .map_err(|e| CgroupError::io(&path, e))
        };
        let events_path = dir.join("memory.events");
        let events = read("memory.events")?;
        let pressure = dir.join(PRESSURE);
        let some_avg10 = match fs::File::open(&pressure) {
            // psi=0, as in [`CgroupFs::open_memory`].
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            opened => {
                let text = opened
                    .and_then(|file| read_bounded_at_zero(&file))
                    .map_err(|e| CgroupError::io(&pressure, e))?;
                Some(parse_some_avg10(&text).ok_or(CgroupError::Parse {
                    path: pressure,
                    text,
                })?)
            }
        };
        let limit = |name: &str| -> Result<Option<u64>, CgroupError> {
            let text = read(name)?;
            parse_limit(text.trim()).ok_or_else(|| CgroupError::Parse {
                path: dir.join(name),
                text: text.trim().to_owned(),
            })
        };
        Ok(ContainerReading {
            read_at_ns,
            high_events: keyed_field(&events, &events_path, "high")?,
            max_events: keyed_field(&events, &events_path, "max")?,
            some_avg10,
            memory_high: limit("memory.high")?,
            memory_max: limit("memory.max")?,
        })
    }

    /// KEP-5986's stage 1: raises cgroup `path`'s memory.high to its
    /// memory.max (the text written, `max` where there is no limit).
    pub(crate) fn relax_memory_high(&self, path: &str) -> Result<String, CgroupError> {
        let dir = self.memory_dir(path);
        let max = read_text(None, &dir.join("memory.max"))?;
        let high = dir.join("memory.high");
        fs::write(&high, max.trim()).map_err(|e| CgroupError::io(&high, e))?;
        Ok(max.trim().to_owned())
    }

    /// Cgroup `path`'s memory files, kept open to be read again and again;
    /// `None` for the v2 root, which has none.
    pub fn open_memory(&self, path: &str) -> Result<Option<OpenMemory>, CgroupError> {
        if self.version == CgroupVersion::V2 && is_root(path) {
            return Ok(None);
        }
        let dir = self.memory_dir(path);
        let stat = dir.join("memory.stat");
        let pressure = match self.version {
            CgroupVersion::V1 => None,
            CgroupVersion::V2 => Some(OnceLock::new()),
        };
        Ok(Some(OpenMemory {
            charged: OpenValue::open(dir.join(self.usage_file_name()))?,
            stat: fs::File::open(&stat).map_err(|e| CgroupError::io(&stat, e))?,
            stat_path: stat,
            inactive_file_field: self.inactive_file_field(),
            pressure,
        }))
    }

    /// [`OpenMemory::stall_texts`] of cgroup `path`, read by path (a pod
    /// whose files are not kept open). No per-cgroup PSI on v1.
    pub(crate) fn stall_texts(&self, path: &str) -> Result<StallTexts, CgroupError> {
        let dir = self.memory_dir(path);
        let stat = read_text(None, &dir.join("memory.stat"))?;
        let pressure = match self.version {
            CgroupVersion::V1 => None,
            CgroupVersion::V2 => {
                let path = dir.join(PRESSURE);
                match fs::File::open(&path) {
                    // psi=0, as in [`CgroupFs::open_memory`].
                    Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                    opened => Some(
                        opened
                            .and_then(|file| read_bounded_at_zero(&file))
                            .map_err(|e| CgroupError::io(&path, e))?,
                    ),
                }
            }
        };
        Ok(StallTexts { stat, pressure })
    }

    /// Where a cgroup's bytes charged are; `None` for the v2 root, whose
    /// usage comes from its memory.stat.
    fn memory_usage_file(&self, path: &str) -> Option<PathBuf> {
        match self.version {
            CgroupVersion::V2 if is_root(path) => None,
            _ => Some(self.memory_dir(path).join(self.usage_file_name())),
        }
    }

    pub fn read_pids(&self, path: &str) -> Result<u64, CgroupError> {
        read_u64(None, &self.pids_dir(path)?.join("pids.current"))
    }

    /// [`CgroupFs::read_pids`] through files kept open.
    pub fn read_pids_kept(&self, files: &KeptOpen, path: &str) -> Result<u64, CgroupError> {
        read_u64(Some(files), &self.pids_dir(path)?.join("pids.current"))
    }

    /// Processes in cgroup `path` and its descendants, not threads: the
    /// lines of every `cgroup.procs` in the subtree. kubelet ranks pods
    /// under PID pressure by their processes, the sum over their containers
    /// of cadvisor's `ProcessCount` (lines of the container cgroup's
    /// `cgroup.procs`, `processStatsFromProcs`), where `pids.current` would
    /// count every thread.
    pub fn count_processes(&self, path: &str) -> Result<u64, CgroupError> {
        count_processes(&self.memory_dir(path))
    }

    /// Whether a process runs in cgroup `path` or below.
    pub fn has_processes(&self, path: &str) -> Result<bool, CgroupError> {
        any_process(&self.memory_dir(path))
    }
}

/// [`CgroupFs::count_processes`] below `dir`. A descendant removed while
/// it is counted counts nothing; `dir` itself removed is [`CgroupError::Gone`].
fn count_processes(dir: &Path) -> Result<u64, CgroupError> {
    let procs = dir.join("cgroup.procs");
    let text = fs::read_to_string(&procs).map_err(|e| CgroupError::io(&procs, e))?;
    let mut count = text.lines().filter(|l| !l.trim().is_empty()).count() as u64;
    let entries = fs::read_dir(dir).map_err(|e| CgroupError::io(dir, e))?;
    for entry in entries.filter_map(Result::ok) {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            match count_processes(&entry.path()) {
                Ok(n) => count += n,
                Err(CgroupError::Gone(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(count)
}

/// [`CgroupFs::has_processes`] below `dir`, in as few system calls as it
/// can, since a memory decision asks it of the pod it is about to take:
/// one read of each `cgroup.procs`, enough to see that it is not empty,
/// and a cgroup's children listed (the costliest step: kernfs lists every
/// controller file) only while no process was found. Removals are as in
/// [`count_processes`].
fn any_process(dir: &Path) -> Result<bool, CgroupError> {
    let procs = dir.join("cgroup.procs");
    let mut first_pid = [0u8; 32];
    let read = fs::File::open(&procs).and_then(|mut file| file.read(&mut first_pid));
    if read.map_err(|e| CgroupError::io(&procs, e))? > 0 {
        return Ok(true);
    }
    let entries = fs::read_dir(dir).map_err(|e| CgroupError::io(dir, e))?;
    for entry in entries.filter_map(Result::ok) {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            match any_process(&entry.path()) {
                Ok(true) => return Ok(true),
                Ok(false) | Err(CgroupError::Gone(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(false)
}

/// Tasks (threads) on the node, as kubelet counts them for
/// `pid.available` (pkg/kubelet/stats/pidlimit, `Stats` and
/// `runningTaskCount`): the total after the slash in /proc/loadavg's fourth
/// field. Not `sysinfo(2)`'s `procs`, which is 16 bits wide and wraps past
/// 65,535 tasks (kubernetes#107107), just when the count matters.
pub fn node_tasks(files: Option<&KeptOpen>) -> Result<u64, CgroupError> {
    let path = Path::new("/proc/loadavg");
    let text = read_text(files, path)?;
    loadavg_tasks(&text).ok_or_else(|| CgroupError::Parse {
        path: path.to_owned(),
        text: text.trim().to_owned(),
    })
}

/// The total in `1.36 3.49 4.53 2/3518 3715089`: 3518.
fn loadavg_tasks(text: &str) -> Option<u64> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() < 5 {
        return None;
    }
    let (_running, total) = fields[3].split_once('/')?;
    total.parse().ok()
}

/// Hierarchy ids (as in `/proc/cgroups` and cgroup lifecycle events) of the
/// memory and pids controllers. cgroup2 is hierarchy 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HierarchyIds {
    pub memory: Option<u32>,
    pub pids: Option<u32>,
}

pub(crate) fn hierarchy_ids(cgroupfs: &CgroupFs) -> HierarchyIds {
    match cgroupfs.version {
        CgroupVersion::V2 => HierarchyIds {
            memory: Some(0),
            pids: cgroupfs.pids_root.as_ref().map(|_| 0),
        },
        CgroupVersion::V1 => {
            parse_proc_cgroups(&fs::read_to_string("/proc/cgroups").unwrap_or_default())
        }
    }
}

fn parse_proc_cgroups(text: &str) -> HierarchyIds {
    let mut ids = HierarchyIds::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut fields = line.split_whitespace();
        let (Some(name), Some(Ok(id))) = (fields.next(), fields.next().map(str::parse)) else {
            continue;
        };
        match name {
            "memory" => ids.memory = Some(id),
            "pids" => ids.pids = Some(id),
            _ => {}
        }
    }
    ids
}

/// The first mount of a hierarchy wins, except that a later mount on the
/// same mount point hides the earlier one: in a container, the runtime's own
/// (namespaced) cgroupfs comes first and the host's, mounted over it by the
/// DaemonSet's hostPath volume, after.
fn keep_first_or_topmost(slot: &mut Option<PathBuf>, mount_point: &Path) {
    if slot.as_deref().is_none_or(|found| found == mount_point) {
        *slot = Some(mount_point.to_owned());
    }
}

/// Whether `path` names the hierarchy's root.
pub(crate) fn is_root(path: &str) -> bool {
    path.trim_matches('/').is_empty()
}

fn join(root: &Path, path: &str) -> PathBuf {
    let relative = path.trim_matches('/');
    if relative.is_empty() {
        root.to_owned()
    } else {
        root.join(relative)
    }
}

/// The text of `path`, through `files` when given, else read by path.
pub(crate) fn read_text(files: Option<&KeptOpen>, path: &Path) -> Result<String, CgroupError> {
    match files {
        Some(files) => files.read_to_string(path),
        None => fs::read_to_string(path),
    }
    .map_err(|e| CgroupError::io(path, e))
}

fn read_u64(files: Option<&KeptOpen>, path: &Path) -> Result<u64, CgroupError> {
    let text = read_text(files, path)?;
    text.trim().parse().map_err(|_| CgroupError::Parse {
        path: path.to_owned(),
        text: text.trim().to_owned(),
    })
}

fn stat_field(files: Option<&KeptOpen>, path: &Path, field: &str) -> Result<u64, CgroupError> {
    keyed_field(&read_text(files, path)?, path, field)
}

/// `field`'s value in `text`, the key-value file at `path`.
fn keyed_field(text: &str, path: &Path, field: &str) -> Result<u64, CgroupError> {
    parse_keyed(text, field).ok_or_else(|| CgroupError::Parse {
        path: path.to_owned(),
        text: format!("no {field} line"),
    })
}

/// A v2 limit file's value: `max` is none.
fn parse_limit(text: &str) -> Option<Option<u64>> {
    match text {
        "max" => Some(None),
        bytes => bytes.parse().ok().map(Some),
    }
}

/// The `some` line's `avg10=` of a PSI text, a percentage.
fn parse_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|line| line.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("avg10="))?
        .parse()
        .ok()
        .filter(|avg10: &f64| avg10.is_finite())
}

/// Value of `key` in a `key value` per line file (memory.stat, meminfo).
fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next()?.trim_end_matches(':') == key)
            .then(|| fields.next()?.parse().ok())
            .flatten()
    })
}

/// The v2 root has no memory.current: its usage is kubelet's, `anon +
/// file` of the root's memory.stat (cAdvisor's root stats come from
/// opencontainers/cgroups `fs2.statMemory`, which falls back to
/// `rootStatsFromMeminfo` there; cAdvisor's `setMemoryStats` then takes
/// `inactive_file` off for the working set). Slab, kernel stacks, page
/// tables and buffers are not in it, as they are not in kubelet's.
fn read_root_stat(files: Option<&KeptOpen>, root: &Path) -> Result<MemoryReading, CgroupError> {
    let path = root.join("memory.stat");
    let text = read_text(files, &path)?;
    let field = |key: &str| keyed_field(&text, &path, key);
    Ok(MemoryReading {
        usage_bytes: field("anon")?.saturating_add(field("file")?),
        inactive_file_bytes: field("inactive_file")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
35 25 0:30 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
36 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory
37 25 0:32 / /sys/fs/cgroup/pids rw,relatime shared:12 - cgroup cgroup rw,pids
38 25 0:33 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
39 25 0:34 / /sys/fs/cgroup/freezer rw,relatime shared:13 - cgroup cgroup rw,freezer";

    const UNIFIED: &str = "\
30 25 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate";

    #[test]
    fn hybrid_host_uses_the_v1_memory_and_pids_mounts() {
        let fs = CgroupFs::from_mountinfo(HYBRID, |_| String::new()).unwrap();
        assert_eq!(fs.version, CgroupVersion::V1);
        assert_eq!(fs.memory_root, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(
            fs.pids_root.as_deref(),
            Some(Path::new("/sys/fs/cgroup/pids"))
        );
        assert_eq!(
            fs.freezer_root.as_deref(),
            Some(Path::new("/sys/fs/cgroup/freezer"))
        );
        assert_eq!(
            fs.memory_dir("/kubepods/"),
            Path::new("/sys/fs/cgroup/memory/kubepods")
        );
        assert_eq!(fs.memory_dir("/"), Path::new("/sys/fs/cgroup/memory"));
    }

    #[test]
    fn in_a_container_the_hosts_cgroupfs_mounted_over_the_runtimes_wins() {
        // The runtime's mounts (their root is the container's own cgroup),
        // then the DaemonSet's hostPath bind of the host's /sys/fs/cgroup.
        let container = "\
700 690 0:31 /kubepods/besteffort/podx/ctr /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
701 690 0:32 /kubepods/besteffort/podx/ctr /sys/fs/cgroup/pids ro,nosuid - cgroup cgroup rw,pids
720 690 0:40 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw
721 720 0:31 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
722 720 0:32 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
723 720 0:33 / /sys/fs/cgroup/freezer rw,nosuid - cgroup cgroup rw,freezer
730 690 0:31 / /host/memory rw,nosuid - cgroup cgroup rw,memory";
        let fs = CgroupFs::from_mountinfo(container, |_| String::new()).unwrap();
        assert_eq!(fs.memory_root, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(
            fs.freezer_root.as_deref(),
            Some(Path::new("/sys/fs/cgroup/freezer"))
        );
        let unified = "\
800 790 0:26 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw
820 790 0:26 /../../.. /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw
830 790 0:26 / /elsewhere rw,nosuid - cgroup2 cgroup2 rw";
        let fs = CgroupFs::from_mountinfo(unified, |_| "memory pids".into()).unwrap();
        assert_eq!(fs.memory_root, Path::new("/sys/fs/cgroup"));
    }

    #[test]
    fn unified_host_needs_the_memory_controller() {
        let fs =
            CgroupFs::from_mountinfo(UNIFIED, |_| "cpuset cpu io memory pids\n".into()).unwrap();
        assert_eq!(fs.version, CgroupVersion::V2);
        assert_eq!(fs.pids_root.as_deref(), Some(Path::new("/sys/fs/cgroup")));
        assert_eq!(fs.freezer_root, None);
        let err = CgroupFs::from_mountinfo(UNIFIED, |_| "cpu io\n".into()).unwrap_err();
        assert!(matches!(err, CgroupError::NoMemoryController));
    }

    #[test]
    fn keyed_files_parse_by_exact_key() {
        let stat = "inactive_file 10\ntotal_inactive_file 30\n";
        assert_eq!(parse_keyed(stat, "inactive_file"), Some(10));
        assert_eq!(parse_keyed(stat, "total_inactive_file"), Some(30));
        assert_eq!(parse_keyed("MemTotal:  2048 kB\n", "MemTotal"), Some(2048));
        assert_eq!(parse_keyed(stat, "active_file"), None);
    }

    #[test]
    fn finds_hierarchy_ids_in_proc_cgroups() {
        let text = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t2\t1\t1\nmemory\t5\t9\t1\npids\t8\t3\t1\n";
        assert_eq!(
            parse_proc_cgroups(text),
            HierarchyIds {
                memory: Some(5),
                pids: Some(8)
            }
        );
    }

    #[test]
    fn a_file_of_a_removed_cgroup_is_gone_whether_looked_up_or_already_open() {
        let path = Path::new("/sys/fs/cgroup/memory/pod/memory.stat");
        for errno in [libc::ENOENT, libc::ENODEV] {
            let error = CgroupError::io(path, io::Error::from_raw_os_error(errno));
            assert!(matches!(error, CgroupError::Gone(_)), "{errno}: {error}");
        }
        let error = CgroupError::io(path, io::Error::from_raw_os_error(libc::EACCES));
        assert!(matches!(error, CgroupError::Io { .. }), "{error}");
    }

    #[test]
    fn node_tasks_are_loadavgs_total_past_sixteen_bits() {
        assert_eq!(loadavg_tasks("1.36 3.49 4.53 2/3518 3715089\n"), Some(3518));
        // sysinfo(2)'s 16-bit procs would say 4464 here.
        assert_eq!(loadavg_tasks("0.00 0.01 0.05 7/70000 123\n"), Some(70000));
        for malformed in [
            "",
            "0.00 0.01 0.05 2/3518",
            "0.00 0.01 0.05 3518 1",
            "a b c 1/x 2",
        ] {
            assert_eq!(loadavg_tasks(malformed), None, "{malformed:?}");
        }
    }

    #[test]
    fn kept_open_files_are_read_afresh_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let files = KeptOpen::default();
        let value = dir.path().join("memory.usage_in_bytes");
        fs::write(&value, "1000\n").unwrap();
        assert_eq!(read_u64(Some(&files), &value).unwrap(), 1000);
        // The same open file (rewritten in place), read again from 0.
        fs::write(&value, "2000\n").unwrap();
        assert_eq!(read_u64(Some(&files), &value).unwrap(), 2000);
        // Longer than one read's buffer.
        let stat = dir.path().join("memory.stat");
        let mut text: String = (0..400).map(|i| format!("field_{i} {i}\n")).collect();
        text += "total_inactive_file 7\n";
        fs::write(&stat, &text).unwrap();
        assert_eq!(files.read_to_string(&stat).unwrap(), text);
        assert_eq!(
            stat_field(Some(&files), &stat, "total_inactive_file").unwrap(),
            7
        );
        let gone = read_u64(Some(&files), &dir.path().join("missing")).unwrap_err();
        assert!(matches!(gone, CgroupError::Gone(_)), "{gone}");
        // /proc files, as the node's signals read them.
        let loadavg = node_tasks(Some(&files)).unwrap();
        assert!(loadavg > 0);
    }

    #[test]
    fn a_value_kept_open_reads_as_by_path_whatever_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.usage_in_bytes");
        let value = |text: &str| {
            fs::write(&path, text).unwrap();
            let open = OpenValue::open(path.clone()).unwrap().read_u64().ok();
            assert_eq!(open, read_u64(None, &path).ok(), "{text:?}");
            open
        };
        assert_eq!(value(&format!("7{}\n", " ".repeat(40))), Some(7));
        assert_eq!(value(&format!("5{}junk", "\u{b}".repeat(35))), None);
    }

    #[test]
    fn a_containers_pressure_files_are_read_and_its_memory_high_raised_to_its_memory_max() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CgroupFs::memory_only(CgroupVersion::V2, dir.path());
        let container = dir.path().join("pod1/app");
        fs::create_dir_all(&container).unwrap();
        fs::create_dir(dir.path().join("pod1/sandbox")).unwrap();
        fs::write(dir.path().join("pod1/memory.events"), "").unwrap();
        let write = |name: &str, text: &str| fs::write(container.join(name), text).unwrap();
        write(
            "memory.events",
            "low 0\nhigh 412\nmax 3\noom 0\noom_kill 0\noom_group_kill 0\n",
        );
        write(
            "memory.pressure",
            "some avg10=12.50 avg60=3.00 avg300=1.00 total=900\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=10\n",
        );
        write("memory.high", "25165824\n");
        write("memory.max", "67108864\n");
        assert_eq!(
            fs.child_cgroups("/pod1", 8).unwrap(),
            (vec!["app".to_owned(), "sandbox".to_owned()], false)
        );
        assert!(fs.child_cgroups("/pod1", 1).unwrap().1);
        let reading = fs.container_pressure("/pod1/app", 7).unwrap();
        assert_eq!(
            reading,
            ContainerReading {
                read_at_ns: 7,
                high_events: 412,
                max_events: 3,
                some_avg10: Some(12.5),
                memory_high: Some(24 << 20),
                memory_max: Some(64 << 20),
            }
        );
        assert_eq!(fs.relax_memory_high("/pod1/app").unwrap(), "67108864");
        assert_eq!(
            fs::read_to_string(container.join("memory.high")).unwrap(),
            "67108864"
        );
        // No PSI (psi=0) is no avg10; `max` is no limit; a text that is
        // not the kernel's is an error, not a zero.
        fs::remove_file(container.join("memory.pressure")).unwrap();
        write("memory.max", "max\n");
        let reading = fs.container_pressure("/pod1/app", 8).unwrap();
        assert_eq!((reading.some_avg10, reading.memory_max), (None, None));
        write("memory.high", "lots\n");
        assert!(matches!(
            fs.container_pressure("/pod1/app", 9),
            Err(CgroupError::Parse { .. })
        ));
    }

    #[test]
    fn the_v2_root_is_read_as_kubelet_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CgroupFs::memory_only(CgroupVersion::V2, dir.path());
        // Slab and kernel stacks are in the root's memory.stat too; kubelet
        // counts only anon and file.
        fs::write(
            dir.path().join("memory.stat"),
            "anon 1000\nfile 300\nkernel 5000\nslab 4000\nactive_file 100\ninactive_file 200\n",
        )
        .unwrap();
        let root = fs.read_memory("/").unwrap();
        assert_eq!(
            root,
            MemoryReading {
                usage_bytes: 1300,
                inactive_file_bytes: 200
            }
        );
        assert_eq!(root.working_set_bytes(), 1100);
        assert_eq!(fs.read_memory_usage("/").unwrap(), 1300);
        assert!(fs.open_memory("/").unwrap().is_none());
    }

    #[test]
    fn a_pressure_file_that_fails_to_open_is_tried_again_and_a_missing_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CgroupFs::memory_only(CgroupVersion::V2, dir.path());
        let pressure_text = "some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n\
                             full avg10=0.00 avg60=0.00 avg300=0.00 total=3\n";
        for pod in ["failing", "without-psi"] {
            let pod = dir.path().join(pod);
            fs::create_dir(&pod).unwrap();
            fs::write(pod.join("memory.current"), "4096\n").unwrap();
            fs::write(pod.join("memory.stat"), "anon 4096\n").unwrap();
        }
        // A link to itself: ELOOP, an error other than the file missing.
        let failing = dir.path().join("failing/memory.pressure");
        std::os::unix::fs::symlink(&failing, &failing).unwrap();
        let open = fs.open_memory("/failing").unwrap().unwrap();
        assert!(open.stall_texts().is_err());
        fs::remove_file(&failing).unwrap();
        fs::write(&failing, pressure_text).unwrap();
        assert_eq!(
            open.stall_texts().unwrap().pressure.as_deref(),
            Some(pressure_text)
        );
        // psi=0: no file, and none looked for again.
        let without_psi = fs.open_memory("/without-psi").unwrap().unwrap();
        assert_eq!(without_psi.stall_texts().unwrap().pressure, None);
        fs::write(
            dir.path().join("without-psi/memory.pressure"),
            pressure_text,
        )
        .unwrap();
        assert_eq!(without_psi.stall_texts().unwrap().pressure, None);
    }

    #[test]
    fn reads_this_machine() {
        let fs = CgroupFs::discover().unwrap();
        let root = fs.read_memory("/").unwrap();
        assert!(root.usage_bytes > 0);
        assert!(root.working_set_bytes() <= root.usage_bytes);
        assert!(node_tasks(None).unwrap() > 0);
        let gone = fs.read_memory("/no-such-cgroup-evictd").unwrap_err();
        assert!(matches!(gone, CgroupError::Gone(_)), "{gone}");
    }

    #[test]
    fn a_process_anywhere_below_a_cgroup_counts_and_a_removed_cgroup_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CgroupFs::memory_only(CgroupVersion::V1, dir.path());
        let procs = |path: &str, text: &str| {
            let cgroup = dir.path().join(path);
            fs::create_dir_all(&cgroup).unwrap();
            fs::write(cgroup.join("cgroup.procs"), text).unwrap();
        };
        procs("pod", "");
        procs("pod/pause", "");
        procs("pod/ctr", "");
        procs("pod/ctr/nested", "");
        assert!(!fs.has_processes("/pod").unwrap());
        procs("pod/ctr/nested", "42\n");
        assert!(fs.has_processes("/pod").unwrap());
        procs("pod/ctr/nested", "");
        procs("pod", "7\n");
        assert!(fs.has_processes("/pod").unwrap(), "in the pod's own cgroup");
        let gone = fs.has_processes("/removed").unwrap_err();
        assert!(matches!(gone, CgroupError::Gone(_)), "{gone}");
    }
}
