//! Kernel struct layout for the eBPF programs, read from the running kernel's
//! BTF (`/sys/kernel/btf/vmlinux`) at load time.
//!
//! Rust eBPF programs cannot carry CO-RE relocations, so every offset they use
//! is resolved here and handed over as the `LAYOUT` global. Nothing is taken
//! from the machine the agent was built on.
use std::{collections::HashMap, path::Path};

use btf_rs::{Btf, Type};
use evictd_common::KernelLayout;
use fallible_iterator::FallibleIterator as _;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "cannot read kernel BTF from {path}: {source} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)"
    )]
    Read {
        path: String,
        #[source]
        source: btf_rs::Error,
    },
    #[error("kernel BTF has no struct {0}")]
    MissingStruct(String),
    #[error("kernel BTF: struct {strukt} has no member {member}")]
    MissingMember { strukt: String, member: String },
    #[error("kernel BTF: struct {strukt} member {member} is a bitfield")]
    Bitfield { strukt: String, member: String },
    #[error("kernel BTF has no enumerator {0}")]
    MissingEnumerator(String),
    #[error("kernel BTF is malformed: {0}")]
    Malformed(#[source] btf_rs::Error),
    #[error("kernel BTF: {what} is not {expected}")]
    Unexpected {
        what: &'static str,
        expected: &'static str,
    },
    #[error("offset {0} does not fit the layout's 32-bit field")]
    OffsetRange(u64),
}

/// Kernel BTF with the look-ups evictd needs.
pub struct KernelBtf {
    btf: Btf,
    /// Every enumerator of every enum, by name (the MM_* counters live in an
    /// anonymous enum, so there is no type name to look them up by).
    enumerators: HashMap<String, u64>,
}

impl KernelBtf {
    pub fn open(path: &Path) -> Result<Self, LayoutError> {
        let read_error = |source| LayoutError::Read {
            path: path.display().to_string(),
            source,
        };
        // Parsed from memory: btf-rs reading the file seeks once per type,
        // which costs seconds on a kernel's ~100k types.
        let bytes = std::fs::read(path).map_err(|e| read_error(btf_rs::Error::IO(e)))?;
        let btf = Btf::from_bytes(&bytes).map_err(read_error)?;
        let mut enumerators = HashMap::new();
        let mut types = btf.type_iter();
        while let Some(ty) = types.next().map_err(LayoutError::Malformed)? {
            match ty {
                Type::Enum(e) => {
                    for member in &e.members {
                        let name = btf.resolve_name(member).map_err(LayoutError::Malformed)?;
                        enumerators.insert(name, u64::from(member.val()));
                    }
                }
                Type::Enum64(e) => {
                    for member in &e.members {
                        let name = btf.resolve_name(member).map_err(LayoutError::Malformed)?;
                        enumerators.insert(name, member.val());
                    }
                }
                _ => {}
            }
        }
        Ok(Self { btf, enumerators })
    }

    /// Number of arguments of raw tracepoint `name` (each has a
    /// `btf_trace_<name>` typedef), without the leading `void *` context the
    /// kernel adds; `None` when the kernel has no such tracepoint.
    pub fn tracepoint_arity(&self, name: &str) -> Option<usize> {
        let types = self
            .btf
            .resolve_types_by_name(&format!("btf_trace_{name}"))
            .ok()?;
        let typedef = types.into_iter().find_map(|ty| match ty {
            Type::Typedef(t) => Some(t),
            _ => None,
        })?;
        self.btf
            .chained_type_iter(&typedef)
            .find_map(|ty| match ty {
                Type::FuncProto(proto) => Some(proto.parameters.len().saturating_sub(1)),
                _ => None,
            })
    }

    fn strukt(&self, name: &str) -> Result<btf_rs::Struct, LayoutError> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|_| LayoutError::MissingStruct(name.to_owned()))?;
        // Forward declarations share the name; take the definition.
        types
            .into_iter()
            .find_map(|ty| match ty {
                Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
            .ok_or_else(|| LayoutError::MissingStruct(name.to_owned()))
    }

    /// Byte offset of `member` in struct `strukt`, looking through anonymous
    /// structs and unions (where `mm_struct` keeps most of its fields).
    pub fn offset(&self, strukt: &str, member: &str) -> Result<u32, LayoutError> {
        let (bits, _) = self.member(strukt, member)?;
        if bits % 8 != 0 {
            return Err(LayoutError::Bitfield {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            });
        }
        to_u32(u64::from(bits / 8))
    }

    /// Bit offset and description of `member` in struct `strukt`.
    fn member(&self, strukt: &str, member: &str) -> Result<(u32, btf_rs::Member), LayoutError> {
        let s = self.strukt(strukt)?;
        self.find_member(&s, member, 0)?
            .ok_or_else(|| LayoutError::MissingMember {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            })
    }

    fn find_member(
        &self,
        s: &btf_rs::Struct,
        wanted: &str,
        base_bits: u32,
    ) -> Result<Option<(u32, btf_rs::Member)>, LayoutError> {
        for member in &s.members {
            let name = self
                .btf
                .resolve_name(member)
                .map_err(LayoutError::Malformed)?;
            let bits = base_bits + member.bit_offset();
            if name == wanted {
                return Ok(Some((bits, member.clone())));
            }
            if name.is_empty() {
                let inner = self
                    .btf
                    .resolve_chained_type(member)
                    .map_err(LayoutError::Malformed)?;
                if let Type::Struct(inner) | Type::Union(inner) = inner
                    && let Some(found) = self.find_member(&inner, wanted, bits)?
                {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    pub fn size_of(&self, strukt: &str) -> Result<u32, LayoutError> {
        to_u32(self.strukt(strukt)?.size() as u64)
    }

    /// Stride between two `mm_struct.rss_stat` counters and the offset of
    /// the count in one: an array of `struct percpu_counter` since Linux
    /// 6.2, a `struct mm_rss_stat { atomic_long_t count[]; }` before.
    fn rss_counters(&self) -> Result<(u32, u32), LayoutError> {
        let (_, member) = self.member("mm_struct", "rss_stat")?;
        let ty = self
            .btf
            .resolve_chained_type(&member)
            .map_err(LayoutError::Malformed)?;
        match ty {
            Type::Array(_) => Ok((
                self.size_of("percpu_counter")?,
                self.offset("percpu_counter", "count")?,
            )),
            Type::Struct(_) => {
                let (bits, count) = self.member("mm_rss_stat", "count")?;
                let Type::Array(counters) = self
                    .btf
                    .resolve_chained_type(&count)
                    .map_err(LayoutError::Malformed)?
                else {
                    return Err(LayoutError::Unexpected {
                        what: "mm_rss_stat.count",
                        expected: "an array",
                    });
                };
                let stride = self.size_of("mm_rss_stat")? / (counters.len().max(1) as u32);
                Ok((stride, bits / 8))
            }
            _ => Err(LayoutError::Unexpected {
                what: "mm_struct.rss_stat",
                expected: "an array of percpu_counter or struct mm_rss_stat",
            }),
        }
    }

    pub fn enumerator(&self, name: &str) -> Result<u64, LayoutError> {
        self.enumerators
            .get(name)
            .copied()
            .ok_or_else(|| LayoutError::MissingEnumerator(name.to_owned()))
    }

    /// Bit mask of the memcg stat items counted in bytes (`*_B`), over the
    /// node stat items followed by the memcg-only ones, as the memcg
    /// tracepoints number them.
    fn byte_items_mask(&self) -> Result<[u64; 2], LayoutError> {
        let mut mask = [0u64; 2];
        for enum_name in ["node_stat_item", "memcg_stat_item"] {
            let types = self
                .btf
                .resolve_types_by_name(enum_name)
                .map_err(|_| LayoutError::MissingEnumerator(enum_name.to_owned()))?;
            for ty in types {
                let Type::Enum(e) = ty else { continue };
                for member in &e.members {
                    let name = self
                        .btf
                        .resolve_name(member)
                        .map_err(LayoutError::Malformed)?;
                    let value = member.val();
                    if name.ends_with("_B") && value < 128 {
                        mask[(value / 64) as usize] |= 1 << (value % 64);
                    }
                }
            }
        }
        Ok(mask)
    }

    /// The layout the programs need. `memory_subsys_id` / `pids_subsys_id`
    /// are `u32::MAX` when the kernel lacks that controller.
    pub fn layout(
        &self,
        check_step_bytes: u64,
        log_enabled: bool,
    ) -> Result<KernelLayout, LayoutError> {
        let subsys = |name: &str| {
            self.enumerator(name)
                .ok()
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(u32::MAX)
        };
        let pids_css_to_counter = match self.strukt("pids_cgroup") {
            Ok(_) => {
                i64::from(self.offset("pids_cgroup", "counter")?)
                    - i64::from(self.offset("pids_cgroup", "css")?)
            }
            Err(_) => 0,
        };
        let pids_subsys_id = if self.strukt("pids_cgroup").is_ok() {
            subsys("pids_cgrp_id")
        } else {
            u32::MAX
        };
        // SAFETY: sysconf has no preconditions.
        let page_size = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            size if size > 0 => size as u64,
            _ => 4096,
        };
        let (rss_stat_stride, rss_stat_count) = self.rss_counters()?;
        Ok(KernelLayout {
            mem_cgroup_css: self.offset("mem_cgroup", "css")?,
            mem_cgroup_memory_usage: self.offset("mem_cgroup", "memory")?
                + self.offset("page_counter", "usage")?,
            css_cgroup: self.offset("cgroup_subsys_state", "cgroup")?,
            css_parent: self.offset("cgroup_subsys_state", "parent")?,
            cgroup_kn: self.offset("cgroup", "kn")?,
            kernfs_node_id: self.offset("kernfs_node", "id")?,
            cgroup_level: self.offset("cgroup", "level")?,
            cgroup_root: self.offset("cgroup", "root")?,
            cgroup_root_hierarchy_id: self.offset("cgroup_root", "hierarchy_id")?,
            task_cgroups: self.offset("task_struct", "cgroups")?,
            css_set_subsys: self.offset("css_set", "subsys")?,
            memory_subsys_id: subsys("memory_cgrp_id"),
            pids_subsys_id,
            pids_css_to_counter: i32::try_from(pids_css_to_counter)
                .map_err(|_| LayoutError::OffsetRange(pids_css_to_counter.unsigned_abs()))?,
            task_pid: self.offset("task_struct", "pid")?,
            task_comm: self.offset("task_struct", "comm")?,
            task_mm: self.offset("task_struct", "mm")?,
            mm_rss_stat: self.offset("mm_struct", "rss_stat")?,
            rss_stat_stride,
            rss_stat_count,
            rss_file_index: to_u32(self.enumerator("MM_FILEPAGES")?)?,
            rss_anon_index: to_u32(self.enumerator("MM_ANONPAGES")?)?,
            rss_shmem_index: to_u32(self.enumerator("MM_SHMEMPAGES")?)?,
            task_thread_pid: self.offset("task_struct", "thread_pid")?,
            pid_init_ns: self.offset("pid", "numbers")? + self.offset("upid", "ns")?,
            pid_namespace_pid_allocated: self.offset("pid_namespace", "pid_allocated")?,
            page_shift: page_size.trailing_zeros(),
            log_enabled: u32::from(log_enabled),
            byte_items_mask: self.byte_items_mask()?,
            check_step_pages: (check_step_bytes >> page_size.trailing_zeros()).max(1),
        })
    }
}

fn to_u32(value: u64) -> Result<u32, LayoutError> {
    u32::try_from(value).map_err(|_| LayoutError::OffsetRange(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads this machine's BTF: every Linux evictd supports has it, and a
    /// layout that cannot be resolved here could not be loaded either.
    fn kernel() -> KernelBtf {
        KernelBtf::open(Path::new(VMLINUX_BTF)).expect("kernel BTF")
    }

    #[test]
    fn resolves_the_layout_of_the_running_kernel() {
        let layout = kernel().layout(256 * 1024, false).expect("layout");
        assert_eq!(layout.page_shift, 12);
        assert_ne!(
            layout.memory_subsys_id,
            u32::MAX,
            "memory controller compiled in"
        );
        assert!(layout.mem_cgroup_memory_usage > layout.mem_cgroup_css);
        assert!(layout.rss_stat_stride >= 8);
        assert_eq!(layout.check_step_pages, 64);
        // NR_SLAB_RECLAIMABLE_B and friends count bytes.
        assert_ne!(layout.byte_items_mask, [0, 0]);
    }

    #[test]
    fn finds_members_inside_anonymous_structs() {
        // mm_struct keeps its fields in an anonymous struct (__randomize_layout).
        let btf = kernel();
        assert!(btf.offset("mm_struct", "rss_stat").expect("rss_stat") > 0);
    }

    #[test]
    fn names_what_is_missing() {
        let btf = kernel();
        let err = btf
            .offset("mem_cgroup", "no_such_member")
            .expect_err("missing");
        assert_eq!(
            err.to_string(),
            "kernel BTF: struct mem_cgroup has no member no_such_member"
        );
        assert!(matches!(
            btf.offset("no_such_struct", "x"),
            Err(LayoutError::MissingStruct(_))
        ));
    }

    #[test]
    fn knows_the_tracepoints() {
        let btf = kernel();
        assert_eq!(btf.tracepoint_arity("no_such_tracepoint"), None);
        assert_eq!(btf.tracepoint_arity("sched_process_fork"), Some(2));
    }
}
