//! Reading kernel structs at the offsets in `LAYOUT`: the probe read and the
//! css and cgroup steps that every hook family walks.

use aya_ebpf::helpers::bpf_probe_read_kernel;

/// Deepest cgroup nesting walked from a leaf towards the root. kubelet's
/// trees are about six levels deep (slice/qos/pod/container under a node).
pub(crate) const MAX_DEPTH: u32 = 16;

/// Reads a `T` at kernel address `base + offset`.
#[inline(always)]
pub(crate) fn read<T>(base: u64, offset: u64) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_kernel validates the address and fails cleanly.
    unsafe { bpf_probe_read_kernel((base + offset) as *const T) }
}

/// Cgroup id (kernfs node id, the directory's inode number) of a css.
#[inline(always)]
pub(crate) fn css_cgroup_id(css: u64) -> Result<u64, i32> {
    let cgroup: u64 = read(css, layout!(css_cgroup) as u64)?;
    let kn: u64 = read(cgroup, layout!(cgroup_kn) as u64)?;
    read(kn, layout!(kernfs_node_id) as u64)
}

/// A task's css in controller `subsys_id`.
#[inline(always)]
pub(crate) fn task_css(task: u64, subsys_id: u32) -> Result<u64, i32> {
    let css_set: u64 = read(task, layout!(task_cgroups) as u64)?;
    read(
        css_set,
        layout!(css_set_subsys) as u64 + subsys_id as u64 * 8,
    )
}
