//! Where the memory and pids controllers (and the v1 freezer) are mounted,
//! read from `/proc/self/mountinfo`.
//!
//! The fixtures find the hierarchies themselves rather than through the
//! agent's `evictd::node::cgroupfs::CgroupFs`: they are the oracle the agent is
//! tested against, so they must not share its mistakes.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

/// cgroup v1 (one hierarchy per controller) or v2 (one unified hierarchy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub version: CgroupVersion,
    pub mount_point: PathBuf,
}

/// The hierarchies holding the memory and pids controllers. On v2 (and in
/// the unusual v1 layout where both controllers share a mount) they are the
/// same hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    pub memory: Hierarchy,
    pub pids: Hierarchy,
    /// The v1 freezer hierarchy, where mounted: the kill executor freezes a
    /// pod there. (v2 has no freezer controller: every cgroup has its own
    /// `cgroup.freeze`.)
    pub freezer: Option<Hierarchy>,
}

impl CgroupLayout {
    /// Reads this process's mount table; a cgroup2 mount counts for a
    /// controller only if its `cgroup.controllers` lists it (on a hybrid host
    /// the unified mount has none).
    pub fn discover() -> io::Result<Self> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
        Self::from_mountinfo(&mountinfo, |root| {
            fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default()
        })
    }

    /// The distinct hierarchies, memory's first.
    pub fn hierarchies(&self) -> Vec<&Hierarchy> {
        let mut hierarchies = vec![&self.memory];
        for hierarchy in std::iter::once(&self.pids).chain(&self.freezer) {
            if hierarchies
                .iter()
                .all(|h| h.mount_point != hierarchy.mount_point)
            {
                hierarchies.push(hierarchy);
            }
        }
        hierarchies
    }

    pub(crate) fn from_mountinfo(
        mountinfo: &str,
        v2_controllers: impl Fn(&Path) -> String,
    ) -> io::Result<Self> {
        let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
        let v1_freezer = mounts
            .iter()
            .filter(|m| m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == "freezer"))
            .min_by_key(|m| m.root != "/")
            .map(|m| Hierarchy {
                version: CgroupVersion::V1,
                mount_point: m.mount_point.clone(),
            });
        let find = |controller: &str| -> io::Result<Hierarchy> {
            // A v1 hierarchy with the controller wins over cgroup2: a
            // controller is active in one hierarchy only, and on a hybrid host
            // that is the v1 one. Mounts of the hierarchy's own root come
            // first (a bind mount of a subdirectory would shift every path).
            let v1 = mounts.iter().filter(|m| {
                m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == controller)
            });
            let v2 = mounts.iter().filter(|m| {
                m.fstype == "cgroup2"
                    && v2_controllers(&m.mount_point)
                        .split_whitespace()
                        .any(|c| c == controller)
            });
            let candidates: Vec<&Mount> = v1.chain(v2).collect();
            candidates
                .iter()
                .find(|m| m.root == "/")
                .or_else(|| candidates.first())
                .map(|m| Hierarchy {
                    version: if m.fstype == "cgroup2" {
                        CgroupVersion::V2
                    } else {
                        CgroupVersion::V1
                    },
                    mount_point: m.mount_point.clone(),
                })
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!(
                            "no cgroup hierarchy with the {controller} controller in /proc/self/mountinfo"
                        ),
                    )
                })
        };
        Ok(Self {
            memory: find("memory")?,
            pids: find("pids")?,
            freezer: v1_freezer,
        })
    }
}

/// The fields of one mountinfo line the layout needs.
#[derive(Debug)]
struct Mount {
    /// The directory of the filesystem mounted here (`/` unless a
    /// subdirectory was bind-mounted).
    root: String,
    mount_point: PathBuf,
    fstype: String,
    super_options: String,
}

impl Mount {
    /// `id parent major:minor root mount-point options [optional...] - fstype source super-options`
    fn parse(line: &str) -> Option<Self> {
        let (left, right) = line.split_once(" - ")?;
        let mut left = left.split(' ').skip(3);
        let root = unescape(left.next()?);
        let mount_point = PathBuf::from(unescape(left.next()?));
        let mut right = right.split(' ');
        let fstype = right.next()?.to_owned();
        let _source = right.next()?;
        let super_options = right.next()?.to_owned();
        Some(Self {
            root,
            mount_point,
            fstype,
            super_options,
        })
    }
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's kind: v1 controllers plus an empty cgroup2 mount.
    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw";

    /// A systemd host on pure cgroup v2.
    const UNIFIED: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot";

    #[test]
    fn hybrid_host_uses_the_v1_mounts_and_ignores_the_empty_unified_one() {
        let layout = CgroupLayout::from_mountinfo(HYBRID, |_| String::new()).unwrap();
        assert_eq!(
            layout.memory,
            Hierarchy {
                version: CgroupVersion::V1,
                mount_point: "/sys/fs/cgroup/memory".into()
            }
        );
        assert_eq!(layout.pids.mount_point, Path::new("/sys/fs/cgroup/pids"));
        assert_eq!(
            layout.freezer.as_ref().map(|h| h.mount_point.as_path()),
            Some(Path::new("/sys/fs/cgroup/freezer"))
        );
        assert_eq!(layout.hierarchies().len(), 3);
    }

    #[test]
    fn unified_host_has_one_hierarchy_for_both_controllers() {
        let layout =
            CgroupLayout::from_mountinfo(UNIFIED, |_| "cpuset cpu io memory pids\n".into())
                .unwrap();
        assert_eq!(layout.memory.version, CgroupVersion::V2);
        assert_eq!(layout.memory, layout.pids);
        assert_eq!(layout.freezer, None);
        assert_eq!(layout.hierarchies().len(), 1);
        assert_eq!(
            layout.hierarchies()[0].mount_point,
            Path::new("/sys/fs/cgroup")
        );
    }

    #[test]
    fn a_missing_controller_is_an_error_naming_it() {
        let err = CgroupLayout::from_mountinfo(UNIFIED, |_| "cpu io memory".into()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("pids"), "{err}");
    }

    #[test]
    fn the_mount_of_the_hierarchy_root_wins_over_a_bind_mount() {
        let text = "\
50 31 0:32 /kubepods /host/memory rw - cgroup cgroup rw,memory
51 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
52 31 0:36 / /sys/fs/cgroup/my\\040pids rw - cgroup cgroup rw,pids";
        let layout = CgroupLayout::from_mountinfo(text, |_| String::new()).unwrap();
        assert_eq!(
            layout.memory.mount_point,
            Path::new("/sys/fs/cgroup/memory")
        );
        assert_eq!(layout.pids.mount_point, Path::new("/sys/fs/cgroup/my pids"));
    }

    #[test]
    fn discovers_this_machine() {
        // No privilege needed to read the mount table.
        let layout = CgroupLayout::discover().unwrap();
        assert!(layout.memory.mount_point.join("cgroup.procs").exists());
        assert!(layout.pids.mount_point.join("cgroup.procs").exists());
    }
}
