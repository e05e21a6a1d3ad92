//! cgroup mkdir and rmdir, reported with id, level and path: how the agent
//! learns that pods came or went without listing the cgroups again.

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel_str_bytes, generated::bpf_ktime_get_ns},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use evictd_common::{
    CGROUP_PATH_LEN, COUNTER_READ_ERRORS, COUNTER_RINGBUF_DROPS, CgroupEvent, EVENT_CGROUP_MKDIR,
    EVENT_CGROUP_RMDIR,
};

use crate::{
    kernel_read::read,
    maps::{EVENTS, bump},
};

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
