//! The containerd tier: the eviction scenarios of `eviction.rs` on pods a
//! real containerd runs through CRI, made as kubelet makes them (see
//! `CriNode`). evictd finds the pods and their containers in the cgroups
//! containerd and runc made; the expected pod dies, CRI reports its
//! container exited with the status the kill gives (137 for SIGKILL), the
//! others keep running, and the kernel OOM killer never fires.
//!
//! Each test starts its own containerd and leaves nothing behind. Without
//! containerd (and not root to install it) the tests skip with a message,
//! except under CI=true.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]
use std::fs;

use evictd_integration::{CriNode, MEMORY_PODS_HELD, PodSpec, cgroupfs_path, memory_pods};
use k8s_cri::v1::ContainerState;
use serde_json::json;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// What a container killed by SIGKILL exits with, as CRI reports it.
const KILLED: i32 = 128 + 9;
/// What the workload exits with on SIGTERM once told `exit-on-sigterm`.
const TERMINATED: i32 = 128 + 15;

fn node(pods: Vec<PodSpec>) -> Option<CriNode> {
    CriNode::new(pods, NODE_MEMORY, WORKLOAD.as_ref()).unwrap()
}

/// The victim's container exited with `code`, not by the kernel's OOM
/// killer (containerd watches the cgroup's OOM events and would say
/// "OOMKilled").
fn assert_exited(node: &CriNode, name: &str, code: i32) {
    let status = node.wait_exited(name).unwrap();
    assert_eq!(status.exit_code, code, "{name}: {status:?}");
    assert_ne!(status.reason, "OOMKilled", "{name}: {status:?}");
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel and containerd: run with cargo xtask test"]
fn a_memory_hog_in_a_container_is_evicted_before_the_oom_killer() {
    let Some(mut node) = node(memory_pods()) else {
        return;
    };
    node.alloc(&MEMORY_PODS_HELD).unwrap();
    let mut agent = node
        .start_agent(&[
            "--eviction-hard",
            "memory.available<96Mi",
            // Only the kernel may find the crossing, as in eviction.rs: with
            // the hooks attached only near the line, the engine's read as
            // the hog neared it won the race in CI's 6.1 guest.
            "--resync-interval",
            "1h",
            "--precise-hooks",
            "always",
        ])
        .unwrap();
    agent.log.expect("eBPF programs attached", &[]);
    agent.log.expect(
        "watching scope",
        &[("scope", &node.node_cgroup()), ("trigger", "bpf")],
    );

    node.workload("hog")
        .unwrap()
        .grow_until_stopped(16 * MIB, NODE_MEMORY)
        .unwrap();
    let decided = agent.log.expect_eviction("default/hog", "memory");
    assert_eq!(decided["trigger"], "kernel", "{decided}");
    assert_exited(&node, "hog", KILLED);
    for name in ["db", "web", "batch", "node-exporter"] {
        assert!(node.alive(name), "{name} was killed");
        assert_eq!(node.oom_kills(name).unwrap(), 0, "OOM kill in {name}");
    }
    assert_eq!(agent.log.all("eviction decided").len(), 1);
    assert!(agent.log.all("kernel OOM killer chose a victim").is_empty());
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel and containerd: run with cargo xtask test"]
fn a_fork_bomb_in_a_container_is_evicted_before_the_node_runs_out_of_pids() {
    let uid = |n: u32| -> &'static str {
        Box::leak(format!("00000000-0000-4000-8000-0000000000b{n}").into_boxed_str())
    };
    let pods = vec![
        PodSpec::new(
            "db",
            uid(1),
            cgroupfs_path("", uid(1)),
            1000,
            json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                   "limits": {"cpu": "100m", "memory": "64Mi"}}),
        ),
        PodSpec::new(
            "batch",
            uid(2),
            cgroupfs_path("burstable/", uid(2)),
            100,
            json!({"requests": {"memory": "16Mi"}}),
        ),
        PodSpec::new(
            "bomb",
            uid(3),
            cgroupfs_path("besteffort/", uid(3)),
            0,
            json!({}),
        ),
    ];
    let Some(mut node) = node(pods) else {
        return;
    };
    // The sandboxes' and workloads' own tasks count too: a few per pod.
    node.tree.set_pids_limit("node", 200).unwrap();
    node.workload("batch").unwrap().fork(40).unwrap();
    let mut agent = node
        .start_agent(&[
            "--eviction-hard",
            "pid.available<60",
            "--resync-interval",
            "1h",
        ])
        .unwrap();
    agent.log.expect("eBPF programs attached", &[]);
    agent.log.expect(
        "watching scope",
        &[("scope", &node.node_cgroup()), ("resource", "pids")],
    );

    // Paced as in eviction.rs: order is asserted, not speed (the bench
    // races the kill unpaced).
    let mut children = 0;
    while node.workload("bomb").unwrap().fork_at(10, 50).is_ok() {
        children += 10;
        assert!(children < 200, "the fork bomb was never stopped");
    }
    let decided = agent.log.expect_eviction("default/bomb", "pids");
    assert_eq!(decided["trigger"], "kernel", "{decided}");
    assert_exited(&node, "bomb", KILLED);
    for name in ["db", "batch"] {
        assert!(node.alive(name), "{name} was killed");
    }
    let events = node
        .tree
        .dir(evictd_integration::Controller::Pids, "node")
        .join("pids.events");
    let events = fs::read_to_string(events).unwrap();
    assert!(events.contains("max 0"), "a fork hit pids.max: {events}");
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}

#[test]
#[ignore = "needs root, cgroups, a BPF-capable kernel and containerd: run with cargo xtask test"]
fn a_soft_eviction_gives_the_container_its_grace_period_and_sigterm() {
    let mut pods = memory_pods();
    // The hog may take 30 s to stop; evictd gives it min(30 s, 20 s).
    for pod in &mut pods {
        pod.metadata["termination_grace_period_seconds"] = json!(30);
    }
    let Some(mut node) = node(pods) else {
        return;
    };
    node.workload("batch").unwrap().alloc(48 * MIB).unwrap();
    // As pid 1 of its container the workload gets SIGTERM only with a
    // handler for it; this one exits 143.
    node.workload("hog")
        .unwrap()
        .command("exit-on-sigterm")
        .unwrap();
    let mut agent = node
        .start_agent(&[
            "--eviction-hard=",
            "--eviction-soft",
            "memory.available<256Mi",
            "--eviction-soft-grace-period",
            "memory.available=1s",
            "--eviction-max-pod-grace-period",
            "20",
            "--resync-interval",
            "200ms",
        ])
        .unwrap();
    agent.log.expect("eBPF programs attached", &[]);
    // 224 MiB more leaves the node under 256Mi available: soft threshold
    // met, evicted once it has stayed met for 1 s.
    node.workload("hog").unwrap().alloc(224 * MIB).unwrap();
    let decided = agent
        .log
        .expect("eviction decided", &[("victim", "default/hog")]);
    assert_eq!(decided["resource"], "memory", "{decided}");
    let killed = agent.log.expect("pod killed", &[("victim", "default/hog")]);
    assert!(killed["sigterm"].as_u64() >= Some(1), "{killed}");
    // 143, not 137: the container left on SIGTERM, within its grace
    // period, not on the SIGKILL that ends it.
    assert_exited(&node, "hog", TERMINATED);
    for name in ["db", "web", "batch", "node-exporter"] {
        assert!(node.alive(name), "{name} was killed");
    }
    assert_eq!(
        node.status("db").unwrap().state,
        ContainerState::ContainerRunning as i32
    );
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}
