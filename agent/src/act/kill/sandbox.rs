//! Which of a pod's processes are its sandbox, spared a soft eviction's
//! SIGTERM: kubelet stops the containers first, and the sandbox's end
//! during their grace period would take the pod's network down (and have
//! kubelet make a new sandbox). Found by cgroup, never by a process's name,
//! which any container can take: each container of a pod, and its sandbox,
//! has a cgroup of its own below the pod's, named by its runtime id.
use std::{collections::BTreeSet, path::Path};

use super::{KillError, tree};
use crate::node::containers::is_cgroup_of;

/// What is known of a pod's sandbox, best first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Sandbox {
    /// The container runtime's sandbox ids for the pod: the cgroups they
    /// name hold the sandbox.
    Named(Vec<String>),
    /// No runtime's word, but the containers' runtime ids as the
    /// Kubernetes API lists them: the cgroups that hold none of them hold
    /// the sandbox.
    NotContaining(Vec<String>),
    /// Neither: every process gets the SIGTERM.
    #[default]
    Unknown,
}

impl Sandbox {
    /// The sandbox's processes below `pod_dir` (the pod's cgroup in one
    /// hierarchy).
    pub(super) fn pids(&self, pod_dir: &Path) -> Result<BTreeSet<u32>, KillError> {
        let mut pids = BTreeSet::new();
        let (ids, named) = match self {
            Self::Named(ids) => (ids, true),
            Self::NotContaining(ids) => (ids, false),
            Self::Unknown => return Ok(pids),
        };
        for child in tree::child_dirs(pod_dir)? {
            let Some(name) = child.file_name().and_then(|name| name.to_str()) else {
                continue;
            };
            let holds_one = ids.iter().any(|id| is_cgroup_of(name, id));
            if holds_one == named {
                tree::subtree_pids(&child, &mut pids)?;
            }
        }
        Ok(pids)
    }
}
