use super::*;
use crate::node::cgroupfs::CgroupVersion;

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// A v1 pod cgroup with `bytes` charged, no page cache, `processes`
/// processes of ten threads each.
fn v1_pod(root: &Path, path: &str, bytes: u64, processes: u64) {
    let memory = root.join("memory").join(path);
    write(&memory.join("memory.usage_in_bytes"), &format!("{bytes}\n"));
    write(&memory.join("memory.stat"), "total_inactive_file 0\n");
    let pids: String = (1..=processes).map(|pid| format!("{pid}\n")).collect();
    write(&memory.join("cgroup.procs"), &pids);
    write(
        &root.join("pids").join(path).join("pids.current"),
        &format!("{}\n", processes * 10),
    );
}

fn inventory(root: &Path, node: &str, metadata: Option<&Path>) -> Inventory {
    // As the agent at start: pods' files are kept open only within the
    // limit, less what a kill needs, and a shell's soft limit (often
    // 1,024) would leave none.
    raise_file_limit();
    let write_node = |file: &str, text: &str| write(&root.join("memory/sandbox").join(file), text);
    write_node("memory.limit_in_bytes", "1073741824\n");
    write_node("memory.usage_in_bytes", "0\n");
    write_node("memory.stat", "total_inactive_file 0\n");
    let cgroupfs = CgroupFs {
        version: CgroupVersion::V1,
        memory_root: root.join("memory"),
        pids_root: Some(root.join("pids")),
        freezer_root: None,
    };
    let args = InventoryOptions {
        pod_uid: None,
        node_cgroup: node.into(),
        pod_metadata: metadata.map(Path::to_owned),
        nodefs_path: root.join("missing"),
        imagefs_path: root.join("missing"),
        cold_cache: false,
    };
    Inventory::new(cgroupfs, &args).unwrap()
}

#[test]
fn pod_names_of_both_drivers_give_the_uid() {
    let uid = "8f6e1c2a-1b2c-4d5e-8f90-123456789abc";
    assert_eq!(pod_uid(&format!("pod{uid}")).as_deref(), Some(uid));
    let underscored = uid.replace('-', "_");
    for name in [
        format!("kubepods-pod{underscored}.slice"),
        format!("kubepods-burstable-pod{underscored}.slice"),
        format!("kubepods-besteffort-pod{underscored}.slice"),
    ] {
        assert_eq!(pod_uid(&name).as_deref(), Some(uid), "{name}");
    }
    for not_a_pod in [
        "burstable",
        "kubepods-burstable.slice",
        "pod",
        "cri-containerd-1.scope",
    ] {
        assert_eq!(pod_uid(not_a_pod), None, "{not_a_pod}");
    }
}

#[test]
fn cgroupfs_driver_pods_with_qos_from_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/podg1", 100, 1);
    v1_pod(root, "sandbox/kubepods/podg1/ctr", 100, 1);
    v1_pod(root, "sandbox/kubepods/burstable/podb1", 200, 2);
    v1_pod(root, "sandbox/kubepods/besteffort/pode1", 300, 3);
    let mut inventory = inventory(root, "/sandbox", None);
    let pods = inventory.pods().unwrap();
    let found: Vec<_> = pods
        .iter()
        .map(|p| (p.uid.as_str(), p.qos_class(), p.cgroup.as_deref().unwrap()))
        .collect();
    assert_eq!(
        found,
        [
            (
                "e1",
                QosClass::BestEffort,
                "/sandbox/kubepods/besteffort/pode1"
            ),
            (
                "b1",
                QosClass::Burstable,
                "/sandbox/kubepods/burstable/podb1"
            ),
            ("g1", QosClass::Guaranteed, "/sandbox/kubepods/podg1"),
        ]
    );
    assert_eq!(pods[0].usage.memory_working_set_bytes, 300);
    assert_eq!(
        pods[0].usage.pids, 3,
        "processes, not pids.current's threads"
    );
    assert_eq!(pods[2].usage.pids, 2, "the pod's and its container's");
}

#[test]
fn only_a_pods_own_cgroup_record_lists_the_pods_again_and_each_is_read_through_its_open_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/besteffort/poda", 100, 1);
    let mut inventory = inventory(root, "/sandbox", None);
    inventory.memory_hierarchy = Some(4);
    let charged = |inventory: &mut Inventory| -> Vec<(String, u64)> {
        let pods = inventory.pods_for(Resource::Memory).unwrap();
        pods.into_iter()
            .map(|pod| (pod.uid.clone(), pod.usage.memory_working_set_bytes))
            .collect()
    };
    assert_eq!(charged(&mut inventory), [("a".to_owned(), 100)]);
    assert_eq!(inventory.memory_files.len(), 1);

    // The open file is read afresh.
    write(
        &root.join("memory/sandbox/kubepods/besteffort/poda/memory.usage_in_bytes"),
        "150\n",
    );
    v1_pod(root, "sandbox/kubepods/besteffort/podb", 200, 1);
    // A container of a listed pod, and a pod of another hierarchy: the
    // listing stands.
    inventory.cgroup_changed(4, "/sandbox/kubepods/besteffort/poda/ctr");
    inventory.cgroup_changed(2, "/sandbox/kubepods/besteffort/podb");
    assert_eq!(charged(&mut inventory), [("a".to_owned(), 150)]);

    // A pod's own cgroup: listed again.
    inventory.cgroup_changed(4, "/sandbox/kubepods/besteffort/podb");
    assert_eq!(
        charged(&mut inventory),
        [("a".to_owned(), 150), ("b".to_owned(), 200)]
    );
    // A pod removed: listed again, its file closed.
    fs::remove_dir_all(root.join("memory/sandbox/kubepods/besteffort/poda")).unwrap();
    inventory.cgroup_changed(4, "sandbox/kubepods/besteffort/poda");
    assert_eq!(charged(&mut inventory), [("b".to_owned(), 200)]);
    assert_eq!(
        inventory.memory_files.keys().collect::<Vec<_>>(),
        ["/sandbox/kubepods/besteffort/podb"]
    );
}

#[test]
fn an_exact_read_takes_the_working_set_through_the_open_files_and_drops_a_pod_with_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let pod = root.join("memory/sandbox/kubepods/besteffort/poda");
    v1_pod(root, "sandbox/kubepods/besteffort/poda", 300, 0);
    // As kubelet lays a pod out: its processes in a container's cgroup.
    write(&pod.join("ctr/cgroup.procs"), "7\n");
    let mut inventory = inventory(root, "/sandbox", None);
    let listed = inventory.pods_for(Resource::Memory).unwrap();
    assert_eq!(listed[0].usage.memory_working_set_bytes, 300);

    // A new memory.stat under the same path: the listing's open file still
    // reads the one it opened.
    write(&pod.join("memory.stat.new"), "total_inactive_file 200\n");
    fs::rename(pod.join("memory.stat.new"), pod.join("memory.stat")).unwrap();
    let refined = inventory.refine(&listed[0]).unwrap().unwrap();
    assert_eq!(
        refined.usage.memory_working_set_bytes, 300,
        "read by path, it would be 100"
    );

    // Its last process gone, the pod's cgroup lingers: nothing to take back.
    write(&pod.join("ctr/cgroup.procs"), "");
    assert_eq!(inventory.refine(&listed[0]).unwrap(), None);
    // Its cgroup gone too.
    fs::remove_dir_all(&pod).unwrap();
    assert_eq!(inventory.refine(&listed[0]).unwrap(), None);
}

#[test]
fn pods_past_the_file_budget_are_read_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/besteffort/poda", 100, 1);
    v1_pod(root, "sandbox/kubepods/besteffort/podb", 200, 1);
    let mut inventory = inventory(root, "/sandbox", None);
    let kubepods = inventory.kubepods_cgroup().unwrap();
    let cgroups = find_pods(&inventory.signals.cgroupfs.memory_dir(&kubepods), &kubepods).unwrap();
    inventory.keep_memory_files_of(&cgroups, OpenMemory::FILES);
    assert_eq!(inventory.memory_files.len(), 1);

    let mut charged: Vec<u64> = cgroups
        .iter()
        .map(|pod| inventory.bytes_charged(&pod.path).unwrap())
        .collect();
    charged.sort_unstable();
    assert_eq!(charged, [100, 200]);
}

#[test]
fn systemd_driver_pods() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let slice = "sandbox/kubepods.slice";
    v1_pod(root, &format!("{slice}/kubepods-poda_1.slice"), 1, 1);
    v1_pod(
        root,
        &format!("{slice}/kubepods-burstable.slice/kubepods-burstable-podb_2.slice"),
        2,
        1,
    );
    let besteffort = format!("{slice}/kubepods-besteffort.slice/kubepods-besteffort-podc_3.slice");
    v1_pod(root, &besteffort, 3, 1);
    v1_pod(root, &format!("{besteffort}/cri-containerd-9.scope"), 3, 1);
    let mut inventory = inventory(root, "/sandbox/", None);
    assert_eq!(
        inventory.kubepods_cgroup().as_deref(),
        Some("/sandbox/kubepods.slice")
    );
    let pods = inventory.pods().unwrap();
    let found: Vec<_> = pods
        .iter()
        .map(|p| (p.uid.as_str(), p.qos_class()))
        .collect();
    assert_eq!(
        found,
        [
            ("c-3", QosClass::BestEffort),
            ("b-2", QosClass::Burstable),
            ("a-1", QosClass::Guaranteed),
        ]
    );
}

#[test]
fn metadata_names_pods_and_what_is_missing_is_stated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/burstable/podknown", 10, 1);
    v1_pod(root, "sandbox/kubepods/besteffort/podstranger", 20, 1);
    let metadata = root.join("pods.json");
    write(
        &metadata,
        r#"[{"namespace": "shop", "name": "web", "uid": "known", "priority": 7,
             "containers": [{"name": "app", "requests": {"memory": "1Mi"}}]},
            {"namespace": "gone", "name": "old", "uid": "elsewhere", "containers": []}]"#,
    );
    let mut inventory = inventory(root, "/sandbox", Some(&metadata));
    let pods = inventory.pods().unwrap();
    let web = pods.iter().find(|p| p.uid == "known").unwrap();
    assert_eq!((web.key().as_str(), web.priority), ("shop/web", 7));
    assert_eq!(web.request("memory"), 1 << 20);
    assert!(web.unknown.is_empty());
    assert_eq!(
        web.usage.memory_working_set_bytes, 10,
        "usage comes from cgroups"
    );
    let stranger = pods.iter().find(|p| p.uid == "stranger").unwrap();
    assert_eq!(stranger.key(), "/podstranger");
    assert_eq!(stranger.qos_class(), QosClass::BestEffort);
    assert!(stranger.unknown.contains(&"priority".to_owned()));
    assert_eq!(
        pods.len(),
        2,
        "metadata for a pod not on the node adds nothing"
    );
}

/// A metadata source the test changes, counting its lookups.
#[derive(Clone, Default)]
struct CountedSource(Arc<std::sync::Mutex<Counted>>);

#[derive(Default)]
struct Counted {
    pods: HashMap<String, PodSnapshot>,
    generation: u64,
    lookups: usize,
}

impl CountedSource {
    fn set(&self, json: &str) {
        let pod: PodSnapshot = serde_json::from_str(json).unwrap();
        let mut counted = self.0.lock().unwrap();
        counted.pods.insert(pod.uid.clone(), pod);
        counted.generation += 1;
    }

    fn lookups(&self) -> usize {
        self.0.lock().unwrap().lookups
    }
}

impl PodMetadataSource for CountedSource {
    fn lookup(&mut self, uid: &str) -> Result<Option<PodSnapshot>, InventoryError> {
        let mut counted = self.0.lock().unwrap();
        counted.lookups += 1;
        Ok(counted.pods.get(uid).cloned())
    }

    fn generation(&self) -> u64 {
        self.0.lock().unwrap().generation
    }
}

#[test]
fn known_pods_are_looked_up_again_only_after_their_metadata_changed_and_their_usage_is_always_fresh()
 {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let known_usage = root.join("memory/sandbox/kubepods/burstable/podknown/memory.usage_in_bytes");
    v1_pod(root, "sandbox/kubepods/burstable/podknown", 10, 1);
    v1_pod(root, "sandbox/kubepods/besteffort/podstranger", 20, 1);
    let source = CountedSource::default();
    source.set(
        r#"{"namespace": "shop", "name": "web", "uid": "known", "priority": 7, "containers": []}"#,
    );
    let mut inventory = inventory(root, "/sandbox", None);
    inventory.set_metadata(Box::new(source.clone()));
    let known = |pods: &[Arc<PodSnapshot>]| {
        let pod = pods.iter().find(|pod| pod.uid == "known").unwrap();
        (pod.priority, pod.usage.memory_working_set_bytes)
    };

    let first = inventory.pods_for(Resource::Memory).unwrap();
    assert_eq!(known(&first), (7, 10));
    assert_eq!(source.lookups(), 2);

    write(&known_usage, "15\n");
    let second = inventory.pods_for(Resource::Memory).unwrap();
    assert_eq!(known(&second), (7, 15));
    assert_eq!(source.lookups(), 3, "only the pod the source does not know");

    write(&known_usage, "20\n");
    source.set(
        r#"{"namespace": "shop", "name": "web", "uid": "known", "priority": 9, "containers": []}"#,
    );
    let third = inventory.pods_for(Resource::Memory).unwrap();
    assert_eq!(known(&third), (9, 20));
    assert_eq!(source.lookups(), 5, "every pod, once the source changed");
    assert_eq!(
        known(&second),
        (7, 15),
        "a listing held on to is not changed by the next"
    );
    let stranger = third.iter().find(|pod| pod.uid == "stranger").unwrap();
    assert!(stranger.unknown.contains(&"priority".to_owned()));
}

#[test]
fn a_rewritten_metadata_file_is_seen_by_the_next_listing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/burstable/podknown", 10, 1);
    let metadata = root.join("pods.json");
    let write_priority = |priority: i32, second: u64| {
        write(
            &metadata,
            &format!(
                r#"[{{"namespace": "shop", "name": "web", "uid": "known", "priority": {priority}, "containers": []}}]"#
            ),
        );
        // A time of its own: coarse timestamps could give two writes one.
        fs::File::options()
            .write(true)
            .open(&metadata)
            .unwrap()
            .set_modified(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000 + second),
            )
            .unwrap();
    };
    write_priority(7, 1);
    let mut inventory = inventory(root, "/sandbox", Some(&metadata));
    let priority =
        |inventory: &mut Inventory| inventory.pods_for(Resource::Memory).unwrap()[0].priority;
    assert_eq!(priority(&mut inventory), 7);
    assert_eq!(priority(&mut inventory), 7);
    write_priority(9, 2);
    assert_eq!(priority(&mut inventory), 9);
}

#[test]
fn a_malformed_metadata_file_is_an_input_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let metadata = dir.path().join("pods.json");
    write(&metadata, "{not json");
    let err = match MetadataFile::open(&metadata) {
        Err(e) => e,
        Ok(_) => panic!("accepted"),
    };
    assert!(err.is_input_error());
    assert!(err.to_string().contains("pods.json"), "{err}");
}

#[test]
fn a_missing_node_cgroup_is_an_input_error() {
    let dir = tempfile::tempdir().unwrap();
    let cgroupfs = CgroupFs::memory_only(CgroupVersion::V1, dir.path());
    let args = InventoryOptions {
        pod_uid: None,
        node_cgroup: "/nowhere".into(),
        pod_metadata: None,
        nodefs_path: "/".into(),
        imagefs_path: "/".into(),
        cold_cache: false,
    };
    let err = match Inventory::new(cgroupfs, &args) {
        Err(e) => e,
        Ok(_) => panic!("accepted"),
    };
    assert!(err.is_input_error());
    assert!(err.to_string().contains("\"/nowhere\""), "{err}");
}

#[test]
fn a_pod_removed_while_read_is_left_out_and_the_agents_pod_is_marked() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/besteffort/podagent", 10, 1);
    // A cgroup directory whose files are gone: removed mid-read.
    fs::create_dir_all(root.join("memory/sandbox/kubepods/besteffort/podvanished")).unwrap();
    let mut inventory = inventory(root, "/sandbox", None);
    inventory.own_cgroup = Some("/sandbox/kubepods/besteffort/podagent/ctr".into());
    let pods = inventory.pods().unwrap();
    assert_eq!(pods.len(), 1);
    assert!(pods[0].hosts_evictd);
    assert!(!pods[0].is_evictable());
}

#[test]
fn the_agents_pod_is_known_by_its_downward_api_uid_in_a_private_cgroup_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/besteffort/podagent-uid", 10, 1);
    v1_pod(root, "sandbox/kubepods/besteffort/podother", 10, 1);
    let mut inventory = inventory(root, "/sandbox", None);
    // What /proc/self/cgroup reads with a private cgroup namespace on v2.
    inventory.own_cgroup = Some("/".into());
    inventory.own_pod_uid = Some("agent-uid".into());
    let pods = inventory.pods().unwrap();
    let marked: Vec<_> = pods
        .iter()
        .map(|p| (p.uid.as_str(), p.hosts_evictd))
        .collect();
    assert_eq!(marked, [("agent-uid", true), ("other", false)]);
}

#[test]
fn a_pod_without_metadata_named_like_a_static_pod_is_protected() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(
        root,
        "sandbox/kubepods/besteffort/pod6f1d0c3b9a7e45d2b8c1f0e2d3a4b5c6",
        10,
        1,
    );
    v1_pod(
        root,
        "sandbox/kubepods/besteffort/pod6f1d0c3b-9a7e-45d2-b8c1-f0e2d3a4b5c6",
        10,
        1,
    );
    let mut inventory = inventory(root, "/sandbox", None);
    let pods = inventory.pods().unwrap();
    let (hashed, api): (Vec<_>, Vec<_>) = pods.iter().partition(|p| !p.uid.contains('-'));
    assert!(hashed[0].is_static && !hashed[0].is_evictable());
    assert!(!hashed[0].unknown.contains(&"static".to_owned()));
    assert!(!api[0].is_static);
    assert!(api[0].unknown.contains(&"static".to_owned()));
}

#[test]
fn own_cgroup_from_proc_self_cgroup() {
    let v1 = "9:name=systemd:/\n4:memory:/kubepods/podx/c\n0::/\n";
    assert_eq!(parse_own_cgroup(v1).as_deref(), Some("/kubepods/podx/c"));
    let v2 = "0::/kubepods.slice/kubepods-podx.slice/cri-containerd-1.scope\n";
    assert_eq!(
        parse_own_cgroup(v2).as_deref(),
        Some("/kubepods.slice/kubepods-podx.slice/cri-containerd-1.scope")
    );
}

#[test]
fn a_guaranteed_pod_without_metadata_requests_its_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let guaranteed = "sandbox/kubepods/pod00000000-0000-4000-8000-00000000000a";
    v1_pod(root, guaranteed, 300 << 20, 1);
    write(
        &root
            .join("memory")
            .join(guaranteed)
            .join("memory.limit_in_bytes"),
        "536870912\n",
    );
    v1_pod(
        root,
        "sandbox/kubepods/burstable/pod00000000-0000-4000-8000-00000000000b",
        100 << 20,
        1,
    );
    let mut inventory = inventory(root, "/sandbox", None);
    let pods = inventory.pods().unwrap();
    let by_qos = |qos| pods.iter().find(|p| p.cgroup_qos == Some(qos)).unwrap();
    let guaranteed = by_qos(QosClass::Guaranteed);
    assert_eq!(guaranteed.request("memory"), 512 << 20);
    assert!(guaranteed.metadata_missing());
    let burstable = by_qos(QosClass::Burstable);
    assert_eq!(burstable.resources, None);

    // Ranked within its request: the smaller pod that requests nothing goes
    // first, as kubelet would rank them had it their specs.
    let ranking = crate::decide::rank::rank(
        &pods,
        crate::decide::thresholds::Signal::MemoryAvailable,
        crate::decide::layout::DiskLayout::Shared,
        crate::decide::rank::PidRanking::Kubelet,
    );
    assert_eq!(pods[ranking[0].index].key(), burstable.key());
}

/// What observing the node reads besides its memory: its PIDs, and the
/// pods' cgroup.
fn observable(root: &Path) {
    write(&root.join("pids/sandbox/pids.current"), "5\n");
    write(&root.join("pids/sandbox/pids.max"), "1000\n");
    let kubepods = root.join("memory/sandbox/kubepods");
    write(&kubepods.join("memory.usage_in_bytes"), "20\n");
    write(&kubepods.join("memory.stat"), "total_inactive_file 0\n");
    write(
        &kubepods.join("memory.limit_in_bytes"),
        "9223372036854771712\n",
    );
}

#[test]
fn disk_decisions_take_each_pods_disk_usage_from_the_runtime_and_wait_for_it() {
    use std::{collections::BTreeMap, time::Instant};

    use crate::node::runtime::{
        disk_usage::{ContainerDiskUsage, FsUsage, PodDiskUsage, VolumeUsage},
        link::RuntimeLink,
        reading::FsPaths,
    };

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/besteffort/podfiller", 10, 1);
    v1_pod(root, "sandbox/kubepods/besteffort/podquiet", 10, 1);
    observable(root);
    let mut inventory = inventory(root, "/sandbox", None);
    let link = RuntimeLink::detached(true);
    inventory.set_runtime(link.clone());
    assert!(matches!(
        inventory.pods_for(Resource::EphemeralStorage),
        Err(InventoryError::DiskUsagePending { .. })
    ));
    // Memory decisions never wait on the runtime.
    assert_eq!(inventory.pods_for(Resource::Memory).unwrap().len(), 2);

    let images = root.join("images");
    fs::create_dir(&images).unwrap();
    let filler = PodDiskUsage {
        containers: vec![ContainerDiskUsage {
            name: "app".into(),
            id: "c1".into(),
            rootfs: Some(FsUsage {
                bytes: 300,
                inodes: 3,
            }),
            logs: Some(FsUsage {
                bytes: 20,
                inodes: 2,
            }),
        }],
        volumes: vec![VolumeUsage {
            name: "scratch".into(),
            plugin: "kubernetes.io~empty-dir".into(),
            usage: FsUsage {
                bytes: 4000,
                inodes: 1,
            },
        }],
        ..PodDiskUsage::default()
    };
    link.set_reading(
        Instant::now(),
        FsPaths {
            imagefs: images.clone(),
            containerfs: images,
        },
        BTreeMap::from([("filler".to_owned(), filler)]),
    );
    let pods = inventory.pods_for(Resource::EphemeralStorage).unwrap();
    let usage = |uid: &str| pods.iter().find(|p| p.uid == uid).unwrap().usage;
    let filled = usage("filler");
    assert_eq!(
        (
            filled.rootfs_bytes,
            filled.logs_bytes,
            filled.local_volume_bytes,
            filled.inodes
        ),
        (300, 20, 4000, 6)
    );
    assert_eq!(filled.memory_working_set_bytes, 10, "cgroups still count");
    assert_eq!(usage("quiet").rootfs_bytes, 0, "not run by the runtime");

    // The filesystems the runtime names are observed: imagefs where
    // --imagefs-path had nothing, and containerfs on it.
    let node = inventory.observe().unwrap().stats;
    let imagefs = node.imagefs.expect("imagefs observed");
    assert_eq!(node.containerfs, Some(imagefs));
}

#[test]
fn with_the_runtime_down_disk_decisions_are_told_the_usage_is_unknown() {
    use crate::node::runtime::link::RuntimeLink;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/besteffort/podx", 10, 1);
    observable(root);
    let mut inventory = inventory(root, "/sandbox", None);
    inventory.set_runtime(RuntimeLink::detached(false));
    assert!(matches!(
        inventory.pods_for(Resource::Inodes),
        Err(InventoryError::DiskUsageUnknown)
    ));
    assert_eq!(inventory.pods_for(Resource::Memory).unwrap().len(), 1);
    let node = inventory.observe().unwrap().stats;
    assert_eq!((node.imagefs, node.containerfs), (None, None));
}

#[test]
fn only_running_pods_that_set_a_limit_are_held_to_their_local_storage_limits() {
    use std::{collections::BTreeMap, time::Instant};

    use crate::node::runtime::{
        disk_usage::{FsUsage, PodDiskUsage, VolumeUsage},
        link::RuntimeLink,
        local_storage::LocalStorageViolation,
        reading::FsPaths,
    };

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/besteffort/podlimited", 10, 1);
    v1_pod(root, "sandbox/kubepods/besteffort/podunlimited", 10, 1);
    observable(root);
    let metadata = root.join("pods.json");
    let limited = r#"[{"name": "scratch", "size_limit": "1Ki"}]"#;
    let pods = format!(
        r#"[{{"namespace": "shop", "name": "limited", "uid": "limited", "containers": [],
              "empty_dirs": {limited}}},
            {{"namespace": "shop", "name": "unlimited", "uid": "unlimited", "containers": [],
              "empty_dirs": [{{"name": "scratch"}}]}},
            {{"namespace": "shop", "name": "stopped", "uid": "stopped", "containers": [],
              "empty_dirs": {limited}}}]"#
    );
    write(&metadata, &pods);
    let mut inventory = inventory(root, "/sandbox", Some(&metadata));
    // No runtime, nothing measured.
    assert!(
        inventory
            .local_storage_violations(false)
            .unwrap()
            .is_empty()
    );

    let link = RuntimeLink::detached(true);
    inventory.set_runtime(link.clone());
    assert!(matches!(
        inventory.local_storage_violations(false),
        Err(InventoryError::DiskUsagePending { .. })
    ));
    let over = |bytes| PodDiskUsage {
        volumes: vec![VolumeUsage {
            name: "scratch".into(),
            plugin: "kubernetes.io~empty-dir".into(),
            usage: FsUsage { bytes, inodes: 1 },
        }],
        ..PodDiskUsage::default()
    };
    let images = root.join("images");
    link.set_reading(
        Instant::now(),
        FsPaths {
            imagefs: images.clone(),
            containerfs: images,
        },
        ["limited", "unlimited", "stopped"]
            .into_iter()
            .map(|uid| (uid.to_owned(), over(1 << 20)))
            .collect::<BTreeMap<_, _>>(),
    );
    // `stopped` has a cgroup with no process left (a killed pod whose
    // volume kubelet has not removed yet) and `unlimited` no sizeLimit.
    v1_pod(root, "sandbox/kubepods/besteffort/podstopped", 10, 0);
    inventory.cgroups_changed();
    let found = inventory.local_storage_violations(false).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].pod.key(), "shop/limited");
    assert!(
        matches!(&found[0].violation, LocalStorageViolation::EmptyDir { volume, used_bytes, .. }
            if volume == "scratch" && *used_bytes == 1 << 20),
        "{found:?}"
    );
}

/// A charges source that answers `charges` (or fails), counting the calls.
struct FakeCharges {
    charges: Option<HashMap<u64, u64>>,
    reads: Arc<std::sync::atomic::AtomicUsize>,
}

impl ChargesSource for FakeCharges {
    fn read(&mut self, charges: &mut HashMap<u64, u64>) -> io::Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        charges.clear();
        charges.extend(self.charges.as_ref().ok_or(io::ErrorKind::Unsupported)?);
        Ok(())
    }
}

fn memory_usage(inventory: &mut Inventory) -> Vec<(String, u64)> {
    let pods = inventory.pods_for(Resource::Memory).unwrap();
    pods.iter()
        .map(|pod| (pod.uid.clone(), pod.usage.memory_working_set_bytes))
        .collect()
}

#[test]
fn a_memory_listing_takes_bytes_charged_from_the_charges_source_and_reads_the_file_of_a_pod_it_lacks()
 {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/besteffort/poda", 100, 1);
    v1_pod(root, "sandbox/kubepods/besteffort/podb", 200, 1);
    let mut inventory = inventory(root, "/sandbox", None);
    let id = |pod: &str| {
        CgroupFs::cgroup_id(&root.join("memory/sandbox/kubepods/besteffort").join(pod)).unwrap()
    };
    let reads = Arc::default();
    inventory.set_charges_source(Box::new(FakeCharges {
        // Not b: made after the source was attached, say.
        charges: Some(HashMap::from([(id("poda"), 4096)])),
        reads: Arc::clone(&reads),
    }));
    assert_eq!(
        memory_usage(&mut inventory),
        [("a".to_owned(), 4096), ("b".to_owned(), 200)]
    );
    assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), 1);
    // An exact read is the files', and does not ask the source.
    let exact: Vec<_> = inventory
        .pods()
        .unwrap()
        .into_iter()
        .map(|pod| pod.usage.memory_working_set_bytes)
        .collect();
    assert_eq!(exact, [100, 200]);
    assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn a_charges_source_that_fails_leaves_every_pod_to_its_file_and_is_not_asked_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    v1_pod(root, "sandbox/kubepods/besteffort/poda", 100, 1);
    let mut inventory = inventory(root, "/sandbox", None);
    let reads = Arc::default();
    inventory.set_charges_source(Box::new(FakeCharges {
        charges: None,
        reads: Arc::clone(&reads),
    }));
    for _ in 0..2 {
        assert_eq!(memory_usage(&mut inventory), [("a".to_owned(), 100)]);
    }
    assert_eq!(reads.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn pods_sit_two_levels_below_the_pods_cgroup_once_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let inventory = inventory(root, "/sandbox", None);
    assert_eq!(inventory.pods_cgroup_and_depth(), None);
    v1_pod(root, "sandbox/kubepods/besteffort/poda", 100, 1);
    assert_eq!(
        inventory.pods_cgroup_and_depth(),
        Some(("/sandbox/kubepods".to_owned(), 4))
    );
}

#[test]
fn every_pods_memory_stalls_are_read_when_due_and_one_malformed_file_leaves_only_that_pod_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let stat = |pod: &str, refaults: &str| {
        write(
            &root
                .join("memory/sandbox/kubepods/burstable")
                .join(pod)
                .join("memory.stat"),
            &format!(
                "total_inactive_file 0\ntotal_workingset_refault_anon 0\ntotal_workingset_refault_file {refaults}\n"
            ),
        );
    };
    for pod in ["poda", "podb", "podc"] {
        v1_pod(root, &format!("sandbox/kubepods/burstable/{pod}"), 100, 1);
    }
    stat("poda", "5");
    stat("podb", "many");
    stat("podc", "0");
    let mut inventory = inventory(root, "/sandbox", None);
    let metrics = Metrics::new().unwrap();
    inventory.set_metrics(Arc::clone(&metrics));
    // Nothing read before the timer asks.
    assert!(
        inventory
            .pods()
            .unwrap()
            .iter()
            .all(|pod| pod.usage.memory_stalls.is_none())
    );

    inventory.read_memory_stalls();
    let page = metrics.render();
    assert!(
        page.contains(r#"evictd_pod_memory_refaults_total{kind="file",namespace="",pod="poda"} 5"#),
        "{page}"
    );
    assert!(
        page.contains(r#"evictd_pod_memory_refaults_total{kind="file",namespace="",pod="podc"} 0"#),
        "{page}"
    );
    assert!(!page.contains(r#"pod="podb""#), "{page}");
    let refaults: Vec<(String, Option<u64>)> = inventory
        .pods()
        .unwrap()
        .into_iter()
        .map(|pod| {
            let refaults = pod
                .usage
                .memory_stalls
                .and_then(|s| s.workingset_refault_file);
            (pod.name, refaults)
        })
        .collect();
    assert_eq!(
        refaults,
        [
            ("poda".to_owned(), Some(5)),
            ("podb".to_owned(), None),
            ("podc".to_owned(), Some(0)),
        ]
    );

    // Not due again within the interval: the counters stay as read.
    stat("poda", "6");
    inventory.read_memory_stalls();
    assert!(
        metrics
            .render()
            .contains(r#"evictd_pod_memory_refaults_total{kind="file",namespace="",pod="poda"} 5"#)
    );
}
