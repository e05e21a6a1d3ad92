//! Memory hooks: the memcg stat tracepoints, LRU insertion, page alloc and
//! free (kernels without the memcg tracepoints) and the switch-out read near
//! a line. Each spends one per-CPU budget of churn, then re-reads the
//! watched scopes' page counters (`check_memory`).

use aya_ebpf::{
    helpers::generated::bpf_get_current_task, macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use evictd_common::{
    CHARGE_BATCH_PAGES, COUNTER_MEMORY_CHECKS, COUNTER_READ_ERRORS, RESOURCE_MEMORY,
};

use crate::{
    bands::update_scope,
    kernel_read::{MAX_DEPTH, css_cgroup_id, read, task_css},
    maps::{CHECK_BUDGET, MEMORY_SCOPES, NEAR_A_LINE, bump},
};

/// NUMA node ids the machine's working set is added up over, at most.
const MAX_NUMA_NODES: u32 = 64;

/// Folios a CPU's LRU batch holds before they are put on a list
/// (`PAGEVEC_SIZE`).
const LRU_BATCH_FOLIOS: u64 = 31;

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
