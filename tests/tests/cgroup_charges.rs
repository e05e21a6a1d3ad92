//! The kernel's cgroup iterator, which a memory decision reads every pod's
//! bytes charged from at once, against each cgroup's own usage file, on
//! whichever cgroup version the kernel runs (`cargo xtask test` covers v1 on
//! the host, `cargo xtask test --vm` v2 in the guest).
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::collections::HashMap;

use evictd::kernel::bpf::CgroupCharges;
use evictd_integration::{Controller, PrivateCgroupTree, Workload, load_probes};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn one_read_gives_every_pod_cgroup_its_usage_file_and_nothing_deeper_or_outside_the_root() {
    let tree = PrivateCgroupTree::new().unwrap();
    let pods = ["kubepods/poda", "kubepods/burstable/podb"];
    // A Guaranteed pod's containers sit as deep as a Burstable pod and are
    // reported too; the ranking takes only pods.
    let not_reported = ["kubepods/burstable/podb/app", "other"];
    for rel in ["kubepods", "kubepods/burstable", "kubepods/poda/app"]
        .iter()
        .chain(&pods)
        .chain(&not_reported)
    {
        tree.create(rel).unwrap();
    }
    // Different charges in each pod, held by a process in its container.
    let mut workloads = Vec::new();
    for (rel, bytes) in [
        ("kubepods/poda/app", 24 * MIB),
        ("kubepods/burstable/podb/app", 40 * MIB),
        ("other", 8 * MIB),
    ] {
        let mut workload = Workload::spawn_in(&tree, rel, WORKLOAD).unwrap();
        workload.touch(bytes).unwrap();
        workloads.push(workload);
    }

    let (_, mut probes) = load_probes(256 * 1024).unwrap();
    let kubepods = tree.relative_path("kubepods");
    let pod_level = kubepods.split('/').filter(|part| !part.is_empty()).count() as u32 + 2;
    // Attaching checks a first reading of kubepods against its file.
    let mut iterator = probes
        .cgroup_charges(&tree.dir(Controller::Memory, "kubepods"), pod_level, || {
            tree.memory_usage("kubepods")
        })
        .unwrap();
    // The link keeps the program: the object it came from may go.
    drop(probes);
    let id = |rel| tree.cgroup_id(Controller::Memory, rel).unwrap();
    let mut charges = HashMap::new();
    read_between_files(&tree, &pods, &mut iterator, &mut charges);
    for rel in pods {
        assert!(charges.contains_key(&id(rel)), "{rel}: {charges:?}");
    }
    assert!(charges[&id("kubepods/poda")] >= 24 * MIB, "{charges:?}");
    assert!(
        charges[&id("kubepods/burstable/podb")] >= 40 * MIB,
        "{charges:?}"
    );
    for rel in not_reported {
        assert!(!charges.contains_key(&id(rel)), "{rel}: {charges:?}");
    }
    // kubepods, its QoS cgroup, the two pods and poda's container.
    assert_eq!(charges.len(), 5, "{charges:?}");

    // A second read walks again, and sees what changed since.
    workloads[0].alloc(16 * MIB).unwrap();
    iterator.read(&mut charges).unwrap();
    assert!(charges[&id("kubepods/poda")] >= 40 * MIB, "{charges:?}");
}

/// Reads `iterator` into `charges`, and checks that each of `pods` has in `charges` a value
/// its usage file showed just before or just after, or one between: a CPU
/// handing back the pages it holds in reserve for a cgroup moves its
/// counter, idle as the cgroup is, and may do so between two readings.
fn read_between_files(
    tree: &PrivateCgroupTree,
    pods: &[&str],
    iterator: &mut CgroupCharges,
    charges: &mut HashMap<u64, u64>,
) {
    let before: Vec<u64> = pods
        .iter()
        .map(|rel| tree.memory_usage(rel).unwrap())
        .collect();
    iterator.read(charges).unwrap();
    for (rel, before) in pods.iter().zip(before) {
        let after = tree.memory_usage(rel).unwrap();
        let id = tree.cgroup_id(Controller::Memory, rel).unwrap();
        let read = charges.get(&id).copied();
        assert!(
            read.is_some_and(|read| (before.min(after)..=before.max(after)).contains(&read)),
            "{rel}: file {before} then {after}, iterator {read:?}"
        );
    }
}
