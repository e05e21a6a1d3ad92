//! evictd's kernel side: watch memory and PID usage of a few cgroup scopes and
//! push a ring-buffer record only when a scope crosses a threshold, plus OOM
//! victims and cgroup lifecycle.
//!
//! Only raw tracepoints are used: they attach without tracefs, need no
//! kprobes or fentry (absent on some kernels), and hand over the tracepoint's
//! own arguments (`struct mem_cgroup *`, `struct task_struct *`). Every kernel
//! struct offset comes from `LAYOUT`, which the agent fills from BTF at load.
#![no_std]
#![no_main]

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{
        bpf_probe_read_kernel, bpf_probe_read_kernel_buf, bpf_probe_read_kernel_str_bytes,
        generated::{bpf_get_current_task, bpf_ktime_get_ns, bpf_seq_write},
    },
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use aya_log_ebpf::info;
use evictd_common::{
    Band, CGROUP_PATH_LEN, CHARGE_BATCH_PAGES, COUNTER_MEMORY_CHECKS, COUNTER_READ_ERRORS,
    COUNTER_RINGBUF_DROPS, COUNTERS_LEN, CgroupCharge, CgroupEvent, CrossingEvent,
    EVENT_CGROUP_MKDIR, EVENT_CGROUP_RMDIR, EVENT_CROSSING, EVENT_OOM_VICTIM, EVENTS_RING_BYTES,
    KernelLayout, NODE_PIDS_SCOPE_ID, OomVictimEvent, PIDS_WATCHED_CGROUPS, PIDS_WATCHED_LEN,
    PIDS_WATCHED_NODE, RESOURCE_MEMORY, RESOURCE_PIDS,
};

/// Deepest cgroup nesting walked from a leaf towards the root. kubelet's
/// trees are about six levels deep (slice/qos/pod/container under a node).
const MAX_DEPTH: u32 = 16;

/// NUMA node ids the machine's working set is added up over, at most.
const MAX_NUMA_NODES: u32 = 64;

/// Folios a CPU's LRU batch holds before they are put on a list
/// (`PAGEVEC_SIZE`).
const LRU_BATCH_FOLIOS: u64 = 31;

/// `pid_namespace.pid_allocated` carries this flag while the namespace is
/// being set up; it is not a count.
const PIDNS_ADDING: u32 = 1 << 31;

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
        unsafe { core::ptr::read_volatile(&raw const LAYOUT.$field) }
    };
}

#[map]
static MEMORY_SCOPES: HashMap<u64, Band> = HashMap::with_max_entries(4096, 0);

#[map]
static PIDS_SCOPES: HashMap<u64, Band> = HashMap::with_max_entries(4096, 0);

/// How many pids cgroups `PIDS_SCOPES` holds, and whether the node-wide
/// band is watched (`PIDS_WATCHED_*`); the agent keeps both.
#[map]
static PIDS_WATCHED: Array<u64> = Array::with_max_entries(PIDS_WATCHED_LEN, 0);

/// The node-wide band, read at every fork and free on the node: an array's
/// element is found without hashing a key (a hash lookup of it cost about
/// 230 ns a fork; design note). The agent's update copies into the element
/// where a hash map's swaps it, so a fork during one may see half of each
/// band: at worst one report too many, which the agent settles on a fresh
/// reading, or a crossing left to the next fork or free.
#[map]
static NODE_PIDS_BAND: Array<Band> = Array::with_max_entries(1, 0);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// Pages of churn this CPU may still see before it reads page counters.
#[map]
static CHECK_BUDGET: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// 1 while this CPU's last read of a watched scope found it near its line,
/// within what the CPUs may charge before this one reads again: each task
/// switched out on this CPU has its memory cgroup read until a read of a
/// watched scope finds it farther (see `memory_switch_out`).
#[map]
static NEAR_A_LINE: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// The deepest cgroup level (root = 0) the cgroup iterator reports: a
/// Burstable or BestEffort pod's, which leaves out all containers but a
/// Guaranteed pod's, so that one read holds every pod.
#[map]
static CHARGES_MAX_LEVEL: Array<u32> = Array::with_max_entries(1, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS_LEN, 0);

fn bump(counter: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter) {
        // SAFETY: per-CPU slot, only this CPU writes it with preemption off.
        unsafe { *slot += 1 };
    }
}

/// Reads a `T` at kernel address `base + offset`.
#[inline(always)]
fn read<T>(base: u64, offset: u64) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_kernel validates the address and fails cleanly.
    unsafe { bpf_probe_read_kernel((base + offset) as *const T) }
}

/// Cgroup id (kernfs node id, the directory's inode number) of a css.
#[inline(always)]
fn css_cgroup_id(css: u64) -> Result<u64, i32> {
    let cgroup: u64 = read(css, layout!(css_cgroup) as u64)?;
    let kn: u64 = read(cgroup, layout!(cgroup_kn) as u64)?;
    read(kn, layout!(kernfs_node_id) as u64)
}

/// A task's css in controller `subsys_id`.
#[inline(always)]
fn task_css(task: u64, subsys_id: u32) -> Result<u64, i32> {
    let css_set: u64 = read(task, layout!(task_cgroups) as u64)?;
    read(
        css_set,
        layout!(css_set_subsys) as u64 + subsys_id as u64 * 8,
    )
}

// ---------------------------------------------------------------------------
// Memory

/// Hottest hook (hundreds of thousands of calls a second under churn): one
/// per-CPU array slot and a compare on the common path.
#[raw_tracepoint(tracepoint = "mod_memcg_lruvec_state")]
pub fn memcg_lruvec_state(ctx: RawTracePointContext) -> i32 {
    on_memcg_stat(&ctx);
    0
}

#[raw_tracepoint(tracepoint = "mod_memcg_state")]
pub fn memcg_state(ctx: RawTracePointContext) -> i32 {
    on_memcg_stat(&ctx);
    0
}

/// Both tracepoints have the prototype `(struct mem_cgroup *, int item, int val)`.
#[inline(always)]
fn on_memcg_stat(ctx: &RawTracePointContext) {
    let memcg: u64 = ctx.arg(0);
    let item = ctx.arg::<u64>(1) as u32;
    let delta = ctx.arg::<u64>(2) as i32;
    let mut pages = delta.unsigned_abs() as u64;
    if item < 128 {
        let mask = if item < 64 {
            layout!(byte_items_mask)[0]
        } else {
            layout!(byte_items_mask)[1]
        };
        if mask & (1 << (item % 64)) != 0 {
            pages >>= layout!(page_shift);
        }
    }
    if !spend_check_budget(pages) {
        return;
    }
    if check_memory(memcg + layout!(mem_cgroup_css) as u64).is_err() {
        bump(COUNTER_READ_ERRORS);
    }
}

/// `mm_lru_insertion(struct folio *)`: a folio joins an LRU list, which a
/// page charged to a memory cgroup does right after its charge (an anon
/// fault, the page cache, a swap-in) and which no free ever does, so a node
/// freeing memory pays nothing. The folio carries the memory cgroup charged,
/// whichever task or kernel thread inserts it.
#[raw_tracepoint(tracepoint = "mm_lru_insertion")]
pub fn lru_insertion(ctx: RawTracePointContext) -> i32 {
    if on_lru_insertion(ctx.arg(0)).is_err() {
        bump(COUNTER_READ_ERRORS);
    }
    0
}

#[inline(always)]
fn on_lru_insertion(folio: u64) -> Result<(), i32> {
    let flags: u64 = read(folio, layout!(folio_flags) as u64)?;
    // A large folio (a transparent huge page: 512 pages) spends the whole
    // step: the usage is read at once.
    let pages = if flags & (1 << (layout!(pg_head) & 63)) != 0 {
        layout!(check_step_pages)
    } else {
        1
    };
    if !spend_check_budget(pages) {
        return Ok(());
    }
    let memcg_data: u64 = read(folio, layout!(folio_memcg_data) as u64)?;
    let mut memcg = memcg_data & !(layout!(memcg_data_flags) as u64);
    let objcg_memcg = layout!(folio_objcg_memcg);
    if memcg != 0 && objcg_memcg != u32::MAX {
        // Linux 7.x: the folio holds its obj_cgroup.
        memcg = read(memcg, objcg_memcg as u64)?;
    }
    if memcg == 0 {
        // Not charged (memory cgroups disabled, or not yet committed).
        return Ok(());
    }
    check_memory(memcg + layout!(mem_cgroup_css) as u64)
}

/// `mod_memcg_state` growing: kernel memory charged (slab, page tables,
/// sockets), which never joins an LRU list. Shrinking stats are passed over
/// before any work, as on the LRU side.
#[raw_tracepoint(tracepoint = "mod_memcg_state")]
pub fn memcg_charge_state(ctx: RawTracePointContext) -> i32 {
    if (ctx.arg::<u64>(2) as i32) > 0 {
        on_memcg_stat(&ctx);
    }
    0
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct
/// *next, unsigned int prev_state)`, with every memory hook. Each CPU reads
/// the page counters once per check step of churn, `lru_insertion` sees a
/// folio when the per-CPU LRU batch (up to 31 folios) is moved to the list,
/// and `page_alloc` before the page is charged; so the last charges of a
/// burst wait for the next burst when the task then sleeps: milliseconds
/// for a paced allocator, forever for one that stops just past a line. Near
/// a line (`NEAR_A_LINE`) the task leaving this CPU, which may have made
/// those charges, has its memory cgroup read; a task in no watched scope
/// leaves the mark for the next. Everywhere else this is one per-CPU load
/// per context switch.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn memory_switch_out(ctx: RawTracePointContext) -> i32 {
    let Some(mark) = NEAR_A_LINE.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU slot; tracepoints run with preemption disabled.
    if unsafe { *mark } == 0 {
        return 0;
    }
    // The read below clears the mark only if it finds a watched scope far
    // from its line: a task in no watched scope (a kworker, the agent)
    // leaves it for the task that made the charges.
    let memory_subsys_id = layout!(memory_subsys_id);
    if memory_subsys_id == u32::MAX {
        return 0;
    }
    let checked = task_css(ctx.arg(1), memory_subsys_id).and_then(check_memory);
    if checked.is_err() {
        bump(COUNTER_READ_ERRORS);
    }
    0
}

/// `mm_page_alloc(struct page *, unsigned int order, gfp_t, int migratetype)`:
/// the memory trigger of kernels without the memcg stat tracepoints (before
/// 6.x, e.g. 6.1). Every page a memory cgroup is charged for is allocated
/// first, mostly by the task it is charged to, so the allocating task's
/// memory cgroup is the one to look at.
#[raw_tracepoint(tracepoint = "mm_page_alloc")]
pub fn page_alloc(ctx: RawTracePointContext) -> i32 {
    on_page_churn(ctx.arg::<u64>(1) as u32);
    0
}

/// `mm_page_free(struct page *, unsigned int order)`: pages are uncharged
/// before they are freed, so a fall below a band shows here; frees outside
/// the owner's context (reclaim) are left to the agent's resync.
#[raw_tracepoint(tracepoint = "mm_page_free")]
pub fn page_free(ctx: RawTracePointContext) -> i32 {
    on_page_churn(ctx.arg::<u64>(1) as u32);
    0
}

#[inline(always)]
fn on_page_churn(order: u32) {
    // Orders above MAX_ORDER do not exist; the mask keeps the shift defined.
    if !spend_check_budget(1 << (order & 31)) {
        return;
    }
    let memory_subsys_id = layout!(memory_subsys_id);
    if memory_subsys_id == u32::MAX {
        return;
    }
    // SAFETY: helper without preconditions.
    let current = unsafe { bpf_get_current_task() };
    let checked = task_css(current, memory_subsys_id).and_then(check_memory);
    if checked.is_err() {
        bump(COUNTER_READ_ERRORS);
    }
}

/// Spends `pages` of churn from this CPU's budget; true (and a full check
/// step as the next budget) once it is spent, when the page counters are
/// due for a read.
#[inline(always)]
fn spend_check_budget(pages: u64) -> bool {
    if pages == 0 {
        return false;
    }
    let Some(budget) = CHECK_BUDGET.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU slot; tracepoints run with preemption disabled.
    let left = unsafe { *budget };
    if pages < left {
        unsafe { *budget = left - pages };
        return false;
    }
    let step = layout!(check_step_pages);
    unsafe { *budget = step };
    bump(COUNTER_MEMORY_CHECKS);
    true
}

/// A read found a watched scope `pages_to_line` pages below its line.
/// The page counter moves by whole charge batches (the kernel's per-CPU
/// stock), so within a batch of the line this CPU reads at its next
/// charge: the charge whose batch crosses is seen at once, not up to a
/// check step later, when the allocating task may be asleep for
/// milliseconds. A few batches away each CPU reads after its share of the
/// distance left. Far from every line nothing changes; next to one this
/// costs a read per page charged until the line is crossed, and the task
/// this CPU switches out next is read once more (`memory_switch_out`).
#[inline(always)]
fn read_sooner_near_a_line(pages_to_line: u64) {
    let next = if pages_to_line < CHARGE_BATCH_PAGES {
        1
    } else {
        pages_to_line
            .checked_div(layout!(possible_cpus))
            .unwrap_or(pages_to_line)
    };
    let step = layout!(check_step_pages);
    // Before this CPU reads again it may charge a check step, a charge
    // batch and an LRU batch more (and so may every other CPU), and the
    // charges of a task that then sleeps wait for its switch-out.
    let switch_out_reach = (step + CHARGE_BATCH_PAGES + LRU_BATCH_FOLIOS) * layout!(possible_cpus);
    if let Some(mark) = NEAR_A_LINE.get_ptr_mut(0) {
        // SAFETY: per-CPU slot; tracepoints run with preemption disabled.
        unsafe { *mark = u32::from(pages_to_line < switch_out_reach) };
    }
    if next >= step {
        return;
    }
    if let Some(budget) = CHECK_BUDGET.get_ptr_mut(0) {
        // SAFETY: as in spend_check_budget.
        unsafe { *budget = next.max(1) };
    }
}

/// Re-reads every watched scope from the memory css `css` up to the root:
/// a cgroup's page counter, what the kernel charges and limits against,
/// exact at this instant; the root's, which leaves out tasks in the root
/// cgroup and holds kernel memory and page cache kubelet does not count,
/// gives way to the machine's working set ([`machine_working_set`]).
#[inline(always)]
fn check_memory(mut css: u64) -> Result<(), i32> {
    let css_offset = layout!(mem_cgroup_css) as u64;
    let usage_offset = layout!(mem_cgroup_memory_usage) as u64;
    let page_shift = layout!(page_shift);
    let mut trigger = 0u64;
    let mut pages_to_line = u64::MAX;
    let mut depth = 0u32;
    while depth < MAX_DEPTH && css != 0 {
        let id = css_cgroup_id(css)?;
        if depth == 0 {
            trigger = id;
        }
        let parent: u64 = read(css, layout!(css_parent) as u64)?;
        if let Some(scope) = MEMORY_SCOPES.get_ptr_mut(id) {
            let pages = if parent == 0 {
                machine_working_set(css - css_offset)?
            } else {
                read::<i64>(css - css_offset, usage_offset)?.max(0) as u64
            };
            let bytes = pages << page_shift;
            update_scope(scope, RESOURCE_MEMORY, id, trigger, bytes);
            // SAFETY: a live map value; a band just left is disarmed (no
            // line above) until the agent arms it again.
            let rise_at = unsafe { (*scope).rise_at };
            pages_to_line = pages_to_line.min(rise_at.saturating_sub(bytes) >> page_shift);
        }
        css = parent;
        depth += 1;
    }
    // Only a watched scope says how near a line this CPU is: a charge or a
    // switch-out in another cgroup must not take the mark off.
    if pages_to_line != u64::MAX {
        read_sooner_near_a_line(pages_to_line);
    }
    Ok(())
}

/// kubelet's working set of the whole machine, in pages: anon + file −
/// inactive file, each NUMA node's running counters (`pglist_data.vm_stat`,
/// which /proc/vmstat adds up; each CPU folds its changes in past a small
/// threshold, lower under memory pressure), reached through the root
/// memory cgroup `memcg`'s per-node lruvecs.
#[inline(always)]
fn machine_working_set(memcg: u64) -> Result<u64, i32> {
    let nodes = layout!(numa_nodes);
    if nodes == 0 {
        // The agent never watches the root then.
        return Err(0);
    }
    let stat = |pgdat: u64, item: u32| -> Result<i64, i32> {
        read(pgdat + layout!(pgdat_vm_stat) as u64, item as u64 * 8)
    };
    let mut pages = 0i64;
    let mut nid = 0u32;
    while nid < MAX_NUMA_NODES && nid < nodes {
        let per_node: u64 = read(memcg, layout!(mem_cgroup_nodeinfo) as u64 + nid as u64 * 8)?;
        if per_node != 0 {
            let pgdat: u64 = read(per_node, layout!(memcg_node_pgdat) as u64)?;
            // A lruvec that has not served on its node yet: nothing there
            // for the root (a possible node with no memory), or a count
            // this misses, which the agent's reading and resync make good.
            if pgdat != 0 {
                pages += stat(pgdat, layout!(node_stat_anon))?
                    + stat(pgdat, layout!(node_stat_file))?
                    - stat(pgdat, layout!(node_stat_inactive_file))?;
            }
        }
        nid += 1;
    }
    Ok(pages.max(0) as u64)
}

// ---------------------------------------------------------------------------
// PIDs

/// `sched_process_fork(struct task_struct *parent, struct task_struct *child)`:
/// the child is already charged to its pids cgroup here.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn task_fork(ctx: RawTracePointContext) -> i32 {
    if check_pids(ctx.arg(1)).is_err() {
        bump(COUNTER_READ_ERRORS);
    }
    0
}

/// `sched_process_free(struct task_struct *p)`: after release, so the task is
/// uncharged from its pids cgroup and its pid freed.
#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn task_free(ctx: RawTracePointContext) -> i32 {
    if check_pids(ctx.arg(0)).is_err() {
        bump(COUNTER_READ_ERRORS);
    }
    0
}

/// Whether pids cgroups (`PIDS_WATCHED_CGROUPS`) or the node
/// (`PIDS_WATCHED_NODE`) are watched: without a pids cgroup (a node
/// watched as a whole, through the pid namespace) a fork walks no cgroup.
#[inline(always)]
fn pids_watched(index: u32) -> bool {
    PIDS_WATCHED.get(index).is_some_and(|value| *value != 0)
}

#[inline(always)]
fn check_pids(task: u64) -> Result<(), i32> {
    let subsys_id = layout!(pids_subsys_id);
    let walk = subsys_id != u32::MAX && pids_watched(PIDS_WATCHED_CGROUPS);
    let mut trigger_id = 0;
    if walk {
        let mut css = task_css(task, subsys_id)?;
        let counter_offset = layout!(pids_css_to_counter) as i64;
        let mut depth = 0u32;
        while depth < MAX_DEPTH && css != 0 {
            let id = css_cgroup_id(css)?;
            if depth == 0 {
                trigger_id = id;
            }
            if let Some(scope) = PIDS_SCOPES.get_ptr_mut(id) {
                let tasks: i64 = read(css.wrapping_add_signed(counter_offset), 0)?;
                update_scope(scope, RESOURCE_PIDS, id, trigger_id, tasks.max(0) as u64);
            }
            css = read(css, layout!(css_parent) as u64)?;
            depth += 1;
        }
    }
    if pids_watched(PIDS_WATCHED_NODE)
        && let Some(scope) = NODE_PIDS_BAND.get_ptr_mut(0)
    {
        // The freed task has no pid any more; the current task always has
        // one, and level 0 of any pid is the initial namespace.
        // SAFETY: helper without preconditions.
        let current = unsafe { bpf_get_current_task() };
        let pid: u64 = read(current, layout!(task_thread_pid) as u64)?;
        let namespace: u64 = read(pid, layout!(pid_init_ns) as u64)?;
        let allocated: u32 = read(namespace, layout!(pid_namespace_pid_allocated) as u64)?;
        let tasks = (allocated & !PIDNS_ADDING) as u64;
        // SAFETY: a live map value.
        let leaves_band = !unsafe { (*scope).contains(tasks) };
        if leaves_band && !walk && subsys_id != u32::MAX {
            // Only a report names the task's cgroup: read it then.
            trigger_id = css_cgroup_id(task_css(task, subsys_id)?)?;
        }
        update_scope(scope, RESOURCE_PIDS, NODE_PIDS_SCOPE_ID, trigger_id, tasks);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Bands

/// Compares `value` with the scope's band; outside it, reports once and
/// disarms the band until the agent arms it around the new level.
#[inline(always)]
fn update_scope(
    scope: *mut Band,
    resource: u32,
    scope_id: u64,
    trigger_cgroup_id: u64,
    value: u64,
) {
    // SAFETY: a live map value. Two CPUs may both see the value leave the
    // band and both report; the agent handles a repeat as a no-op.
    let band = unsafe { &mut *scope };
    band.last_value = value;
    if band.contains(value) {
        return;
    }
    let rising = value >= band.rise_at;
    let bound = if rising {
        band.rise_at
    } else {
        band.fall_below
    };
    *band = Band {
        last_value: value,
        ..Band::DISARMED
    };
    let event = CrossingEvent {
        kind: EVENT_CROSSING,
        resource,
        // SAFETY: helper without preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        scope_id,
        trigger_cgroup_id,
        value,
        bound,
        rising: u32::from(rising),
        _pad: 0,
    };
    if EVENTS.output::<CrossingEvent>(&event, 0).is_err() {
        bump(COUNTER_RINGBUF_DROPS);
    }
}

// ---------------------------------------------------------------------------
// OOM kills

/// `mark_victim(struct task_struct *task, uid_t uid)` (Linux 6.8 and later,
/// and Debian's 6.1, which backported it).
#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_mark_victim(ctx: RawTracePointContext) -> i32 {
    if report_oom_victim(&ctx).is_err() {
        bump(COUNTER_READ_ERRORS);
    }
    0
}

fn report_oom_victim(ctx: &RawTracePointContext) -> Result<(), i32> {
    let task: u64 = ctx.arg(0);
    let pid: u32 = read(task, layout!(task_pid) as u64)?;
    let mut comm = [0u8; 16];
    let comm_address = task + layout!(task_comm) as u64;
    // SAFETY: fixed-size copy into a local buffer.
    unsafe { bpf_probe_read_kernel_buf(comm_address as *const u8, &mut comm)? };
    let memory_subsys_id = layout!(memory_subsys_id);
    let memory_cgroup_id = if memory_subsys_id == u32::MAX {
        0
    } else {
        css_cgroup_id(task_css(task, memory_subsys_id)?)?
    };
    let mm: u64 = read(task, layout!(task_mm) as u64)?;
    let rss_pages = if mm == 0 {
        0
    } else {
        rss_counter(mm, layout!(rss_file_index))?
            + rss_counter(mm, layout!(rss_anon_index))?
            + rss_counter(mm, layout!(rss_shmem_index))?
    };
    let event = OomVictimEvent {
        kind: EVENT_OOM_VICTIM,
        pid,
        // SAFETY: helper without preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        memory_cgroup_id,
        rss_bytes: rss_pages << layout!(page_shift),
        comm,
    };
    if EVENTS.output::<OomVictimEvent>(&event, 0).is_err() {
        bump(COUNTER_RINGBUF_DROPS);
    }
    if layout!(log_enabled) != 0 {
        info!(ctx, "oom victim pid {} memcg {}", pid, memory_cgroup_id);
    }
    Ok(())
}

fn rss_counter(mm: u64, index: u32) -> Result<u64, i32> {
    let offset = layout!(mm_rss_stat) as u64
        + index as u64 * layout!(rss_stat_stride) as u64
        + layout!(rss_stat_count) as u64;
    let pages: i64 = read(mm, offset)?;
    Ok(pages.max(0) as u64)
}

// ---------------------------------------------------------------------------
// cgroup lifecycle

/// `cgroup_mkdir(struct cgroup *cgrp, const char *path)`.
#[raw_tracepoint(tracepoint = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: RawTracePointContext) -> i32 {
    if report_cgroup(&ctx, EVENT_CGROUP_MKDIR).is_err() {
        bump(COUNTER_READ_ERRORS);
    }
    0
}

/// `cgroup_rmdir(struct cgroup *cgrp, const char *path)`.
#[raw_tracepoint(tracepoint = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: RawTracePointContext) -> i32 {
    if report_cgroup(&ctx, EVENT_CGROUP_RMDIR).is_err() {
        bump(COUNTER_READ_ERRORS);
    }
    0
}

fn report_cgroup(ctx: &RawTracePointContext, kind: u32) -> Result<(), i32> {
    let cgroup: u64 = ctx.arg(0);
    let path: u64 = ctx.arg(1);
    let kn: u64 = read(cgroup, layout!(cgroup_kn) as u64)?;
    let cgroup_id: u64 = read(kn, layout!(kernfs_node_id) as u64)?;
    let level: u32 = read(cgroup, layout!(cgroup_level) as u64)?;
    let root: u64 = read(cgroup, layout!(cgroup_root) as u64)?;
    let hierarchy_id: u32 = read(root, layout!(cgroup_root_hierarchy_id) as u64)?;
    let Some(mut entry) = EVENTS.reserve::<CgroupEvent>(0) else {
        bump(COUNTER_RINGBUF_DROPS);
        return Ok(());
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reserved record of the right size; every
    // field is written before submit (the path up to `path_len`).
    let copied = unsafe {
        (*event).kind = kind;
        (*event).hierarchy_id = hierarchy_id;
        (*event).timestamp_ns = bpf_ktime_get_ns();
        (*event).cgroup_id = cgroup_id;
        (*event).level = level;
        bpf_probe_read_kernel_str_bytes(path as *const u8, &mut (*event).path)
            .map(|bytes| bytes.len() as u32 + 1)
            .unwrap_or(0)
    };
    unsafe { (*event).path_len = copied.min(CGROUP_PATH_LEN as u32) };
    entry.submit(0);
    Ok(())
}

// ---------------------------------------------------------------------------
// Charges of every memory cgroup, in one read

/// `struct bpf_iter_meta`: the verifier types `seq` as the `seq_file` that
/// `bpf_seq_write` wants, so it is loaded as a field, not probe-read.
#[repr(C)]
struct IterMeta {
    seq: *mut c_void,
}

/// `struct bpf_iter__cgroup`.
#[repr(C)]
struct CgroupIterContext {
    meta: *const IterMeta,
    cgroup: u64,
}

/// A cgroup iterator (`iter/cgroup`, Linux 6.1; on a v1 hierarchy 6.7):
/// one read of the iterator walks the memory cgroups under the one it was
/// attached to and writes a [`CgroupCharge`] for each, where reading each
/// pod's usage file costs a system call per pod.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/cgroup")]
pub extern "C" fn cgroup_charges(ctx: *mut c_void) -> i32 {
    let ctx = ctx as *const CgroupIterContext;
    // SAFETY: the kernel passes a `bpf_iter__cgroup`; `meta` is never null.
    let seq = unsafe {
        core::ptr::read_volatile(&raw const (*core::ptr::read_volatile(&raw const (*ctx).meta)).seq)
    };
    // Read as a plain number: the verifier allows no variable offset from
    // the typed pointer the context holds.
    let Ok(cgroup) = read::<u64>(
        ctx as u64,
        core::mem::offset_of!(CgroupIterContext, cgroup) as u64,
    ) else {
        bump(COUNTER_READ_ERRORS);
        return 0;
    };
    // The walk's end calls once more with no cgroup.
    if cgroup == 0 {
        return 0;
    }
    let max_level = CHARGES_MAX_LEVEL.get(0).copied().unwrap_or(0);
    match read::<i32>(cgroup, layout!(cgroup_level) as u64) {
        Ok(level) if level as u32 > max_level => return 0,
        Ok(_) => {}
        Err(_) => {
            bump(COUNTER_READ_ERRORS);
            return 0;
        }
    }
    let charge = match cgroup_charge(cgroup) {
        Ok(Some(charge)) => charge,
        Ok(None) => return 0,
        Err(_) => {
            bump(COUNTER_READ_ERRORS);
            return 0;
        }
    };
    // A record past the kernel's buffer fails the whole read in userspace
    // (EOPNOTSUPP when it goes on), so the result here tells nothing more.
    // SAFETY: `seq` is the iterator's seq_file; `charge` lives on the stack.
    unsafe {
        bpf_seq_write(
            seq as *mut _,
            (&raw const charge).cast(),
            size_of::<CgroupCharge>() as u32,
        )
    };
    0
}

#[inline(always)]
fn cgroup_charge(cgroup: u64) -> Result<Option<CgroupCharge>, i32> {
    let css: u64 = read(cgroup, layout!(cgroup_memory_css) as u64)?;
    // A v2 cgroup whose parent does not enable the memory controller.
    if css == 0 {
        return Ok(None);
    }
    let kn: u64 = read(cgroup, layout!(cgroup_kn) as u64)?;
    let pages: i64 = read(
        css - layout!(mem_cgroup_css) as u64,
        layout!(mem_cgroup_memory_usage) as u64,
    )?;
    Ok(Some(CgroupCharge {
        cgroup_id: read(kn, layout!(kernfs_node_id) as u64)?,
        pages: pages.max(0) as u64,
    }))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
