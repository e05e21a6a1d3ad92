//! Types shared by evictd's eBPF programs (`evictd-ebpf`) and its agent.
//!
//! Every type here crosses the kernel boundary as raw bytes, so each is
//! `#[repr(C)]`, `Copy`, has explicit padding (no implicit holes the two sides
//! could disagree on) and a size assertion. Flags are `u32`, never `bool`.
#![no_std]

use core::mem::size_of;

/// Most thresholds one watched scope can carry (kubelet configures at most a
/// hard and a soft threshold per signal; two spare slots for tiered alerts).
pub const MAX_THRESHOLDS: usize = 4;

/// Resource a watched scope or a crossing event refers to.
pub const RESOURCE_MEMORY: u32 = 0;
pub const RESOURCE_PIDS: u32 = 1;

/// Key of the node-wide PID scope in the `PIDS_SCOPES` map. Cgroup ids are
/// kernfs node ids and never 0 (the root cgroup is 1), so 0 is free.
pub const NODE_PIDS_SCOPE_ID: u64 = 0;

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

/// Longest cgroup path a lifecycle event carries, NUL included.
pub const CGROUP_PATH_LEN: usize = 256;

/// Ascending thresholds of one scope and the hysteresis band that keeps a
/// value hovering at a line from producing a stream of events.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Thresholds {
    /// Ascending; only the first `count` are meaningful.
    pub values: [u64; MAX_THRESHOLDS],
    /// A level is left only once the value is this far below its threshold.
    pub hysteresis: u64,
    pub count: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<Thresholds>() == 48);

impl Thresholds {
    /// The level `value` is at, coming from `current`: the number of
    /// thresholds crossed. Rising past threshold `i` needs `value >= t[i]`;
    /// falling back below it needs `value + hysteresis < t[i]`. Between the two
    /// the level does not move, which is what stops a hovering value from
    /// flooding the ring buffer.
    ///
    /// Written without early returns or data-dependent loop bounds so the BPF
    /// verifier sees a fixed four-step loop.
    #[inline(always)]
    pub fn next_level(&self, current: u32, value: u64) -> u32 {
        let count = if self.count as usize > MAX_THRESHOLDS {
            MAX_THRESHOLDS as u32
        } else {
            self.count
        };
        let sticky_value = value.saturating_add(self.hysteresis);
        let mut reached = 0u32;
        let mut held = 0u32;
        let mut i = 0usize;
        while i < MAX_THRESHOLDS {
            if (i as u32) < count {
                if value >= self.values[i] {
                    reached += 1;
                }
                if sticky_value >= self.values[i] {
                    held += 1;
                }
            }
            i += 1;
        }
        let current = if current > count { count } else { current };
        if reached > current {
            reached
        } else if held < current {
            held
        } else {
            current
        }
    }

    /// The threshold that a move from `old` to `new` crossed: the highest one
    /// reached when rising, the lowest one left when falling.
    #[inline(always)]
    pub fn crossed(&self, old: u32, new: u32) -> u64 {
        let index = if new > old { new - 1 } else { new };
        match self.values.get(index as usize) {
            Some(value) => *value,
            None => 0,
        }
    }
}

/// One watched scope: a cgroup (keyed by its cgroup id in the hierarchy of
/// the resource) or the node-wide PID count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    pub thresholds: Thresholds,
    /// Thresholds currently crossed, kept by the kernel; userspace seeds it
    /// from a fresh cgroupfs read when it installs the scope.
    pub level: u32,
    pub _pad: u32,
    /// Last value the kernel observed (bytes or tasks), for inspection.
    pub last_value: u64,
}
const _: () = assert!(size_of::<Scope>() == 64);

/// A scope's value crossed one of its thresholds, up or down.
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
    /// The threshold crossed (see `Thresholds::crossed`).
    pub threshold: u64,
    pub old_level: u32,
    pub new_level: u32,
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
    /// `mm_struct.rss_stat` (array of `percpu_counter`).
    pub mm_rss_stat: u32,
    /// `sizeof(struct percpu_counter)`.
    pub percpu_counter_size: u32,
    /// `percpu_counter.count`.
    pub percpu_counter_count: u32,
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
    pub page_shift: u32,
    /// 1 when aya-log output from the programs is wanted.
    pub log_enabled: u32,
    /// Bit `i` set when stat item `i` (`enum node_stat_item`, then `enum
    /// memcg_stat_item`) counts bytes (the kernel's `_B` items), not pages.
    pub byte_items_mask: [u64; 2],
    /// Pages of memcg stat churn a CPU accumulates before it re-reads the
    /// page counters of the cgroup being updated and its watched ancestors.
    pub check_step_pages: u64,
}
const _: () = assert!(size_of::<KernelLayout>() == 28 * 4 + 24);

/// Names of the maps and programs in the eBPF object, for the agent.
pub mod names {
    pub const MEMORY_SCOPES: &str = "MEMORY_SCOPES";
    pub const PIDS_SCOPES: &str = "PIDS_SCOPES";
    pub const EVENTS: &str = "EVENTS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const LAYOUT: &str = "LAYOUT";
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all are repr(C), Copy, made of integers with explicit padding.
    unsafe impl aya::Pod for Thresholds {}
    unsafe impl aya::Pod for Scope {}
    unsafe impl aya::Pod for KernelLayout {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thresholds(values: &[u64], hysteresis: u64) -> Thresholds {
        let mut t = Thresholds {
            hysteresis,
            count: values.len() as u32,
            ..Default::default()
        };
        t.values[..values.len()].copy_from_slice(values);
        t
    }

    #[test]
    fn rises_through_every_threshold_reached_at_once() {
        let t = thresholds(&[100, 200, 300], 10);
        assert_eq!(t.next_level(0, 99), 0);
        assert_eq!(t.next_level(0, 100), 1);
        assert_eq!(t.next_level(0, 250), 2);
        assert_eq!(t.next_level(1, 1000), 3);
    }

    #[test]
    fn falls_only_past_the_hysteresis_band() {
        let t = thresholds(&[100, 200], 10);
        assert_eq!(t.next_level(1, 95), 1, "inside the band: stays");
        assert_eq!(t.next_level(1, 90), 1, "exactly at the band edge: stays");
        assert_eq!(t.next_level(1, 89), 0);
        assert_eq!(t.next_level(2, 150), 1);
        assert_eq!(t.next_level(2, 0), 0);
    }

    #[test]
    fn hovering_at_the_line_changes_level_once() {
        let t = thresholds(&[1000], 50);
        let mut level = 0;
        let mut changes = 0;
        for value in [999, 1000, 990, 1001, 960, 1000, 955, 1002] {
            let next = t.next_level(level, value);
            if next != level {
                changes += 1;
            }
            level = next;
        }
        assert_eq!(changes, 1);
        assert_eq!(level, 1);
    }

    #[test]
    fn no_thresholds_means_level_zero() {
        let t = thresholds(&[], 0);
        assert_eq!(t.next_level(0, u64::MAX), 0);
        assert_eq!(t.next_level(3, 0), 0, "a stale level is clamped");
    }

    #[test]
    fn crossed_names_the_line() {
        let t = thresholds(&[100, 200, 300], 0);
        assert_eq!(t.crossed(0, 2), 200);
        assert_eq!(t.crossed(2, 1), 200);
        assert_eq!(t.crossed(1, 0), 100);
    }
}
