use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::{
    decide::snapshot::{ContainerSpec, EmptyDirVolume},
    node::runtime::disk_usage::{
        ContainerDiskUsage, FsUsage, IncompleteUsage, Shortfall, VolumeUsage,
    },
};

const MI: u64 = 1 << 20;

fn q(text: &str) -> Quantity {
    Quantity::parse(text).unwrap()
}

fn spec(name: &str, limit: Option<&str>) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        requests: BTreeMap::new(),
        limits: limit
            .map(|l| BTreeMap::from([(EPHEMERAL_STORAGE.to_owned(), q(l))]))
            .unwrap_or_default(),
        restart_policy: None,
    }
}

/// A pod of `containers` with `empty_dirs`.
fn pod(containers: &[ContainerSpec], empty_dirs: &[EmptyDirVolume]) -> PodSnapshot {
    let mut pod: PodSnapshot = serde_json::from_value(json!({
        "namespace": "default", "name": "p", "containers": [],
    }))
    .unwrap();
    pod.containers = containers.to_vec();
    pod.empty_dirs = empty_dirs.to_vec();
    pod
}

fn bytes(bytes: u64) -> Option<FsUsage> {
    Some(FsUsage { bytes, inodes: 1 })
}

/// A pod with containers `(name, rootfs, logs)` and emptyDirs `(name, bytes)`.
fn usage(containers: &[(&str, u64, u64)], empty_dirs: &[(&str, u64)]) -> PodDiskUsage {
    PodDiskUsage {
        namespace: "default".into(),
        name: "p".into(),
        containers: containers
            .iter()
            .map(|(name, rootfs, logs)| ContainerDiskUsage {
                name: (*name).into(),
                id: format!("id-{name}"),
                rootfs: bytes(*rootfs),
                logs: bytes(*logs),
            })
            .collect(),
        volumes: empty_dirs
            .iter()
            .map(|(name, used)| VolumeUsage {
                name: (*name).into(),
                plugin: "kubernetes.io~empty-dir".into(),
                usage: FsUsage {
                    bytes: *used,
                    inodes: 1,
                },
            })
            .collect(),
        etc_hosts: None,
        incomplete: None,
    }
}

fn empty_dir(name: &str, limit: Option<&str>) -> EmptyDirVolume {
    EmptyDirVolume {
        name: name.into(),
        size_limit: limit.map(q),
    }
}

#[test]
fn an_empty_dir_over_its_size_limit_is_evicted_with_kubelets_message() {
    let found = evaluate(
        &pod(&[spec("app", None)], &[empty_dir("scratch", Some("64Mi"))]),
        &usage(&[("app", 0, 0)], &[("scratch", 65 * MI)]),
        false,
    )
    .unwrap();
    assert_eq!(
        found.message(),
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"64Mi\". "
    );
    assert_eq!(found.signal(), "emptydirfs.limit");
    // At the limit exactly: not over it.
    assert_eq!(
        evaluate(
            &pod(&[spec("app", None)], &[empty_dir("scratch", Some("64Mi"))]),
            &usage(&[("app", 0, 0)], &[("scratch", 64 * MI)]),
            false,
        ),
        None
    );
    // No limit, a zero limit, or a volume not on disk: nothing to enforce.
    for volume in [empty_dir("scratch", None), empty_dir("scratch", Some("0"))] {
        assert_eq!(
            evaluate(
                &pod(&[spec("app", None)], &[volume]),
                &usage(&[("app", 0, 0)], &[("scratch", 900 * MI)]),
                false
            ),
            None
        );
    }
    assert_eq!(
        evaluate(
            &pod(&[], &[empty_dir("memory", Some("1Mi"))]),
            &usage(&[], &[]),
            false
        ),
        None
    );
}

#[test]
fn a_pod_over_the_sum_of_its_containers_limits_is_evicted_before_any_container() {
    // Each container within its own limit, the pod over 1Gi + 512Mi.
    let containers = [
        spec("app", Some("1Gi")),
        spec("side", Some("512Mi")),
        spec("none", None),
    ];
    let found = evaluate(
        &pod(&containers, &[empty_dir("cache", None)]),
        &usage(
            &[("app", 900 * MI, 0), ("side", 0, 100 * MI)],
            &[("cache", 600 * MI)],
        ),
        false,
    )
    .unwrap();
    assert_eq!(
        found.message(),
        "Pod ephemeral local storage usage exceeds the total limit of containers 1536Mi. "
    );
    assert_eq!(found.signal(), "ephemeralpodfs.limit");
    // The sum keeps the first limit's units, as Kubernetes' Add does.
    let limit = |containers: &[ContainerSpec]| {
        resources::ephemeral_storage_limit(&pod(containers, &[])).map(|q| q.to_string())
    };
    assert_eq!(
        limit(&[spec("a", Some("1G")), spec("b", Some("500M"))]).as_deref(),
        Some("1500M")
    );
    assert_eq!(limit(&[spec("a", None)]), None);
}

#[test]
fn a_container_over_its_limit_counts_its_writable_layer_only_without_an_imagefs() {
    // The pod is within 100Mi + 10Gi; app is not: 80Mi layer + 30Mi logs.
    let spec = pod(
        &[spec("app", Some("100Mi")), spec("big", Some("10Gi"))],
        &[],
    );
    let used = usage(&[("big", 0, 0), ("app", 80 * MI, 30 * MI)], &[]);
    let found = evaluate(&spec, &used, false).unwrap();
    assert_eq!(
        found.message(),
        "Container app exceeded its local ephemeral storage limit \"100Mi\". "
    );
    assert_eq!(found.signal(), "ephemeralcontainerfs.limit");
    // With a dedicated imagefs only its 30Mi of logs count.
    assert_eq!(evaluate(&spec, &used, true), None);
}

#[test]
fn the_empty_dir_check_comes_first() {
    let found = evaluate(
        &pod(
            &[spec("app", Some("10Mi"))],
            &[empty_dir("scratch", Some("20Mi"))],
        ),
        &usage(&[("app", 50 * MI, 0)], &[("scratch", 30 * MI)]),
        false,
    )
    .unwrap();
    assert!(
        matches!(found, LocalStorageViolation::EmptyDir { .. }),
        "{found:?}"
    );
}

/// `pod` whose walk fell short for `reason`, with emptyDir `unseen` not
/// seen whole.
fn incomplete(mut pod: PodDiskUsage, reason: Incomplete, unseen: &[&str]) -> PodDiskUsage {
    pod.incomplete = Some(IncompleteUsage {
        shortfall: Shortfall {
            reason,
            path: "/var/lib/kubelet/pods/p/volumes".into(),
            error: None,
        },
        volumes: unseen
            .iter()
            .map(|name| ("kubernetes.io~empty-dir".to_owned(), (*name).to_owned()))
            .collect(),
    });
    pod
}

#[test]
fn a_pod_that_hides_usage_from_its_limit_is_held_to_it_as_over_it() {
    let seen = usage(&[("app", 0, 0)], &[("scratch", MI), ("cache", MI)]);
    let scratch = [empty_dir("scratch", Some("4Mi")), empty_dir("cache", None)];
    // 1Mi seen of a 4Mi limit, the rest unreadable: held to it as over it.
    let hidden = incomplete(seen.clone(), Incomplete::Unreadable, &["scratch"]);
    let found = evaluate(&pod(&[spec("app", None)], &scratch), &hidden, false).unwrap();
    assert_eq!(
        found,
        LocalStorageViolation::Unmeasured {
            volume: Some("scratch".into()),
            limit: q("4Mi"),
            used_bytes: MI,
            reason: Incomplete::Unreadable,
        }
    );
    assert_eq!(found.signal(), "emptydirfs.limit");
    assert_eq!(
        found.message(),
        "Usage of EmptyDir volume \"scratch\" could not be measured whole (a directory evictd cannot read): at least 1048576 bytes, against the limit \"4Mi\". "
    );
    // A volume without a limit hiding usage leaves only the pod's limit.
    let cache_hidden = incomplete(seen.clone(), Incomplete::Entries, &["cache"]);
    assert_eq!(
        evaluate(&pod(&[spec("app", None)], &scratch), &cache_hidden, false),
        None,
        "no limit the unseen part counts against"
    );
    let found = evaluate(
        &pod(&[spec("app", Some("1Gi"))], &scratch),
        &cache_hidden,
        false,
    )
    .unwrap();
    assert_eq!(found.signal(), "ephemeralpodfs.limit");
    assert_eq!(
        found.message(),
        "Pod ephemeral local storage usage could not be measured whole (more files than evictd counts): at least 2097152 bytes, against the total limit of containers 1Gi. "
    );
    // What was seen over a limit is kubelet's own eviction, first.
    let over = incomplete(
        usage(&[("app", 0, 0)], &[("scratch", 5 * MI)]),
        Incomplete::Depth,
        &["scratch"],
    );
    assert!(matches!(
        evaluate(&pod(&[spec("app", None)], &scratch), &over, false),
        Some(LocalStorageViolation::EmptyDir { .. })
    ));
    // Only time cut the walk short: the node's slowness, not judged.
    let slow = incomplete(seen, Incomplete::Time, &["scratch"]);
    assert_eq!(
        evaluate(&pod(&[spec("app", Some("1Gi"))], &scratch), &slow, false),
        None
    );
}

/// kubelet's `PodLimits`: a sidecar's limit adds to the containers', an
/// init container's counts alone (with the sidecars before it) when it is
/// larger, and the overhead comes on top.
#[test]
fn the_pod_limit_counts_sidecars_init_containers_and_overhead() {
    let sidecar = |name, limit| ContainerSpec {
        restart_policy: Some("Always".into()),
        ..spec(name, Some(limit))
    };
    // 100Mi app + 50Mi sidecar; the 120Mi init container ran alone.
    let mut with_sidecar = pod(&[spec("app", Some("100Mi"))], &[]);
    with_sidecar.init_containers = vec![spec("setup", Some("120Mi")), sidecar("logs", "50Mi")];
    with_sidecar.overhead = BTreeMap::from([(EPHEMERAL_STORAGE.to_owned(), q("10Mi"))]);
    let used = usage(&[("app", 90 * MI, 0), ("logs", 0, 60 * MI)], &[]);
    // 150Mi used: over the containers' 100Mi, within 100 + 50 + 10.
    assert_eq!(evaluate(&with_sidecar, &used, false), None);
    let over = usage(&[("app", 90 * MI, 0), ("logs", 0, 71 * MI)], &[]);
    assert_eq!(
        evaluate(&with_sidecar, &over, false).map(|v| v.message()),
        Some(
            "Pod ephemeral local storage usage exceeds the total limit of containers 160Mi. "
                .into()
        )
    );
    // An init container's limit alone is the pod's: 300Mi, then + 10Mi.
    let mut init_only = pod(&[spec("app", None)], &[]);
    init_only.init_containers = vec![spec("setup", Some("300Mi"))];
    init_only.overhead = with_sidecar.overhead.clone();
    assert!(has_limit(&init_only));
    assert_eq!(
        resources::ephemeral_storage_limit(&init_only).map(|q| q.to_string()),
        Some("310Mi".into())
    );
    let big = usage(&[("app", 311 * MI, 0)], &[]);
    assert!(matches!(
        evaluate(&init_only, &big, false),
        Some(LocalStorageViolation::Pod { .. })
    ));
    // The sidecar has no container check of its own: only regular
    // containers are held to theirs.
    let mut lone_sidecar = pod(&[spec("app", None)], &[]);
    lone_sidecar.init_containers = vec![sidecar("logs", "1Gi")];
    let sidecar_over = usage(&[("logs", 0, 2048 * MI)], &[]);
    assert!(matches!(
        evaluate(&lone_sidecar, &sidecar_over, false),
        Some(LocalStorageViolation::Pod { .. })
    ));
}

#[test]
fn quotes_as_go_does() {
    assert_eq!(go_quote("cache"), "\"cache\"");
    assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
}
