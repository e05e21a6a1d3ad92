//! Kernel struct layout for the eBPF programs, read from the running kernel's
//! BTF (`/sys/kernel/btf/vmlinux`) at load time.
//!
//! Rust eBPF programs cannot carry CO-RE relocations, so every offset they use
//! is resolved here and handed over as the `LAYOUT` global. Nothing is taken
//! from the machine the agent was built on.
//!
//! The reader is evictd's own (`format`): `KernelBtf::open` reads the
//! file, notes where each type starts, answers every look-up evictd has
//! (the layout, each raw tracepoint's arity) and lets the file go. Decoding
//! every type of the kernel's ~130k instead (btf-rs) was most of the
//! agent's startup peak: tens of MiB for a handful of numbers.
#[cfg(test)]
mod fixtures;
mod format;

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
};

use evictd_common::KernelLayout;

pub(crate) use format::FormatError;
use format::{Btf, Kind, Type};

pub(crate) const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why the kernel's BTF cannot be read at all.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BtfError {
    #[error(
        "cannot read kernel BTF from {path}: {source} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)"
    )]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("kernel BTF in {path} is malformed: {source}")]
    Format {
        path: String,
        #[source]
        source: FormatError,
    },
}

/// Why the programs' layout cannot be had from the kernel's BTF.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LayoutError {
    #[error("kernel BTF has no struct {0}")]
    MissingStruct(String),
    #[error("kernel BTF: struct {strukt} has no member {member}")]
    MissingMember { strukt: String, member: String },
    #[error("kernel BTF: struct {strukt} member {member} is a bitfield")]
    Bitfield { strukt: String, member: String },
    #[error("kernel BTF has no enumerator {0}")]
    MissingEnumerator(String),
    #[error("kernel BTF is malformed: {0}")]
    Malformed(#[from] FormatError),
    #[error("kernel BTF: {what} is not {expected}")]
    Unexpected {
        what: &'static str,
        expected: &'static str,
    },
    #[error("offset {0} does not fit the layout's 32-bit field")]
    OffsetRange(u64),
}

/// What evictd needs from the kernel's BTF, resolved once.
#[derive(Debug)]
pub struct KernelBtf {
    /// Arguments of every raw tracepoint, by name.
    tracepoints: BTreeMap<Box<str>, usize>,
    /// The programs' layout with the defaults of the fields
    /// [`KernelBtf::layout`] fills in, or why there is none.
    layout: Result<KernelLayout, LayoutError>,
    /// Why the programs cannot add up the machine's working set, if not.
    machine_working_set: Option<LayoutError>,
}

impl KernelBtf {
    pub(crate) fn open(path: &Path) -> Result<Self, BtfError> {
        let bytes = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let btf = Btf::parse(bytes).map_err(|source| BtfError::Format {
            path: path.display().to_string(),
            source,
        })?;
        let lookup = Lookup::new(&btf);
        Ok(Self {
            tracepoints: lookup.tracepoints(),
            layout: lookup.layout(),
            machine_working_set: lookup.machine_working_set().err(),
        })
    }

    /// Why the programs cannot add up the machine's working set on the
    /// root memory cgroup (the layout's `numa_nodes` is 0 then), if not.
    pub(crate) fn machine_working_set_error(&self) -> Option<&LayoutError> {
        self.machine_working_set.as_ref()
    }

    /// Number of arguments of raw tracepoint `name`, without the leading
    /// `void *` context the kernel adds; `None` when the kernel has no such
    /// tracepoint.
    pub(crate) fn tracepoint_arity(&self, name: &str) -> Option<usize> {
        self.tracepoints.get(name).copied()
    }

    /// The layout the programs need. `memory_subsys_id` / `pids_subsys_id`
    /// are `u32::MAX` when the kernel lacks that controller.
    pub(crate) fn layout(
        &self,
        check_step_bytes: u64,
        log_enabled: bool,
    ) -> Result<KernelLayout, LayoutError> {
        let mut layout = self.layout.clone()?;
        layout.log_enabled = u32::from(log_enabled);
        layout.check_step_pages = (check_step_bytes >> layout.page_shift).max(1);
        Ok(layout)
    }
}

/// Look-ups over the parsed file, and its struct definitions and enums by
/// name (in id order; forward declarations and empty structs left out).
/// Indexed in one pass: Linux 7.x orders named types by name after every
/// anonymous one, so a scan per look-up, stopping at the first match,
/// passed nearly all ~125k types for each of the layout's ~30 (a second
/// of the agent's start in the 7.2 guest's debug build, half a minute
/// under emulation).
struct Lookup<'a>(&'a Btf, HashMap<&'a [u8], Vec<Type>>);

impl<'a> Lookup<'a> {
    fn new(btf: &'a Btf) -> Self {
        let mut named: HashMap<&[u8], Vec<Type>> = HashMap::new();
        for ty in btf.types() {
            let definition = match ty.kind {
                Kind::Struct => ty.vlen > 0,
                Kind::Enum => true,
                _ => false,
            };
            if definition && ty.name_off != 0 {
                named.entry(btf.name(ty.name_off)).or_default().push(ty);
            }
        }
        Self(btf, named)
    }

    /// The indexed types named `name` of `kind` (a struct or an enum).
    fn named(&self, name: &str, kind: Kind) -> impl Iterator<Item = Type> + '_ {
        let types = self.1.get(name.as_bytes()).map(Vec::as_slice);
        types
            .unwrap_or_default()
            .iter()
            .copied()
            .filter(move |ty| ty.kind == kind)
    }
}

impl Lookup<'_> {
    /// Every raw tracepoint (each has a `btf_trace_<name>` typedef of a
    /// pointer to its prototype) and its arity.
    fn tracepoints(&self) -> BTreeMap<Box<str>, usize> {
        let btf = self.0;
        btf.types()
            .filter(|ty| ty.kind == Kind::Typedef)
            .filter_map(|typedef| {
                let name = btf.name(typedef.name_off).strip_prefix(b"btf_trace_")?;
                let pointer = btf.resolve(typedef.referenced()).ok()?;
                let proto = btf.resolve(pointer.referenced()).ok()?;
                (pointer.kind == Kind::Ptr && proto.kind == Kind::FuncProto).then(|| {
                    let name = String::from_utf8_lossy(name).into();
                    (name, proto.vlen.saturating_sub(1))
                })
            })
            .collect()
    }

    /// The definition of struct `name` (forward declarations and empty
    /// structs of the same name are passed over).
    fn strukt(&self, name: &str) -> Result<Type, LayoutError> {
        self.named(name, Kind::Struct)
            .next()
            .ok_or_else(|| LayoutError::MissingStruct(name.to_owned()))
    }

    /// Byte offset of `member` in struct `strukt`, looking through anonymous
    /// structs and unions (where `mm_struct` keeps most of its fields).
    fn offset(&self, strukt: &str, member: &str) -> Result<u32, LayoutError> {
        let (bits, _) = self.member(strukt, member)?;
        if bits % 8 != 0 {
            return Err(LayoutError::Bitfield {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            });
        }
        to_u32(u64::from(bits / 8))
    }

    /// Bit offset and type id of `member` in struct `strukt`.
    fn member(&self, strukt: &str, member: &str) -> Result<(u32, u32), LayoutError> {
        let s = self.strukt(strukt)?;
        self.find_member(&s, member, 0)?
            .ok_or_else(|| LayoutError::MissingMember {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            })
    }

    fn find_member(
        &self,
        s: &Type,
        wanted: &str,
        base_bits: u32,
    ) -> Result<Option<(u32, u32)>, LayoutError> {
        for member in self.0.members(s) {
            let bits = base_bits + member.bit_offset;
            let name = self.0.name(member.name_off);
            if name == wanted.as_bytes() {
                return Ok(Some((bits, member.type_id)));
            }
            if name.is_empty() {
                let inner = self.0.resolve(member.type_id)?;
                if matches!(inner.kind, Kind::Struct | Kind::Union)
                    && let Some(found) = self.find_member(&inner, wanted, bits)?
                {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    fn size_of(&self, strukt: &str) -> Result<u32, LayoutError> {
        Ok(self.strukt(strukt)?.size())
    }

    /// Stride between two `mm_struct.rss_stat` counters and the offset of
    /// the count in one: an array of `struct percpu_counter` since Linux
    /// 6.2, a `struct mm_rss_stat { atomic_long_t count[]; }` before.
    fn rss_counters(&self) -> Result<(u32, u32), LayoutError> {
        let (_, rss_stat) = self.member("mm_struct", "rss_stat")?;
        match self.0.resolve(rss_stat)?.kind {
            Kind::Array => Ok((
                self.size_of("percpu_counter")?,
                self.offset("percpu_counter", "count")?,
            )),
            Kind::Struct => {
                let (bits, count) = self.member("mm_rss_stat", "count")?;
                let counters = self.0.resolve(count)?;
                let Some(array) = self.0.array(&counters) else {
                    return Err(LayoutError::Unexpected {
                        what: "mm_rss_stat.count",
                        expected: "an array",
                    });
                };
                let stride = self.size_of("mm_rss_stat")? / array.nelems.max(1);
                Ok((stride, bits / 8))
            }
            _ => Err(LayoutError::Unexpected {
                what: "mm_struct.rss_stat",
                expected: "an array of percpu_counter or struct mm_rss_stat",
            }),
        }
    }

    /// The value of enumerator `name`, in whichever enum declares it (the
    /// MM_* counters live in an anonymous enum, so there is no type name to
    /// look them up by).
    fn enumerator(&self, name: &str) -> Result<u64, LayoutError> {
        for ty in self.0.types() {
            if !matches!(ty.kind, Kind::Enum | Kind::Enum64) {
                continue;
            }
            for enumerator in self.0.enumerators(&ty) {
                if self.0.name_is(enumerator.name_off, name) {
                    return Ok(enumerator.value);
                }
            }
        }
        Err(LayoutError::MissingEnumerator(name.to_owned()))
    }

    /// Bit mask of the memcg stat items counted in bytes (`*_B`), over the
    /// node stat items followed by the memcg-only ones, as the memcg
    /// tracepoints number them.
    fn byte_items_mask(&self) -> Result<[u64; 2], LayoutError> {
        let mut mask = [0u64; 2];
        for enum_name in ["node_stat_item", "memcg_stat_item"] {
            let mut found = false;
            for ty in self.named(enum_name, Kind::Enum) {
                found = true;
                for item in self.0.enumerators(&ty) {
                    if item.value < 128 && self.0.name(item.name_off).ends_with(b"_B") {
                        mask[(item.value / 64) as usize] |= 1 << (item.value % 64);
                    }
                }
            }
            if !found {
                return Err(LayoutError::MissingEnumerator(enum_name.to_owned()));
            }
        }
        Ok(mask)
    }

    /// The flag bits below the memory cgroup pointer in `folio.memcg_data`:
    /// two until 6.10, a third (`OBJEXTS_ALLOC_FAIL`) since.
    fn memcg_data_flags(&self) -> Result<u32, LayoutError> {
        let flags = match self.enumerator("__NR_OBJEXTS_FLAGS") {
            Ok(flags) => flags,
            Err(_) => self.enumerator("__NR_MEMCG_DATA_FLAGS")?,
        };
        to_u32(flags.saturating_sub(1))
    }

    /// Where the machine's working set is, from the root memory cgroup:
    /// its per-NUMA-node lruvecs point at each node's `pglist_data`, whose
    /// `vm_stat` counters /proc/vmstat adds up. In the layout's order:
    /// `mem_cgroup.nodeinfo`, `mem_cgroup_per_node.lruvec` +
    /// `lruvec.pgdat`, `pglist_data.vm_stat`, then the indices of
    /// `NR_ANON_MAPPED`, `NR_FILE_PAGES`, `NR_INACTIVE_FILE`.
    fn machine_working_set(&self) -> Result<[u32; 6], LayoutError> {
        Ok([
            self.offset("mem_cgroup", "nodeinfo")?,
            self.offset("mem_cgroup_per_node", "lruvec")? + self.offset("lruvec", "pgdat")?,
            self.offset("pglist_data", "vm_stat")?,
            to_u32(self.enumerator("NR_ANON_MAPPED")?)?,
            to_u32(self.enumerator("NR_FILE_PAGES")?)?,
            to_u32(self.enumerator("NR_INACTIVE_FILE")?)?,
        ])
    }

    /// `obj_cgroup.memcg` where a folio's `memcg_data` points to its
    /// obj_cgroup, else `u32::MAX`. Linux 7.x reparents LRU folios through
    /// their obj_cgroup, so every charged folio holds one (`folio_memcg()`
    /// reads `objcg->memcg`), the root memory cgroup's included, which is
    /// why `obj_cgroup` gained `is_root` with it: the mark BTF shows, as
    /// the inline helpers are not in it. Before (6.18 and older), only
    /// kernel memory folios held an obj_cgroup, and they join no LRU.
    fn folio_objcg_memcg(&self) -> Result<u32, LayoutError> {
        match self.member("obj_cgroup", "is_root") {
            Ok(_) => self.offset("obj_cgroup", "memcg"),
            Err(LayoutError::MissingStruct(_) | LayoutError::MissingMember { .. }) => Ok(u32::MAX),
            Err(e) => Err(e),
        }
    }

    /// The layout, but for what [`KernelBtf::layout`] fills in.
    fn layout(&self) -> Result<KernelLayout, LayoutError> {
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
        let machine_working_set = self.machine_working_set();
        let [
            mem_cgroup_nodeinfo,
            memcg_node_pgdat,
            pgdat_vm_stat,
            node_stat_anon,
            node_stat_file,
            node_stat_inactive_file,
        ] = machine_working_set.clone().unwrap_or_default();
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
            cgroup_memory_css: match subsys("memory_cgrp_id") {
                u32::MAX => 0,
                id => self.offset("cgroup", "subsys")? + id * 8,
            },
            folio_objcg_memcg: self.folio_objcg_memcg()?,
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
            folio_flags: self.offset("folio", "flags")?,
            folio_memcg_data: self.offset("folio", "memcg_data")?,
            memcg_data_flags: self.memcg_data_flags()?,
            pg_head: to_u32(self.enumerator("PG_head")?)?,
            page_shift: page_size.trailing_zeros(),
            log_enabled: 0,
            mem_cgroup_nodeinfo,
            memcg_node_pgdat,
            pgdat_vm_stat,
            node_stat_anon,
            node_stat_file,
            node_stat_inactive_file,
            numa_nodes: u32::from(machine_working_set.is_ok()),
            _pad2: 0,
            byte_items_mask: self.byte_items_mask()?,
            check_step_pages: 1,
            possible_cpus: 1,
        })
    }
}

fn to_u32(value: u64) -> Result<u32, LayoutError> {
    u32::try_from(value).map_err(|_| LayoutError::OffsetRange(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fixtures::BtfWriter;

    /// This machine's BTF: every Linux evictd supports has it, and a layout
    /// that cannot be resolved here could not be loaded either.
    fn running_kernel() -> Btf {
        Btf::parse(std::fs::read(VMLINUX_BTF).expect("kernel BTF")).expect("valid BTF")
    }

    fn written(writer: &BtfWriter) -> Btf {
        Btf::parse(writer.finish()).expect("valid BTF")
    }

    #[test]
    fn resolves_the_layout_of_the_running_kernel() {
        let btf = KernelBtf::open(Path::new(VMLINUX_BTF)).expect("kernel BTF");
        let layout = btf.layout(256 * 1024, true).expect("layout");
        assert_eq!(layout.page_shift, 12);
        assert_ne!(
            layout.memory_subsys_id,
            u32::MAX,
            "memory controller compiled in"
        );
        assert!(layout.mem_cgroup_memory_usage > layout.mem_cgroup_css);
        assert!(layout.rss_stat_stride >= 8);
        assert_eq!(layout.check_step_pages, 64);
        assert_eq!(layout.log_enabled, 1);
        // NR_SLAB_RECLAIMABLE_B and friends count bytes.
        assert_ne!(layout.byte_items_mask, [0, 0]);
        // Flags in the low bits of the pointer, below a mem_cgroup's alignment.
        assert!(
            matches!(layout.memcg_data_flags, 3 | 7),
            "{}",
            layout.memcg_data_flags
        );
        assert!(layout.folio_memcg_data > layout.folio_flags);
        assert_eq!(
            layout.numa_nodes,
            1,
            "{:?}",
            btf.machine_working_set_error()
        );
        assert!(layout.mem_cgroup_nodeinfo > layout.mem_cgroup_memory_usage);
        assert!(layout.node_stat_inactive_file < 64 && layout.node_stat_file < 64);
        assert_eq!(btf.tracepoint_arity("no_such_tracepoint"), None);
        assert_eq!(btf.tracepoint_arity("sched_process_fork"), Some(2));
    }

    #[test]
    fn finds_members_inside_anonymous_structs() {
        // mm_struct keeps its fields in an anonymous struct (__randomize_layout).
        let btf = running_kernel();
        assert!(
            Lookup::new(&btf)
                .offset("mm_struct", "rss_stat")
                .expect("rss_stat")
                > 0
        );
    }

    #[test]
    fn names_what_is_missing() {
        let btf = running_kernel();
        let lookup = Lookup::new(&btf);
        let err = lookup
            .offset("mem_cgroup", "no_such_member")
            .expect_err("missing");
        assert_eq!(
            err.to_string(),
            "kernel BTF: struct mem_cgroup has no member no_such_member"
        );
        assert!(matches!(
            lookup.offset("no_such_struct", "x"),
            Err(LayoutError::MissingStruct(_))
        ));
        assert!(matches!(
            lookup.enumerator("NO_SUCH_ENUMERATOR"),
            Err(LayoutError::MissingEnumerator(_))
        ));
    }

    #[test]
    fn rss_counters_of_both_shapes() {
        // Since 6.2: struct percpu_counter rss_stat[NR_MM_COUNTERS].
        let mut writer = BtfWriter::default();
        let long = writer.int("long", 8);
        let counter = writer.strukt(
            fixtures::STRUCT,
            "percpu_counter",
            40,
            &[("lock", long, 0), ("count", long, 64)],
        );
        let counters = writer.array(counter, long, 4);
        writer.strukt(
            fixtures::STRUCT,
            "mm_struct",
            1024,
            &[("rss_stat", counters, 6400)],
        );
        let btf = written(&writer);
        assert_eq!(Lookup::new(&btf).rss_counters().expect("6.2+"), (40, 8));

        // 6.1: struct mm_rss_stat { atomic_long_t count[NR_MM_COUNTERS]; }.
        let mut writer = BtfWriter::default();
        let long = writer.int("long", 8);
        let atomic = writer.strukt(fixtures::STRUCT, "", 8, &[("counter", long, 0)]);
        let atomic_long = writer.alias(fixtures::TYPEDEF, "atomic_long_t", atomic);
        let counts = writer.array(atomic_long, long, 4);
        let stat = writer.strukt(fixtures::STRUCT, "mm_rss_stat", 32, &[("count", counts, 0)]);
        // Inside an anonymous struct, as __randomize_layout leaves it.
        let fields = writer.strukt(fixtures::STRUCT, "", 512, &[("rss_stat", stat, 2048)]);
        writer.strukt(fixtures::STRUCT, "mm_struct", 1024, &[("", fields, 0)]);
        let btf = written(&writer);
        let lookup = Lookup::new(&btf);
        assert_eq!(lookup.rss_counters().expect("6.1"), (8, 0));
        assert_eq!(lookup.offset("mm_struct", "rss_stat").expect("offset"), 256);
    }

    #[test]
    fn a_struct_is_its_first_definition_wherever_it_stands() {
        // As Linux 7.x orders BTF: anonymous types, then named ones by name.
        let mut writer = BtfWriter::default();
        let int = writer.int("int", 4);
        writer.strukt(fixtures::STRUCT, "", 4, &[("a", int, 0)]);
        writer.strukt(fixtures::STRUCT, "cgroup", 0, &[]);
        writer.enumeration("cgroup", &[("A", 1)]);
        let cgroup = writer.strukt(fixtures::STRUCT, "cgroup", 8, &[("level", int, 32)]);
        writer.strukt(fixtures::STRUCT, "cgroup", 16, &[("other", int, 0)]);
        writer.strukt(fixtures::STRUCT, "task_struct", 8, &[("pid", int, 32)]);
        let btf = written(&writer);
        let lookup = Lookup::new(&btf);
        let found = lookup.strukt("cgroup").expect("defined");
        assert_eq!((found.size(), found.vlen), (8, 1), "type {cgroup}");
        assert_eq!(lookup.offset("cgroup", "level").expect("level"), 4);
        assert_eq!(lookup.offset("task_struct", "pid").expect("pid"), 4);
        assert!(matches!(
            lookup.strukt("cgroup_root"),
            Err(LayoutError::MissingStruct(_))
        ));
    }

    #[test]
    fn folios_hold_an_obj_cgroup_where_it_has_is_root() {
        let mut writer = BtfWriter::default();
        let long = writer.int("long", 8);
        // 6.18: only kernel memory folios hold an obj_cgroup.
        writer.strukt(
            fixtures::STRUCT,
            "obj_cgroup",
            48,
            &[("refcnt", long, 0), ("memcg", long, 128)],
        );
        let btf = written(&writer);
        assert_eq!(
            Lookup::new(&btf).folio_objcg_memcg().expect("6.18"),
            u32::MAX
        );

        // 7.2: every charged folio does, the root's too.
        let mut writer = BtfWriter::default();
        let long = writer.int("long", 8);
        let flag = writer.int("bool", 1);
        writer.strukt(
            fixtures::STRUCT,
            "obj_cgroup",
            56,
            &[
                ("refcnt", long, 0),
                ("memcg", long, 128),
                ("is_root", flag, 384),
            ],
        );
        let btf = written(&writer);
        assert_eq!(Lookup::new(&btf).folio_objcg_memcg().expect("7.2"), 16);

        // Without memory cgroups there is nothing to read through.
        let btf = written(&BtfWriter::default());
        assert_eq!(
            Lookup::new(&btf).folio_objcg_memcg().expect("no memcg"),
            u32::MAX
        );
    }

    #[test]
    fn tracepoints_and_anonymous_enumerators() {
        let mut writer = BtfWriter::default();
        writer.tracepoint("mark_victim", 2);
        writer.tracepoint("old_mark_victim", 1);
        writer.enumeration("", &[("MM_FILEPAGES", 0), ("MM_ANONPAGES", 1)]);
        let btf = written(&writer);
        let lookup = Lookup::new(&btf);
        let tracepoints = lookup.tracepoints();
        let tracepoints: Vec<(&str, usize)> = tracepoints
            .iter()
            .map(|(name, arity)| (&**name, *arity))
            .collect();
        assert_eq!(tracepoints, [("mark_victim", 2), ("old_mark_victim", 1)]);
        assert_eq!(
            lookup.enumerator("MM_ANONPAGES").expect("anonymous enum"),
            1
        );
    }

    #[test]
    fn a_kernel_without_the_layout_still_names_its_tracepoints() {
        let mut writer = BtfWriter::default();
        writer.tracepoint("sched_process_fork", 2);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("vmlinux");
        std::fs::write(&path, writer.finish()).expect("write");
        let btf = KernelBtf::open(&path).expect("valid BTF");
        assert_eq!(btf.tracepoint_arity("sched_process_fork"), Some(2));
        let err = btf.layout(4096, false).expect_err("no structs");
        assert!(matches!(err, LayoutError::MissingStruct(_)), "{err}");
    }

    #[test]
    fn a_file_that_is_not_btf_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("vmlinux");
        std::fs::write(&path, b"not BTF at all, just text").expect("write");
        let err = KernelBtf::open(&path).expect_err("not BTF");
        assert!(
            err.to_string()
                .starts_with(&format!("kernel BTF in {} is malformed", path.display())),
            "{err}"
        );
    }
}
