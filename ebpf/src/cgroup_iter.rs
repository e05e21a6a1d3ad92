//! The cgroup iterator (`iter/cgroup`): the charge of every memory cgroup in
//! one read, where the usage files cost a system call per pod.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_seq_write;
use evictd_common::{COUNTER_READ_ERRORS, CgroupCharge};

use crate::{
    kernel_read::read,
    maps::{CHARGES_MAX_LEVEL, bump},
};

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
