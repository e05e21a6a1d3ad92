//! Types shared by evictd's eBPF programs (`evictd-ebpf`) and its agent.
//!
//! Every type here crosses the kernel boundary as raw bytes, so each is
//! `#[repr(C)]`, `Copy`, has explicit padding (no implicit holes the two sides
//! could disagree on) and a size assertion. Flags are `u32`, never `bool`.
#![no_std]

use core::mem::size_of;

/// Resource a watched scope or a crossing event refers to.
pub const RESOURCE_MEMORY: u32 = 0;
pub const RESOURCE_PIDS: u32 = 1;

/// Scope id of the node-wide PID scope in records and in the agent (its
/// band is `NODE_PIDS_BAND`'s one entry, not a key of `PIDS_SCOPES`).
/// Cgroup ids are kernfs node ids and never 0 (the root cgroup is 1), so 0
/// is free.
pub const NODE_PIDS_SCOPE_ID: u64 = 0;

/// Indices into the `PIDS_WATCHED` array, which the agent keeps: how many
/// pids cgroups `PIDS_SCOPES` holds, and 1 while the node-wide band is
/// watched.
pub const PIDS_WATCHED_CGROUPS: u32 = 0;
pub const PIDS_WATCHED_NODE: u32 = 1;
pub const PIDS_WATCHED_LEN: u32 = 2;

/// Event kinds, the first `u32` of every ring-buffer record.
pub const EVENT_CROSSING: u32 = 1;
pub const EVENT_OOM_VICTIM: u32 = 2;
pub const EVENT_CGROUP_MKDIR: u32 = 3;
pub const EVENT_CGROUP_RMDIR: u32 = 4;

/// Indices into the per-CPU `COUNTERS` array.
pub const COUNTER_RINGBUF_DROPS: u32 = 0;
pub const COUNTER_MEMORY_CHECKS: u32 = 1;
pub const COUNTER_READ_ERRORS: u32 = 2;
pub const COUNTERS_LEN: u32 = 3;

/// Bytes of the `EVENTS` ring buffer: about 4,000 crossing records or 880
/// cgroup records (each also takes an 8-byte header). Crossings are bounded
/// by the watched scopes (each reports once until the agent re-arms it),
/// so they fit many times over; a burst of cgroup creation can overflow
/// any size while the agent is busy killing, and the agent resyncs from
/// cgroupfs when it finds records were dropped (see `COUNTER_RINGBUF_DROPS`).
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;

/// `MEMCG_CHARGE_BATCH`: pages a CPU charges to a page counter at once and
/// hands out from its stock, so a counter read runs ahead of the pages in
/// use by up to this much per CPU.
pub const CHARGE_BATCH_PAGES: u64 = 64;

/// Longest cgroup path a lifecycle event carries, NUL included.
pub const CGROUP_PATH_LEN: usize = 256;

/// One watched scope as the kernel sees it: a band the value is expected to
/// stay in. A value outside it is reported once, and the band is disarmed
/// until the agent (which owns thresholds, levels and hysteresis) re-reads
/// the scope and arms the band around the new level. Keeping the kernel side
/// to two comparisons keeps it cheap and keeps the verifier's work linear in
/// the depth of the cgroup walk.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    /// Report when the value reaches this (the next threshold up).
    pub rise_at: u64,
    /// Report when the value drops below this (the last threshold crossed,
    /// minus hysteresis).
    pub fall_below: u64,
    /// Last value the kernel compared, for inspection.
    pub last_value: u64,
}
const _: () = assert!(size_of::<Band>() == 24);

impl Band {
    /// A band nothing leaves: what the kernel writes after reporting.
    pub const DISARMED: Band = Band {
        rise_at: u64::MAX,
        fall_below: 0,
        last_value: 0,
    };

    #[inline(always)]
    pub fn contains(&self, value: u64) -> bool {
        value < self.rise_at && value >= self.fall_below
    }
}

/// A scope's value left its band, up or down.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrossingEvent {
    /// `EVENT_CROSSING`.
    pub kind: u32,
    /// `RESOURCE_MEMORY` or `RESOURCE_PIDS`.
    pub resource: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC when the kernel saw it.
    pub timestamp_ns: u64,
    /// Watched cgroup id, or `NODE_PIDS_SCOPE_ID`.
    pub scope_id: u64,
    /// Cgroup whose update led to the check (the leaf that allocated or forked).
    pub trigger_cgroup_id: u64,
    /// Bytes charged to the scope, or tasks in it.
    pub value: u64,
    /// The band edge crossed: `rise_at` when rising, `fall_below` when not.
    pub bound: u64,
    /// 1 when the value rose past `rise_at`, 0 when it fell below `fall_below`.
    pub rising: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<CrossingEvent>() == 56);

/// The kernel OOM killer chose a victim (`oom:mark_victim`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomVictimEvent {
    /// `EVENT_OOM_VICTIM`.
    pub kind: u32,
    pub pid: u32,
    pub timestamp_ns: u64,
    /// Cgroup id of the victim in the memory controller's hierarchy.
    pub memory_cgroup_id: u64,
    /// anon + file + shmem pages of the victim, in bytes. Read from the mm's
    /// per-CPU counters, so it may be off by their batch size per CPU.
    pub rss_bytes: u64,
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<OomVictimEvent>() == 48);

/// A cgroup was created or removed in some hierarchy.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupEvent {
    /// `EVENT_CGROUP_MKDIR` or `EVENT_CGROUP_RMDIR`.
    pub kind: u32,
    /// Hierarchy id as in `/proc/cgroups` (0 is the cgroup2 hierarchy).
    pub hierarchy_id: u32,
    pub timestamp_ns: u64,
    pub cgroup_id: u64,
    /// Depth below the hierarchy root (root = 0).
    pub level: u32,
    /// Bytes of `path` the kernel copied, NUL included; `CGROUP_PATH_LEN`
    /// means the path may have been cut.
    pub path_len: u32,
    /// Path relative to the hierarchy root, NUL-terminated.
    pub path: [u8; CGROUP_PATH_LEN],
}
const _: () = assert!(size_of::<CgroupEvent>() == 32 + CGROUP_PATH_LEN);

/// What the cgroup iterator writes for each memory cgroup it walks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupCharge {
    /// Cgroup id (the directory's inode number).
    pub cgroup_id: u64,
    /// `page_counter.usage` of the cgroup's memory: what v1
    /// `memory.usage_in_bytes` and v2 `memory.current` show, in pages.
    pub pages: u64,
}
const _: () = assert!(size_of::<CgroupCharge>() == 16);

/// Kernel struct layout the programs need, resolved by the agent from
/// `/sys/kernel/btf/vmlinux` at load time and handed over as a read-only
/// global. Rust eBPF cannot emit CO-RE relocations, so no offset is ever
/// compiled in. Offsets are in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    /// `mem_cgroup.css`.
    pub mem_cgroup_css: u32,
    /// `mem_cgroup.memory` + `page_counter.usage` (pages, atomic long).
    pub mem_cgroup_memory_usage: u32,
    /// `cgroup_subsys_state.cgroup`.
    pub css_cgroup: u32,
    /// `cgroup_subsys_state.parent`.
    pub css_parent: u32,
    /// `cgroup.kn`.
    pub cgroup_kn: u32,
    /// `kernfs_node.id` (the cgroup id userspace sees as the directory inode).
    pub kernfs_node_id: u32,
    /// `cgroup.level`.
    pub cgroup_level: u32,
    /// `cgroup.root`.
    pub cgroup_root: u32,
    /// `cgroup_root.hierarchy_id`.
    pub cgroup_root_hierarchy_id: u32,
    /// `task_struct.cgroups`.
    pub task_cgroups: u32,
    /// `css_set.subsys`.
    pub css_set_subsys: u32,
    /// `cgroup.subsys` + the memory controller's slot in it: a cgroup's
    /// memory css.
    pub cgroup_memory_css: u32,
    /// `obj_cgroup.memcg` where `folio.memcg_data` points to the folio's
    /// obj_cgroup, which points to its memory cgroup (Linux 7.x, whose LRU
    /// folios are reparented through it); `u32::MAX` where it points to
    /// the memory cgroup itself. In place of a padding field: the `u64`
    /// fields below stay aligned with none hidden.
    pub folio_objcg_memcg: u32,
    /// `enum cgroup_subsys_id` value of the memory controller.
    pub memory_subsys_id: u32,
    /// `enum cgroup_subsys_id` value of the pids controller.
    pub pids_subsys_id: u32,
    /// `pids_cgroup.counter` minus `pids_cgroup.css`, from the css pointer.
    pub pids_css_to_counter: i32,
    /// `task_struct.pid`.
    pub task_pid: u32,
    /// `task_struct.comm`.
    pub task_comm: u32,
    /// `task_struct.mm`.
    pub task_mm: u32,
    /// `mm_struct.rss_stat`: an array of `percpu_counter` (Linux 6.2 and
    /// later) or a `struct mm_rss_stat` of `atomic_long_t` (before).
    pub mm_rss_stat: u32,
    /// Bytes from one rss counter to the next.
    pub rss_stat_stride: u32,
    /// Offset of the count in one counter (`percpu_counter.count`, or 0).
    pub rss_stat_count: u32,
    /// `MM_FILEPAGES`, `MM_ANONPAGES`, `MM_SHMEMPAGES`.
    pub rss_file_index: u32,
    pub rss_anon_index: u32,
    pub rss_shmem_index: u32,
    /// `task_struct.thread_pid`.
    pub task_thread_pid: u32,
    /// `pid.numbers` + `upid.ns` (the level-0, i.e. initial, namespace).
    pub pid_init_ns: u32,
    /// `pid_namespace.pid_allocated`.
    pub pid_namespace_pid_allocated: u32,
    /// `folio.flags`.
    pub folio_flags: u32,
    /// `folio.memcg_data`: the memory cgroup charged, with flags in its low
    /// bits.
    pub folio_memcg_data: u32,
    /// The flag bits of `folio.memcg_data` (`__NR_MEMCG_DATA_FLAGS - 1`, or
    /// `__NR_OBJEXTS_FLAGS - 1` where the kernel has more).
    pub memcg_data_flags: u32,
    /// `PG_head`: the bit of `folio.flags` set on a large folio.
    pub pg_head: u32,
    pub page_shift: u32,
    /// 1 when aya-log output from the programs is wanted.
    pub log_enabled: u32,
    /// `mem_cgroup.nodeinfo`: a `mem_cgroup_per_node *` per NUMA node.
    pub mem_cgroup_nodeinfo: u32,
    /// `mem_cgroup_per_node.lruvec` + `lruvec.pgdat`: the NUMA node's
    /// `pglist_data`, set once the lruvec has served on that node.
    pub memcg_node_pgdat: u32,
    /// `pglist_data.vm_stat`: the node's counters, `atomic_long_t` each.
    pub pgdat_vm_stat: u32,
    /// `NR_ANON_MAPPED`, `NR_FILE_PAGES`, `NR_INACTIVE_FILE` (`enum
    /// node_stat_item`): kubelet's working set is anon + file − inactive
    /// file.
    pub node_stat_anon: u32,
    pub node_stat_file: u32,
    pub node_stat_inactive_file: u32,
    /// NUMA node ids (`nr_node_ids`) the root memory cgroup's value, the
    /// machine's working set, is added up over; 0 where the kernel's BTF
    /// lacks a field above, and then the root is never watched.
    pub numa_nodes: u32,
    /// Keeps the `u64` fields below aligned with no hidden padding.
    pub _pad2: u32,
    /// Bit `i` set when stat item `i` (`enum node_stat_item`, then `enum
    /// memcg_stat_item`) counts bytes (the kernel's `_B` items), not pages.
    pub byte_items_mask: [u64; 2],
    /// Pages of memcg stat churn a CPU accumulates before it re-reads the
    /// page counters of the cgroup being updated and its watched ancestors,
    /// far from a line; near one a CPU reads after its share of the pages
    /// left below it (`pages left / possible_cpus`).
    pub check_step_pages: u64,
    /// CPUs that may run the programs (`/sys/devices/system/cpu/possible`).
    pub possible_cpus: u64,
}
const _: () = assert!(size_of::<KernelLayout>() == 42 * 4 + 32);

/// Names of the maps and programs in the eBPF object, for the agent.
pub mod names {
    pub const MEMORY_SCOPES: &str = "MEMORY_SCOPES";
    pub const PIDS_SCOPES: &str = "PIDS_SCOPES";
    pub const PIDS_WATCHED: &str = "PIDS_WATCHED";
    pub const NODE_PIDS_BAND: &str = "NODE_PIDS_BAND";
    pub const EVENTS: &str = "EVENTS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const LAYOUT: &str = "LAYOUT";
    /// The cgroup iterator program, and the deepest level it reports.
    pub const CGROUP_CHARGES: &str = "cgroup_charges";
    pub const CHARGES_MAX_LEVEL: &str = "CHARGES_MAX_LEVEL";
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all are repr(C), Copy, made of integers with explicit padding.
    unsafe impl aya::Pod for Band {}
    unsafe impl aya::Pod for KernelLayout {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_is_half_open() {
        let band = Band {
            rise_at: 200,
            fall_below: 100,
            last_value: 0,
        };
        assert!(band.contains(100));
        assert!(band.contains(199));
        assert!(!band.contains(200));
        assert!(!band.contains(99));
        assert!(Band::DISARMED.contains(0));
        assert!(!Band::DISARMED.contains(u64::MAX));
    }
}
