//! Fixtures for evictd's privileged integration tests: a private cgroup tree
//! that removes itself ([`PrivateCgroupTree`]), a steerable workload process
//! ([`Workload`]), and waiting on a condition with a deadline
//! ([`wait_until`], never a bare sleep).
//!
//! Everything lives under a private root (`evictd-test-<pid>-<n>`) in the
//! memory and pids hierarchies, found in `/proc/self/mountinfo` (cgroup v1,
//! hybrid or v2); nothing else on the machine is touched.
//!
//! ```no_run
//! use evictd_integration::{Controller, PrivateCgroupTree, Workload};
//!
//! let tree = PrivateCgroupTree::new()?;
//! tree.create("node/kubepods/pod1")?;
//! let id = tree.cgroup_id(Controller::Memory, "node/kubepods")?;
//! # let binary = "evictd-workload"; // env!("CARGO_BIN_EXE_evictd-workload") in a test
//! let mut workload = Workload::spawn_in(&tree, "node/kubepods/pod1", binary)?;
//! workload.alloc(64 << 20)?;
//! # Ok::<(), std::io::Error>(())
//! ```
mod agent;
mod apiserver;
mod bpf_objects;
mod bpf_stats;
mod cgroup_tree;
mod cold_file;
mod containerd;
mod cri_node;
mod daemonset;
mod fuse;
mod layout;
mod memory;
mod node_memory;
mod oci_image;
mod prometheus;
mod sandbox;
mod wait;
mod workload;

pub use agent::{
    AGENT_DEADLINE, Agent, AgentLog, agent_binary, http_get, metric, program_stats, run_evictd,
};
pub use apiserver::{
    ApiServer, Faults, Recorded, api_pod, closed_port, status_failure, write_kubeconfig,
};
pub use bpf_objects::{BpfObjects, load_probes, program_ids};
pub use bpf_stats::BpfStats;
pub use cgroup_tree::{
    Controller, KUBEPODS, PrivateCgroupTree, TREE_MEMORY_LIMIT, TREE_PIDS_LIMIT,
};
pub use cold_file::ColdFile;
pub use containerd::{Containerd, IMAGE};
pub use cri_node::{CONTAINER, CriNode, CriPod, SCRATCH_PATH, SCRATCH_VOLUME};
pub use daemonset::{
    agent_container, confined_agent, daemonset_capabilities, daemonset_memory_limit,
    daemonset_seccomp_profile, start_as_daemonset, with_capabilities,
};
pub use fuse::StuckFile;
pub use layout::{CgroupLayout, CgroupVersion, Hierarchy};
pub use memory::{ProcessMemory, Region};
pub use node_memory::{
    VMSTAT, make_room, pages_scanned_for_reclaim, read_working_set, working_set_from_vmstat,
};
pub use oci_image::OciImage;
pub use prometheus::{PROMETHEUS_ENV, PROMETHEUS_JOB, Prometheus};
pub use sandbox::{
    MEMORY_PODS_HELD, PodSpec, STEADY_POD_MEMORY, SandboxNode, cgroupfs_path, machine_memory,
    memory_pods, oom_score_adj, quiet_pods, set_oom_score_adj, systemd_path,
};
pub use wait::{POLL_INTERVAL, TIME_SCALE_ENV, Timeout, scaled, wait_until};
pub use workload::{COMMAND_DEADLINE, Workload, WorkloadChannel};
