use super::*;
use crate::node::runtime::fixtures::{container, sandbox};

fn ids(containers: &[&Container]) -> Vec<String> {
    let mut ids: Vec<String> = containers.iter().map(|c| c.id.clone()).collect();
    ids.sort();
    ids
}

#[test]
fn a_pod_counts_its_ready_sandboxes_or_else_its_newest() {
    let sandboxes = [
        sandbox("a-old", "a", false, 1),
        sandbox("a-new", "a", true, 2),
        sandbox("b-1", "b", false, 1),
        sandbox("b-2", "b", false, 3),
    ];
    let counted: Vec<&str> = counted_sandboxes(&sandboxes)
        .iter()
        .map(|s| s.id.as_str())
        .collect();
    assert_eq!(counted, ["a-new", "b-2"]);
}

#[test]
fn running_instances_count_and_else_only_the_newest_exited_one() {
    use ContainerState::{ContainerExited as Exited, ContainerRunning as Running};
    let sandboxes = [sandbox("s", "a", true, 1), sandbox("gone", "a", false, 0)];
    let containers = [
        // app restarted twice: the running one counts.
        container("app-0", "s", "app", Exited, 1),
        container("app-1", "s", "app", Exited, 2),
        container("app-2", "s", "app", Running, 3),
        // init ran once and exited: it still counts (its logs are there).
        container("init-0", "s", "init", Exited, 0),
        // sidecar crashed twice, nothing running: the newest counts.
        container("side-0", "s", "side", Exited, 1),
        container("side-1", "s", "side", Exited, 5),
        // A container of a sandbox that does not count.
        container("old", "gone", "app", Running, 0),
    ];
    assert_eq!(
        ids(&counted_containers(&sandboxes, &containers)),
        ["app-2", "init-0", "side-1"]
    );
}

#[test]
fn pod_usage_fills_the_snapshot_fields_and_the_ephemeral_total() {
    let usage = |bytes, inodes| FsUsage { bytes, inodes };
    let pod = PodDiskUsage {
        namespace: "default".into(),
        name: "web".into(),
        containers: vec![
            ContainerDiskUsage {
                name: "app".into(),
                id: "1".into(),
                rootfs: Some(usage(100, 3)),
                logs: Some(usage(10, 2)),
            },
            ContainerDiskUsage {
                name: "side".into(),
                id: "2".into(),
                rootfs: None,
                logs: Some(usage(5, 1)),
            },
        ],
        volumes: vec![VolumeUsage {
            name: "cache".into(),
            plugin: EMPTY_DIR_PLUGIN.into(),
            usage: usage(1000, 4),
        }],
        etc_hosts: Some(usage(4096, 1)),
        incomplete: None,
    };
    let mut snapshot = PodUsage {
        memory_working_set_bytes: 7,
        ..PodUsage::default()
    };
    pod.fill(&mut snapshot);
    assert_eq!(snapshot.rootfs_bytes, 100);
    assert_eq!(snapshot.logs_bytes, 15);
    assert_eq!(snapshot.local_volume_bytes, 1000);
    assert_eq!(snapshot.inodes, 10);
    // Apart too, for the inode signals of each filesystem.
    assert_eq!(
        (
            snapshot.rootfs_inodes,
            snapshot.logs_inodes,
            snapshot.local_volume_inodes
        ),
        (Some(3), Some(3), Some(4))
    );
    assert_eq!(snapshot.memory_working_set_bytes, 7);
    assert_eq!(pod.ephemeral_storage_bytes(), 100 + 15 + 1000 + 4096);
    assert_eq!(pod.empty_dir("cache"), Some(usage(1000, 4)));
    assert_eq!(pod.empty_dir("other"), None);
    assert_eq!(pod.containers[0].ephemeral_storage_bytes(), Some(110));
    // kubelet names a container only when both are known.
    assert_eq!(pod.containers[1].ephemeral_storage_bytes(), None);
}

#[test]
fn local_volumes_are_found_by_plugin_and_secrets_are_not_counted() {
    let dir = tempfile::tempdir().unwrap();
    let volumes = dir.path().join("volumes");
    for (plugin, name) in [
        ("kubernetes.io~empty-dir", "cache"),
        ("kubernetes.io~configmap", "config"),
        ("kubernetes.io~secret", "token"),
        ("kubernetes.io~csi", "pvc"),
    ] {
        let path = volumes.join(plugin).join(name);
        fs::create_dir_all(&path).unwrap();
        fs::write(path.join("f"), vec![0u8; 8192]).unwrap();
    }
    let mut walk = Walk::new(WalkBounds::default());
    let (found, unseen) = local_volumes(&mut walk, &volumes);
    assert!(unseen.is_empty());
    let names: Vec<(&str, &str)> = found
        .iter()
        .map(|v| (v.plugin.as_str(), v.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("kubernetes.io~configmap", "config"),
            ("kubernetes.io~empty-dir", "cache")
        ]
    );
    assert!(
        found
            .iter()
            .all(|v| v.usage.bytes >= 8192 && v.usage.inodes == 2)
    );
    let (none, unseen) = local_volumes(&mut walk, &dir.path().join("none"));
    assert!(none.is_empty() && unseen.is_empty());
    assert_eq!(walk.shortfall(), None);
}

#[test]
fn a_volume_not_walked_whole_is_named_and_its_pod_is_held_to_what_was_seen() {
    let dir = tempfile::tempdir().unwrap();
    let volumes = dir.path().join("volumes");
    for name in ["a-small", "b-big"] {
        let path = volumes.join(EMPTY_DIR_PLUGIN).join(name);
        fs::create_dir_all(&path).unwrap();
        let files = if name == "b-big" { 50 } else { 2 };
        for n in 0..files {
            fs::File::create(path.join(format!("f{n}"))).unwrap();
        }
    }
    let mut walk = Walk::new(WalkBounds {
        max_entries: 10,
        ..WalkBounds::default()
    });
    let (found, unseen) = local_volumes(&mut walk, &volumes);
    assert_eq!(unseen, [(EMPTY_DIR_PLUGIN.to_owned(), "b-big".to_owned())]);
    let shortfall = walk.into_shortfall().unwrap();
    assert_eq!(shortfall.reason, Incomplete::Entries);
    let pod = PodDiskUsage {
        volumes: found,
        incomplete: Some(IncompleteUsage {
            shortfall,
            volumes: unseen,
        }),
        ..PodDiskUsage::default()
    };
    assert!(pod.empty_dir_whole("a-small"));
    assert!(!pod.empty_dir_whole("b-big"));
    // Behind an unreadable volumes directory, a volume may be anywhere.
    assert!(!pod.empty_dir_whole("absent"));
    let mut usage = PodUsage::default();
    pod.fill(&mut usage);
    assert!(usage.disk_incomplete);
    // a-small whole (3 inodes), b-big as far as the budget went.
    assert_eq!(usage.inodes, 10);
}
