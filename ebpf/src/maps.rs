//! Every map, the names the agent opens them by (a map's ELF symbol is its
//! static's name), and the per-CPU counters every hook family bumps: one
//! file, so the kernel side's whole map interface reads in one place.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use evictd_common::{Band, COUNTERS_LEN, EVENTS_RING_BYTES, PIDS_WATCHED_LEN};

#[map]
pub(crate) static MEMORY_SCOPES: HashMap<u64, Band> = HashMap::with_max_entries(4096, 0);

#[map]
pub(crate) static PIDS_SCOPES: HashMap<u64, Band> = HashMap::with_max_entries(4096, 0);

/// How many pids cgroups `PIDS_SCOPES` holds, and whether the node-wide
/// band is watched (`PIDS_WATCHED_*`); the agent keeps both.
#[map]
pub(crate) static PIDS_WATCHED: Array<u64> = Array::with_max_entries(PIDS_WATCHED_LEN, 0);

/// The node-wide band, read at every fork and free on the node: an array's
/// element is found without hashing a key (a hash lookup of it cost about
/// 230 ns a fork; design note). The agent's update copies into the element
/// where a hash map's swaps it, so a fork during one may see half of each
/// band: at worst one report too many, which the agent settles on a fresh
/// reading, or a crossing left to the next fork or free.
#[map]
pub(crate) static NODE_PIDS_BAND: Array<Band> = Array::with_max_entries(1, 0);

#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// Pages of churn this CPU may still see before it reads page counters.
#[map]
pub(crate) static CHECK_BUDGET: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// 1 while this CPU's last read of a watched scope found it near its line,
/// within what the CPUs may charge before this one reads again: each task
/// switched out on this CPU has its memory cgroup read until a read of a
/// watched scope finds it farther (see `memory_switch_out`).
#[map]
pub(crate) static NEAR_A_LINE: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// The deepest cgroup level (root = 0) the cgroup iterator reports: a
/// Burstable or BestEffort pod's, which leaves out all containers but a
/// Guaranteed pod's, so that one read holds every pod.
#[map]
pub(crate) static CHARGES_MAX_LEVEL: Array<u32> = Array::with_max_entries(1, 0);

#[map]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS_LEN, 0);

pub(crate) fn bump(counter: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter) {
        // SAFETY: per-CPU slot, only this CPU writes it with preemption off.
        unsafe { *slot += 1 };
    }
}
