//! A pod's containers in cgroupfs: each one's cgroup found below the pod's
//! by its runtime id (from the API's `status.containerStatuses`), and its
//! working set, read just before a kill for the eviction message.
use tracing::warn;

use crate::node::cgroupfs::{CgroupError, CgroupFs};

/// The working set of each container in `containers` (name, runtime id),
/// by name; `None` where its cgroup is not found or cannot be read.
pub(crate) fn working_sets(
    cgroupfs: &CgroupFs,
    pod_cgroup: &str,
    containers: &[(String, String)],
) -> Vec<(String, Option<u64>)> {
    let children: Vec<String> = std::fs::read_dir(cgroupfs.memory_dir(pod_cgroup))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    containers
        .iter()
        .map(|(name, id)| {
            let working_set = container_cgroup(&children, id).and_then(|child| {
                let path = format!("{}/{child}", pod_cgroup.trim_end_matches('/'));
                match cgroupfs.read_memory(&path) {
                    Ok(memory) => Some(memory.working_set_bytes()),
                    Err(CgroupError::Gone(_)) => None,
                    Err(e) => {
                        warn!(container = name, error = %e, "cannot read a container's memory");
                        None
                    }
                }
            });
            (name.clone(), working_set)
        })
        .collect()
}

/// The child of a pod cgroup that holds container `id`.
fn container_cgroup<'a>(children: &'a [String], id: &str) -> Option<&'a String> {
    children.iter().find(|child| is_cgroup_of(child, id))
}

/// Whether `child`, a child of a pod cgroup, holds the container (or pod
/// sandbox) of runtime id `id`: `<id>` (cgroupfs driver) or
/// `<runtime>-<id>.scope` (systemd driver).
pub(crate) fn is_cgroup_of(child: &str, id: &str) -> bool {
    child == id
        || child
            .strip_suffix(".scope")
            .and_then(|stem| stem.strip_suffix(id))
            .is_some_and(|runtime| runtime.ends_with('-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_is_found_under_either_cgroup_driver() {
        let children: Vec<String> = ["abc", "cri-containerd-def.scope", "crio-xdef.scope"]
            .map(String::from)
            .into();
        assert_eq!(
            container_cgroup(&children, "abc").map(String::as_str),
            Some("abc")
        );
        assert_eq!(
            container_cgroup(&children, "def").map(String::as_str),
            Some("cri-containerd-def.scope")
        );
        assert_eq!(container_cgroup(&children, "ab"), None);
        assert_eq!(container_cgroup(&children, "ef"), None);
    }
}
