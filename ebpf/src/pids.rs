//! PID hooks: task fork and free, which re-read the watched pids cgroups
//! and the node's pid count.

use aya_ebpf::{
    helpers::generated::bpf_get_current_task, macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use evictd_common::{
    COUNTER_READ_ERRORS, NODE_PIDS_SCOPE_ID, PIDS_WATCHED_CGROUPS, PIDS_WATCHED_NODE, RESOURCE_PIDS,
};

use crate::{
    bands::update_scope,
    kernel_read::{MAX_DEPTH, css_cgroup_id, read, task_css},
    maps::{NODE_PIDS_BAND, PIDS_SCOPES, PIDS_WATCHED, bump},
};

/// `pid_namespace.pid_allocated` carries this flag while the namespace is
/// being set up; it is not a count.
const PIDNS_ADDING: u32 = 1 << 31;

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
