//! The OOM killer's victim (`mark_victim`), reported with its memory cgroup
//! and RSS: a kill the kernel made where evictd should have acted first.

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel_buf, generated::bpf_ktime_get_ns},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use aya_log_ebpf::info;
use evictd_common::{COUNTER_READ_ERRORS, COUNTER_RINGBUF_DROPS, EVENT_OOM_VICTIM, OomVictimEvent};

use crate::{
    kernel_read::{css_cgroup_id, read, task_css},
    maps::{EVENTS, bump},
};

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
        // The object's name as target, as when every program was in one
        // file: the module path (`evictd::oom`) would read as an agent module.
        info!(
            ctx,
            target: "evictd",
            "oom victim pid {} memcg {}",
            pid,
            memory_cgroup_id
        );
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
