//! evictd's kernel side: watch memory and PID usage of a few cgroup scopes and
//! push a ring-buffer record only when a scope crosses a threshold, plus OOM
//! victims and cgroup lifecycle.
//!
//! Only raw tracepoints are used: they attach without tracefs, need no
//! kprobes or fentry (absent on some kernels), and hand over the tracepoint's
//! own arguments (`struct mem_cgroup *`, `struct task_struct *`). Every kernel
//! struct offset comes from `LAYOUT`, which the agent fills from BTF at load.
//!
//! One file per hook family, as aya's `programs/` has one per program type:
//! `memory`, `pids`, `oom`, `cgroup_lifecycle` and the `cgroup_iter`
//! iterator; what they share is in `maps` (every map the agent opens by
//! name), `kernel_read` (struct reads at `LAYOUT`'s offsets) and `bands`
//! (the threshold check and its report).
#![no_std]
#![no_main]

use evictd_common::KernelLayout;

#[unsafe(no_mangle)]
static LAYOUT: KernelLayout = KernelLayout {
    mem_cgroup_css: 0,
    mem_cgroup_memory_usage: 0,
    css_cgroup: 0,
    css_parent: 0,
    cgroup_kn: 0,
    kernfs_node_id: 0,
    cgroup_level: 0,
    cgroup_root: 0,
    cgroup_root_hierarchy_id: 0,
    task_cgroups: 0,
    css_set_subsys: 0,
    cgroup_memory_css: 0,
    folio_objcg_memcg: u32::MAX,
    memory_subsys_id: u32::MAX,
    pids_subsys_id: u32::MAX,
    pids_css_to_counter: 0,
    task_pid: 0,
    task_comm: 0,
    task_mm: 0,
    mm_rss_stat: 0,
    rss_stat_stride: 0,
    rss_stat_count: 0,
    rss_file_index: 0,
    rss_anon_index: 0,
    rss_shmem_index: 0,
    task_thread_pid: 0,
    pid_init_ns: 0,
    pid_namespace_pid_allocated: 0,
    folio_flags: 0,
    folio_memcg_data: 0,
    memcg_data_flags: 0,
    pg_head: 0,
    page_shift: 12,
    log_enabled: 0,
    mem_cgroup_nodeinfo: 0,
    memcg_node_pgdat: 0,
    pgdat_vm_stat: 0,
    node_stat_anon: 0,
    node_stat_file: 0,
    node_stat_inactive_file: 0,
    numa_nodes: 0,
    _pad2: 0,
    byte_items_mask: [0; 2],
    check_step_pages: 0,
    possible_cpus: 1,
};

/// Reads one field of `LAYOUT`. Volatile, or the compiler would fold in the
/// zeroes above; the agent rewrites the values before the programs load.
macro_rules! layout {
    ($field:ident) => {
        unsafe { core::ptr::read_volatile(&raw const crate::LAYOUT.$field) }
    };
}

// After `layout!`, which a macro's textual scope makes visible only to the
// modules declared below it.
mod bands;
mod cgroup_iter;
mod cgroup_lifecycle;
mod kernel_read;
mod maps;
mod memory;
mod oom;
mod pids;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
