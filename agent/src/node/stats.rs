//! The node's eviction signals, read fresh on every call (never a cached
//! poll, cf. kubernetes#51745): memory and allocatable memory from cgroups,
//! PIDs from the node cgroup or the kernel's limits, filesystems by statvfs.
use std::{
    fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Instant,
};

use crate::{
    decide::snapshot::{FsStats, MemoryStats, NodeStats, PidStats},
    node::{
        cgroupfs::{self, CgroupError, CgroupFs, CgroupVersion, KeptOpen, MemoryReading},
        cold_cache::ColdCache,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum SignalsError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: cannot parse {text:?}")]
    Parse { path: PathBuf, text: String },
    #[error("statvfs {path}: {source}")]
    Statvfs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
}

/// Where the node's signals come from.
#[derive(Debug, Clone)]
pub struct NodeSignals {
    pub cgroupfs: CgroupFs,
    /// The cgroup standing for the node, relative to the hierarchy root;
    /// `/` is the machine.
    pub node: String,
    pub nodefs: PathBuf,
    pub imagefs: PathBuf,
    /// Where the runtime keeps writable layers, once it has said
    /// (`ImageFsInfo`); the imagefs itself unless its layout is split.
    pub containerfs: Option<PathBuf>,
    /// The node's files, read on every engine run.
    pub files: KeptOpen,
    /// Whether the kernel programs compare the machine's working set on
    /// the memory hierarchy's root, so that a node that is the root has a
    /// band ([`NodeObservation::node_band_value`]).
    pub root_band: bool,
    /// `--memory-signal reclaimable`: the node's cold active file pages
    /// are left out of its working set.
    pub cold_cache: Option<ColdCache>,
}

/// One fresh look at the node: every signal's input, and the readings the
/// kernel's tripwires are armed from, each file read once.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeObservation {
    /// What the engine decides on.
    pub stats: NodeStats,
    /// The node cgroup, relative to the hierarchy root.
    pub node_cgroup: String,
    /// The node cgroup's memory as kubelet reads it: its usage and its
    /// inactive file pages, which make the working set.
    pub node_memory: MemoryReading,
    /// What a kernel band on the node cgroup compares, read now: a
    /// cgroup's page counter (its usage file), and on the hierarchy's root,
    /// which has none worth comparing (it leaves out tasks in the root and
    /// holds kernel memory kubelet does not count), the machine's working
    /// set as the programs add it up from the kernel's per-NUMA-node
    /// counters (`machine_working_set`). `None` on a root where they do
    /// not ([`NodeSignals::root_band`]).
    pub node_band_value: Option<u64>,
    /// The pods' cgroup and its memory, where it exists.
    pub kubepods: Option<(String, MemoryReading)>,
    /// What the node's PID scope counts: the node cgroup's `pids.current`,
    /// or every task on the machine when the node is `/`; `None` without a
    /// pids hierarchy for the node cgroup.
    pub scope_tasks: Option<u64>,
}

impl NodeSignals {
    /// Every signal's input. A filesystem path that does not exist leaves
    /// that filesystem out (its signals are not observed).
    pub fn observe(&self) -> Result<NodeObservation, SignalsError> {
        let total = mem_total(&self.files)?;
        let capacity = lowest_memory_limit(&self.cgroupfs, &self.files, &self.node)?
            .map_or(total, |limit| limit.min(total));
        let node_memory = self.cgroupfs.read_memory_kept(&self.files, &self.node)?;
        let reclaimable = match &self.cold_cache {
            Some(cold_cache) => cold_cache.reclaimable(
                Instant::now(),
                self.cgroupfs
                    .read_file_cache(Some(&self.files), &self.node)?,
            ),
            None => 0,
        };
        let kubepods = self.kubepods_memory()?;
        let allocatable = match &kubepods {
            Some((path, memory)) => self.allocatable(path, memory, capacity)?,
            None => None,
        };
        let (pid, scope_tasks) = self.pids()?;
        let imagefs = statvfs(&self.imagefs)?;
        // One filesystem for images and writable layers: one statvfs.
        let containerfs = match &self.containerfs {
            Some(path) if *path == self.imagefs => imagefs,
            Some(path) => statvfs(path)?,
            None => None,
        };
        Ok(NodeObservation {
            stats: NodeStats {
                memory: MemoryStats {
                    capacity_bytes: capacity,
                    working_set_bytes: node_memory.working_set_bytes().saturating_sub(reclaimable),
                },
                allocatable,
                pid: Some(pid),
                nodefs: statvfs(&self.nodefs)?,
                imagefs,
                containerfs,
            },
            node_cgroup: self.node.clone(),
            node_band_value: match (cgroupfs::is_root(&self.node), self.root_band) {
                (false, _) => Some(node_memory.usage_bytes),
                (true, true) => Some(machine_working_set(&self.files)?),
                (true, false) => None,
            },
            node_memory,
            kubepods,
            scope_tasks,
        })
    }

    /// The pods' cgroup under the node, by the cgroupfs or the systemd
    /// driver's name, if kubelet (or a test) created it.
    pub(crate) fn kubepods(&self) -> Option<String> {
        KUBEPODS_NAMES
            .into_iter()
            .map(|name| child_path(&self.node, name))
            .find(|path| self.cgroupfs.memory_dir(path).is_dir())
    }

    /// [`NodeSignals::kubepods`] and its memory, found by reading: a name
    /// with no cgroup reads as gone, so a run looks the directory up only
    /// where the files are not open yet.
    fn kubepods_memory(&self) -> Result<Option<(String, MemoryReading)>, SignalsError> {
        for name in KUBEPODS_NAMES {
            let path = child_path(&self.node, name);
            match self.cgroupfs.read_memory_kept(&self.files, &path) {
                Ok(memory) => return Ok(Some((path, memory))),
                Err(CgroupError::Gone(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// kubelet's allocatable memory signal: the pods' cgroup against node
    /// allocatable, which kubelet enforces as that cgroup's limit. Without
    /// a limit of its own the signal is not observed: kubelet's summary
    /// gives the pods' cgroup no available bytes then (cadvisor stats
    /// `cadvisorInfoToCPUandMemoryStats`), and `makeSignalObservations`
    /// skips it.
    fn allocatable(
        &self,
        kubepods: &str,
        memory: &MemoryReading,
        node_capacity: u64,
    ) -> Result<Option<MemoryStats>, SignalsError> {
        // The node's own limit already bounds it from above (node_capacity).
        Ok(
            kept_memory_limit(&self.cgroupfs, &self.files, kubepods)?.map(|limit| MemoryStats {
                capacity_bytes: limit.min(node_capacity),
                working_set_bytes: memory.working_set_bytes(),
            }),
        )
    }

    /// The node cgroup's pids.max and pids.current where it has a limit;
    /// otherwise the kernel's limit and every task on the machine, as
    /// kubelet's rlimit statistics count them. Also what the node's PID
    /// scope counts (see [`NodeObservation::scope_tasks`]).
    fn pids(&self) -> Result<(PidStats, Option<u64>), SignalsError> {
        // Read, not looked up first: a node cgroup outside the pids
        // hierarchy reads as gone.
        let node_pids = if cgroupfs::is_root(&self.node) {
            None
        } else {
            match self.cgroupfs.read_pids_kept(&self.files, &self.node) {
                Ok(tasks) => Some(tasks),
                Err(CgroupError::Gone(_) | CgroupError::NoPidsController) => None,
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(in_use) = node_pids
            && let Some(max) = lowest_pids_limit(&self.cgroupfs, &self.files, &self.node)?
        {
            return Ok((PidStats { max, in_use }, node_pids));
        }
        let pid_max = read_number(&self.files, Path::new("/proc/sys/kernel/pid_max"))?;
        let threads_max = read_number(&self.files, Path::new("/proc/sys/kernel/threads-max"))?;
        let in_use = cgroupfs::node_tasks(Some(&self.files))?;
        let scope_tasks = if cgroupfs::is_root(&self.node) {
            Some(in_use)
        } else {
            node_pids
        };
        Ok((
            PidStats {
                max: pid_max.min(threads_max),
                in_use,
            },
            scope_tasks,
        ))
    }
}

/// The pods' cgroup under the node: the cgroupfs driver's name, the
/// systemd driver's.
const KUBEPODS_NAMES: [&str; 2] = ["kubepods", "kubepods.slice"];

/// `parent/name` as a cgroup path relative to the hierarchy root.
pub(crate) fn child_path(parent: &str, name: &str) -> String {
    format!("{}/{name}", parent.trim_end_matches('/'))
}

/// The cgroup and its ancestors, deepest first, without the root (which
/// has no limit files).
fn lineage(path: &str) -> impl Iterator<Item = String> + '_ {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    (1..=parts.len())
        .rev()
        .map(move |depth| format!("/{}", parts[..depth].join("/")))
}

/// The tightest memory limit on `path` or an ancestor: an ancestor's limit
/// binds the whole subtree.
fn lowest_memory_limit(
    cgroupfs: &CgroupFs,
    files: &KeptOpen,
    path: &str,
) -> Result<Option<u64>, SignalsError> {
    let mut lowest: Option<u64> = None;
    for cgroup in lineage(path) {
        if let Some(limit) = kept_memory_limit(cgroupfs, files, &cgroup)? {
            lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
        }
    }
    Ok(lowest)
}

fn lowest_pids_limit(
    cgroupfs: &CgroupFs,
    files: &KeptOpen,
    path: &str,
) -> Result<Option<u64>, SignalsError> {
    let mut lowest: Option<u64> = None;
    for cgroup in lineage(path) {
        if let Some(limit) = pids_limit(cgroupfs, files, &cgroup)? {
            lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
        }
    }
    Ok(lowest)
}

/// Memory limits above this are none, as kubelet's `isMemoryUnlimited`
/// (pkg/kubelet/stats/helper.go) has it: v1 writes "unlimited" as the
/// largest page-aligned i64, and nothing real comes near 2^62 bytes.
const UNLIMITED_MEMORY: u64 = 1 << 62;

/// The cgroup's hard memory limit; `None` when unlimited.
pub fn memory_limit(cgroupfs: &CgroupFs, path: &str) -> Result<Option<u64>, SignalsError> {
    memory_limit_through(cgroupfs, None, path)
}

/// [`memory_limit`] through files kept open.
fn kept_memory_limit(
    cgroupfs: &CgroupFs,
    files: &KeptOpen,
    path: &str,
) -> Result<Option<u64>, SignalsError> {
    memory_limit_through(cgroupfs, Some(files), path)
}

fn memory_limit_through(
    cgroupfs: &CgroupFs,
    files: Option<&KeptOpen>,
    path: &str,
) -> Result<Option<u64>, SignalsError> {
    let file = match cgroupfs.version {
        CgroupVersion::V1 => "memory.limit_in_bytes",
        CgroupVersion::V2 => "memory.max",
    };
    let limit = read_limit(files, &cgroupfs.memory_dir(path).join(file))?;
    Ok(limit.filter(|bytes| *bytes <= UNLIMITED_MEMORY))
}

fn pids_limit(
    cgroupfs: &CgroupFs,
    files: &KeptOpen,
    path: &str,
) -> Result<Option<u64>, SignalsError> {
    read_limit(Some(files), &cgroupfs.pids_dir(path)?.join("pids.max"))
}

/// A limit file: a number, or "max" for none.
fn read_limit(files: Option<&KeptOpen>, path: &Path) -> Result<Option<u64>, SignalsError> {
    let text = read(files, path)?;
    match text.trim() {
        "max" => Ok(None),
        number => number.parse().map(Some).map_err(|_| SignalsError::Parse {
            path: path.to_owned(),
            text: number.to_owned(),
        }),
    }
}

fn read_number(files: &KeptOpen, path: &Path) -> Result<u64, SignalsError> {
    read_limit(Some(files), path)?.ok_or_else(|| SignalsError::Parse {
        path: path.to_owned(),
        text: "max".into(),
    })
}

fn read(files: Option<&KeptOpen>, path: &Path) -> Result<String, SignalsError> {
    Ok(cgroupfs::read_text(files, path)?)
}

/// kubelet's working set of the whole machine as the kernel programs
/// compute it on the root (`anon + file − inactive file`, the kernel's
/// per-NUMA-node counters that /proc/vmstat adds up): the same pages the
/// root's memory.stat counts (where kubelet reads it), without waiting for
/// the memory cgroups' statistics to be flushed.
pub(crate) fn machine_working_set(files: &KeptOpen) -> Result<u64, SignalsError> {
    let path = Path::new("/proc/vmstat");
    let text = read(Some(files), path)?;
    let pages = |key: &str| {
        text.lines()
            .find_map(|line| {
                line.strip_prefix(key)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<i64>()
                    .ok()
            })
            .ok_or_else(|| SignalsError::Parse {
                path: path.to_owned(),
                text: format!("no {key} line"),
            })
    };
    let working_set =
        pages("nr_anon_pages")? + pages("nr_file_pages")? - pages("nr_inactive_file")?;
    Ok(u64::try_from(working_set.max(0)).unwrap_or(0) * page_size())
}

/// The machine's page size, which memory.stat's page counts are in.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        size if size > 0 => size as u64,
        _ => 4096,
    }
}

fn mem_total(files: &KeptOpen) -> Result<u64, SignalsError> {
    let path = Path::new("/proc/meminfo");
    let text = read(Some(files), path)?;
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix("MemTotal:")?;
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
        .ok_or_else(|| SignalsError::Parse {
            path: path.to_owned(),
            text: "no MemTotal line".into(),
        })
}

/// A filesystem's size and free space as kubelet's summary reports them:
/// available bytes are what unprivileged users may still write. With its
/// device, which tells a dedicated imagefs. `None` when `path` does not
/// exist.
pub(crate) fn statvfs(path: &Path) -> Result<Option<FsStats>, SignalsError> {
    match nix::sys::statvfs::statvfs(path) {
        Ok(stats) => {
            let fragment = stats.fragment_size();
            let device = fs::metadata(path)
                .map_err(|source| SignalsError::Read {
                    path: path.to_owned(),
                    source,
                })?
                .dev();
            Ok(Some(FsStats {
                capacity_bytes: stats.blocks() * fragment,
                available_bytes: stats.blocks_available() * fragment,
                inodes: stats.files(),
                inodes_free: stats.files_free(),
                device: Some(device),
            }))
        }
        Err(nix::Error::ENOENT) => Ok(None),
        Err(source) => Err(SignalsError::Statvfs {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_fs(root: &Path, version: CgroupVersion) -> CgroupFs {
        CgroupFs {
            version,
            memory_root: root.join("memory"),
            pids_root: Some(root.join("pids")),
            freezer_root: None,
        }
    }

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn a_node_cgroup_gives_capacity_working_set_allocatable_and_pids() {
        let dir = tempfile::tempdir().unwrap();
        let cgroupfs = fixture_fs(dir.path(), CgroupVersion::V1);
        let memory = dir.path().join("memory/sandbox");
        write(&memory.join("memory.limit_in_bytes"), "536870912\n");
        write(&memory.join("memory.usage_in_bytes"), "300000000\n");
        write(&memory.join("memory.stat"), "total_inactive_file 1000000\n");
        write(
            &memory.join("kubepods/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        write(
            &memory.join("kubepods/memory.usage_in_bytes"),
            "200000000\n",
        );
        write(
            &memory.join("kubepods/memory.stat"),
            "total_inactive_file 0\n",
        );
        let pids = dir.path().join("pids/sandbox");
        write(&pids.join("pids.max"), "200\n");
        write(&pids.join("pids.current"), "42\n");
        let signals = NodeSignals {
            cgroupfs,
            node: "/sandbox".into(),
            nodefs: dir.path().join("missing"),
            containerfs: None,
            imagefs: dir.path().to_owned(),
            files: KeptOpen::default(),
            root_band: false,
            cold_cache: None,
        };
        let node = signals.observe().unwrap().stats;
        assert_eq!(node.memory.capacity_bytes, 536870912);
        assert_eq!(node.memory.working_set_bytes, 299000000);
        assert_eq!(
            node.allocatable, None,
            "kubepods without a limit: not observed"
        );
        write(
            &memory.join("kubepods/memory.limit_in_bytes"),
            "268435456\n",
        );
        let allocatable = signals.observe().unwrap().stats.allocatable.unwrap();
        assert_eq!(allocatable.capacity_bytes, 268435456);
        assert_eq!(allocatable.working_set_bytes, 200000000);
        assert_eq!(
            node.pid,
            Some(PidStats {
                max: 200,
                in_use: 42
            })
        );
        assert_eq!(node.nodefs, None, "a missing path is not observed");
        let imagefs = node.imagefs.unwrap();
        assert!(imagefs.capacity_bytes >= imagefs.available_bytes);
        assert!(imagefs.inodes >= imagefs.inodes_free);
        assert_eq!(signals.kubepods().as_deref(), Some("/sandbox/kubepods"));
    }

    #[test]
    fn cgroup_v2_limits_and_the_systemd_pods_slice() {
        let dir = tempfile::tempdir().unwrap();
        let mut cgroupfs = fixture_fs(dir.path(), CgroupVersion::V2);
        cgroupfs.pids_root = Some(dir.path().join("memory"));
        let node = dir.path().join("memory/sandbox");
        write(&node.join("memory.max"), "max\n");
        write(&node.join("memory.current"), "4096\n");
        write(&node.join("memory.stat"), "inactive_file 1024\n");
        write(&node.join("pids.max"), "max\n");
        write(&node.join("pids.current"), "3\n");
        let slice = node.join("kubepods.slice");
        write(&slice.join("memory.max"), "1048576\n");
        write(&slice.join("memory.current"), "2048\n");
        write(&slice.join("memory.stat"), "inactive_file 0\n");
        let signals = NodeSignals {
            cgroupfs,
            node: "/sandbox".into(),
            nodefs: dir.path().join("missing"),
            containerfs: None,
            imagefs: dir.path().join("missing"),
            files: KeptOpen::default(),
            root_band: false,
            cold_cache: None,
        };
        let stats = signals.observe().unwrap().stats;
        assert_eq!(
            stats.memory.capacity_bytes,
            mem_total(&KeptOpen::default()).unwrap(),
            "unlimited: MemTotal"
        );
        assert_eq!(stats.memory.working_set_bytes, 3072);
        assert_eq!(stats.allocatable.unwrap().capacity_bytes, 1048576);
        let pid = stats.pid.unwrap();
        assert!(pid.max > 3, "no pids.max: the kernel's limit");
        assert_eq!(stats.containerfs, None, "until the runtime names it");

        // The runtime's filesystems: writable layers on the imagefs, then
        // apart from it (a missing one is not observed).
        let layers = dir.path().join("layers");
        fs::create_dir(&layers).unwrap();
        let on_imagefs = NodeSignals {
            imagefs: dir.path().to_owned(),
            containerfs: Some(dir.path().to_owned()),
            ..signals
        };
        let stats = on_imagefs.observe().unwrap().stats;
        assert!(stats.imagefs.is_some());
        assert_eq!(stats.containerfs, stats.imagefs);
        let apart = NodeSignals {
            containerfs: Some(layers),
            ..on_imagefs.clone()
        };
        let containerfs = apart.observe().unwrap().stats.containerfs.unwrap();
        assert_eq!(containerfs.device, stats.imagefs.unwrap().device);
        let gone = NodeSignals {
            containerfs: Some(dir.path().join("gone")),
            ..on_imagefs
        };
        assert_eq!(gone.observe().unwrap().stats.containerfs, None);
    }

    #[test]
    fn an_ancestors_tighter_limit_is_the_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let cgroupfs = fixture_fs(dir.path(), CgroupVersion::V1);
        let parent = dir.path().join("memory/parent");
        write(&parent.join("memory.limit_in_bytes"), "1048576\n");
        write(
            &parent.join("node/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        write(&parent.join("node/memory.usage_in_bytes"), "4096\n");
        write(&parent.join("node/memory.stat"), "total_inactive_file 0\n");
        let pids = dir.path().join("pids/parent");
        write(&pids.join("pids.max"), "50\n");
        write(&pids.join("node/pids.max"), "max\n");
        write(&pids.join("node/pids.current"), "7\n");
        let signals = NodeSignals {
            cgroupfs,
            node: "/parent/node".into(),
            nodefs: dir.path().join("missing"),
            containerfs: None,
            imagefs: dir.path().join("missing"),
            files: KeptOpen::default(),
            root_band: false,
            cold_cache: None,
        };
        let node = signals.observe().unwrap().stats;
        assert_eq!(node.memory.capacity_bytes, 1048576);
        assert_eq!(node.pid, Some(PidStats { max: 50, in_use: 7 }));
        assert_eq!(
            lineage("/a/b/c").collect::<Vec<_>>(),
            ["/a/b/c", "/a/b", "/a"]
        );
        assert_eq!(lineage("/").count(), 0);
    }

    #[test]
    fn imagefs_is_dedicated_when_it_is_another_device() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("images");
        fs::create_dir(&sub).unwrap();
        let nodefs = statvfs(dir.path()).unwrap();
        // A write between two readings of one filesystem changes them.
        fs::write(sub.join("layer"), vec![1u8; 1 << 20]).unwrap();
        let same = NodeStats {
            memory: MemoryStats {
                capacity_bytes: 1,
                working_set_bytes: 0,
            },
            allocatable: None,
            pid: None,
            nodefs,
            imagefs: statvfs(&sub).unwrap(),
            containerfs: None,
        };
        assert!(same.nodefs.unwrap().device.is_some());
        assert_eq!(same.nodefs.unwrap().device, same.imagefs.unwrap().device);
        assert!(!same.dedicated_imagefs());
        let other = NodeStats {
            imagefs: statvfs(Path::new("/proc")).unwrap(),
            ..same
        };
        assert!(other.dedicated_imagefs());
    }

    #[test]
    fn a_malformed_limit_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pids.max");
        write(&path, "lots\n");
        let err = read_limit(None, &path).unwrap_err().to_string();
        assert!(err.contains("pids.max") && err.contains("lots"), "{err}");
    }
}
