use proptest::prelude::*;
use rstest::rstest;
use serde_json::json;

use super::*;
use crate::{
    decide::reason::KillReason,
    decide::snapshot::{ForkRate, QosClass},
};

const MI: u64 = 1 << 20;

/// A pod from its containers' JSON, as a snapshot file spells them.
fn pod_with(
    name: &str,
    priority: i32,
    containers: serde_json::Value,
    usage: PodUsage,
) -> PodSnapshot {
    serde_json::from_value(json!({
        "namespace": "default",
        "name": name,
        "priority": priority,
        "containers": containers,
    }))
    .map(|pod: PodSnapshot| PodSnapshot { usage, ..pod })
    .unwrap()
}

/// One container requesting `request` memory, using `working_set` bytes.
fn memory_pod(name: &str, priority: i32, request: Option<&str>, working_set: u64) -> PodSnapshot {
    let requests = request.map_or(json!({}), |r| json!({ "memory": r }));
    let usage = PodUsage {
        memory_working_set_bytes: working_set,
        ..PodUsage::default()
    };
    pod_with(
        name,
        priority,
        json!([{"name": "app", "requests": requests}]),
        usage,
    )
}

/// The default ranking: kubelet's, whatever the signal.
fn kubelet_rank(pods: &[PodSnapshot], signal: Signal, layout: DiskLayout) -> Vec<Ranked> {
    rank(pods, signal, layout, PidRanking::Kubelet)
}

fn names<'a>(ranking: &[Ranked], pods: &'a [PodSnapshot]) -> Vec<&'a str> {
    ranking
        .iter()
        .map(|r| pods[r.index].name.as_str())
        .collect()
}

#[rstest]
#[case::nothing(json!([{"name": "a"}]), QosClass::BestEffort)]
#[case::zero_quantities_are_ignored(
    json!([{"name": "a", "requests": {"cpu": "0", "memory": "0"}}]),
    QosClass::BestEffort
)]
#[case::only_other_resources(
    json!([{"name": "a", "requests": {"ephemeral-storage": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}]),
    QosClass::BestEffort
)]
#[case::a_cpu_request(json!([{"name": "a", "requests": {"cpu": "100m"}}]), QosClass::Burstable)]
#[case::requests_equal_limits(
    json!([{"name": "a", "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1024Mi"}}]),
    QosClass::Guaranteed
)]
#[case::limits_alone_default_the_requests(
    json!([{"name": "a", "limits": {"cpu": "1", "memory": "1Gi"}}]),
    QosClass::Guaranteed
)]
#[case::requests_below_limits(
    json!([{"name": "a", "requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}]),
    QosClass::Burstable
)]
#[case::memory_limit_only(json!([{"name": "a", "limits": {"memory": "1Gi"}}]), QosClass::Burstable)]
#[case::explicit_zero_request_is_not_defaulted(
    json!([{"name": "a", "requests": {"memory": "0"}, "limits": {"cpu": "1", "memory": "1Gi"}}]),
    QosClass::Burstable
)]
#[case::one_container_without_limits(
    json!([
        {"name": "a", "limits": {"cpu": "1", "memory": "1Gi"}},
        {"name": "b"}
    ]),
    QosClass::Burstable
)]
#[case::every_container_guaranteed(
    json!([
        {"name": "a", "limits": {"cpu": "1", "memory": "1Gi"}},
        {"name": "b", "requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"cpu": "250m", "memory": "64Mi"}}
    ]),
    QosClass::Guaranteed
)]
fn qos_class_as_kubernetes_derives_it(
    #[case] containers: serde_json::Value,
    #[case] qos: QosClass,
) {
    let pod = pod_with("p", 0, containers, PodUsage::default());
    assert_eq!(pod.qos_class(), qos);
}

#[test]
fn memory_request_sums_containers_and_defaults_to_limits() {
    let pod = pod_with(
        "p",
        0,
        json!([
            {"name": "a", "requests": {"memory": "100Mi"}},
            {"name": "b", "limits": {"memory": "50Mi"}},
            {"name": "c"}
        ]),
        PodUsage::default(),
    );
    assert_eq!(pod.request("memory"), 150 * MI as i64);
}

#[test]
fn memory_pods_above_their_request_go_before_higher_priority_ones_within() {
    let pods = [
        memory_pod("within", 0, Some("200Mi"), 100 * MI),
        memory_pod("above", 1000, Some("100Mi"), 101 * MI),
    ];
    let ranking = kubelet_rank(&pods, Signal::MemoryAvailable, DiskLayout::Shared);
    assert_eq!(names(&ranking, &pods), ["above", "within"]);
    assert_eq!(ranking[0].exceeds_request, Some(true));
    assert_eq!(ranking[1].exceeds_request, Some(false));
}

#[test]
fn memory_pods_above_their_request_go_by_priority_then_excess() {
    let pods = [
        memory_pod("high", 10, Some("100Mi"), 900 * MI),
        memory_pod("small-excess", 0, Some("100Mi"), 150 * MI),
        memory_pod("big-excess", 0, Some("400Mi"), 600 * MI),
        memory_pod("best-effort", 0, None, 180 * MI),
    ];
    let ranking = kubelet_rank(
        &pods,
        Signal::AllocatableMemoryAvailable,
        DiskLayout::Shared,
    );
    assert_eq!(
        names(&ranking, &pods),
        ["big-excess", "best-effort", "small-excess", "high"]
    );
}

#[test]
fn memory_pods_within_their_request_go_by_priority_then_usage_over_request() {
    let pods = [
        memory_pod("far-below", 0, Some("1Gi"), 100 * MI),
        memory_pod("near", 0, Some("200Mi"), 190 * MI),
        memory_pod("important", 5, Some("200Mi"), 199 * MI),
        memory_pod("low", -5, Some("1Gi"), 0),
    ];
    let ranking = kubelet_rank(&pods, Signal::MemoryAvailable, DiskLayout::Shared);
    assert_eq!(
        names(&ranking, &pods),
        ["low", "near", "far-below", "important"]
    );
}

#[test]
fn a_memory_limit_without_request_is_the_request() {
    let limited = pod_with(
        "limited",
        0,
        json!([{"name": "app", "limits": {"memory": "200Mi"}}]),
        PodUsage {
            memory_working_set_bytes: 150 * MI,
            ..PodUsage::default()
        },
    );
    let pods = [limited, memory_pod("greedy", 0, Some("100Mi"), 110 * MI)];
    let ranking = kubelet_rank(&pods, Signal::MemoryAvailable, DiskLayout::Shared);
    assert_eq!(names(&ranking, &pods), ["greedy", "limited"]);
    assert_eq!(ranking[1].request, Some(200 * MI as i64));
}

#[test]
fn ties_keep_the_input_order() {
    let pods = [
        memory_pod("first", 0, Some("100Mi"), 150 * MI),
        memory_pod("second", 0, Some("100Mi"), 150 * MI),
        memory_pod("third", 0, Some("200Mi"), 250 * MI),
    ];
    let ranking = kubelet_rank(&pods, Signal::MemoryAvailable, DiskLayout::Shared);
    assert_eq!(names(&ranking, &pods), ["first", "second", "third"]);
}

fn pids_pod(name: &str, priority: i32, pids: u64) -> PodSnapshot {
    let usage = PodUsage {
        pids,
        ..PodUsage::default()
    };
    pod_with(name, priority, json!([{"name": "app"}]), usage)
}

#[test]
fn pid_pressure_ranks_by_priority_then_pid_count() {
    let pods = [
        pids_pod("important-forker", 100, 5000),
        pids_pod("few", 0, 10),
        pids_pod("many", 0, 300),
    ];
    let ranking = kubelet_rank(&pods, Signal::PidAvailable, DiskLayout::Shared);
    assert_eq!(names(&ranking, &pods), ["many", "few", "important-forker"]);
    assert_eq!(ranking[0].request, None);
    assert_eq!(ranking[0].usage, 300);
}

/// A pod of `pids` processes forking `rate` times a second (`None`: the
/// rate is not given).
fn forking_pod(name: &str, priority: i32, pids: u64, rate: Option<f64>) -> PodSnapshot {
    let mut pod = pids_pod(name, priority, pids);
    pod.usage.forks_per_second = rate.map(|rate| ForkRate::try_from(rate).unwrap());
    pod
}

/// PID pressure under `--pid-ranking fork-rate`.
fn fork_rate_rank(pods: &[PodSnapshot]) -> Vec<Ranked> {
    rank(
        pods,
        Signal::PidAvailable,
        DiskLayout::Shared,
        PidRanking::ForkRate,
    )
}

#[test]
fn at_equal_priority_kubelet_takes_the_quiet_pod_with_more_processes_and_fork_rate_the_bomb() {
    let pods = [
        forking_pod("db", 0, 200, Some(0.0)),
        forking_pod("bomb", 0, 150, Some(400.0)),
    ];
    let kubelet = kubelet_rank(&pods, Signal::PidAvailable, DiskLayout::Shared);
    assert_eq!(names(&kubelet, &pods), ["db", "bomb"]);
    assert_eq!(
        kubelet[0].fork_rate, None,
        "kubelet's order ignores the rate"
    );
    let by_forks = fork_rate_rank(&pods);
    assert_eq!(names(&by_forks, &pods), ["bomb", "db"]);
    assert_eq!(by_forks[0].reason(), "pids 150, 400.0 forks/s, priority 0");
}

#[test]
fn the_fork_rate_ranks_after_priority_and_before_the_process_count() {
    let pods = [
        forking_pod("important-bomb", 100, 50, Some(1000.0)),
        forking_pod("slow-many", 0, 300, Some(1.0)),
        forking_pod("fast-few", 0, 10, Some(2.0)),
        forking_pod("quiet-most", 0, 400, Some(0.0)),
        // Equal rates: the count decides, as kubelet's.
        forking_pod("fast-more", 0, 20, Some(2.0)),
    ];
    let ranking = fork_rate_rank(&pods);
    assert_eq!(
        names(&ranking, &pods),
        [
            "fast-more",
            "fast-few",
            "slow-many",
            "quiet-most",
            "important-bomb"
        ]
    );
}

#[test]
fn a_pod_without_a_fork_rate_ranks_as_one_that_does_not_fork() {
    let pods = [
        forking_pod("unmeasured", 0, 100, None),
        forking_pod("quiet", 0, 100, Some(0.0)),
        forking_pod("forking", 0, 10, Some(0.5)),
        forking_pod("unmeasured-many", 0, 300, None),
    ];
    let ranking = fork_rate_rank(&pods);
    // Ties keep the input order.
    assert_eq!(
        names(&ranking, &pods),
        ["forking", "unmeasured-many", "unmeasured", "quiet"]
    );
    assert_eq!(ranking[1].fork_rate, Some(ForkRate::NONE));
}

#[test]
fn the_fork_rate_orders_nothing_but_pid_pressure() {
    let mut big = memory_pod("big", 0, None, 300 * MI);
    let mut bomb = memory_pod("bomb", 0, None, 100 * MI);
    big.usage.pids = 1;
    bomb.usage.forks_per_second = Some(ForkRate::try_from(500.0).unwrap());
    let pods = [bomb, big];
    let ranking = rank(
        &pods,
        Signal::MemoryAvailable,
        DiskLayout::Shared,
        PidRanking::ForkRate,
    );
    assert_eq!(names(&ranking, &pods), ["big", "bomb"]);
    assert_eq!(ranking[0].fork_rate, None);
}

#[rstest]
#[case::negative(-1.0)]
#[case::infinite(f64::INFINITY)]
#[case::not_a_number(f64::NAN)]
fn a_fork_rate_is_a_finite_number_not_below_zero(#[case] rate: f64) {
    assert!(ForkRate::try_from(rate).is_err());
}

#[test]
fn pid_rankings_are_named_as_the_flag_spells_them() {
    for ranking in [PidRanking::Kubelet, PidRanking::ForkRate] {
        assert_eq!(ranking.to_string().parse::<PidRanking>().unwrap(), ranking);
    }
    assert_eq!(
        "fork-rate".parse::<PidRanking>().unwrap(),
        PidRanking::ForkRate
    );
    assert!("forks".parse::<PidRanking>().is_err());
}

fn disk_pod(name: &str, priority: i32, request: Option<&str>, usage: PodUsage) -> PodSnapshot {
    let requests = request.map_or(json!({}), |r| json!({ "ephemeral-storage": r }));
    pod_with(
        name,
        priority,
        json!([{"name": "app", "requests": requests}]),
        usage,
    )
}

fn disk_usage(rootfs: u64, logs: u64, volumes: u64) -> PodUsage {
    PodUsage {
        rootfs_bytes: rootfs * MI,
        logs_bytes: logs * MI,
        local_volume_bytes: volumes * MI,
        ..PodUsage::default()
    }
}

/// kubelet's `buildSignalToRankFunc(withImageFs, splitContainerImageFs)`,
/// signal by signal, for the three layouts.
#[rstest]
#[case::shared_nodefs_counts_everything(Signal::NodeFsAvailable, DiskLayout::Shared, ["layers", "logs"], 300)]
#[case::shared_imagefs_counts_everything(Signal::ImageFsAvailable, DiskLayout::Shared, ["layers", "logs"], 300)]
#[case::shared_containerfs_counts_everything(Signal::ContainerFsAvailable, DiskLayout::Shared, ["layers", "logs"], 300)]
#[case::dedicated_nodefs_counts_logs_and_volumes(Signal::NodeFsAvailable, DiskLayout::DedicatedImageFs, ["logs", "layers"], 200)]
#[case::dedicated_imagefs_counts_writable_layers(Signal::ImageFsAvailable, DiskLayout::DedicatedImageFs, ["layers", "logs"], 250)]
#[case::dedicated_containerfs_follows_imagefs(Signal::ContainerFsAvailable, DiskLayout::DedicatedImageFs, ["layers", "logs"], 250)]
#[case::split_nodefs_counts_logs_volumes_and_writable_layers(Signal::NodeFsAvailable, DiskLayout::SplitImageFs, ["layers", "logs"], 300)]
#[case::split_containerfs_follows_nodefs(Signal::ContainerFsAvailable, DiskLayout::SplitImageFs, ["layers", "logs"], 300)]
#[case::split_imagefs_counts_images_which_no_pod_holds(Signal::ImageFsAvailable, DiskLayout::SplitImageFs, ["logs", "layers"], 0)]
fn disk_usage_measured_depends_on_the_filesystem(
    #[case] signal: Signal,
    #[case] layout: DiskLayout,
    #[case] order: [&str; 2],
    #[case] first_usage_mi: i64,
) {
    let pods = [
        disk_pod("logs", 0, None, disk_usage(0, 100, 100)),
        disk_pod("layers", 0, None, disk_usage(250, 30, 20)),
    ];
    let ranking = kubelet_rank(&pods, signal, layout);
    assert_eq!(names(&ranking, &pods), order);
    assert_eq!(ranking[0].usage, first_usage_mi * MI as i64);
}

/// Inodes counted apart (writable layer, logs, local volumes) as bytes
/// are: a dedicated imagefs's inode signal ranks by writable-layer inodes,
/// nodefs's by logs and volumes.
#[rstest]
#[case::shared_counts_every_inode(Signal::NodeFsInodesFree, DiskLayout::Shared, ["logs", "layers"], 1000)]
#[case::dedicated_nodefs_counts_logs_and_volumes(Signal::NodeFsInodesFree, DiskLayout::DedicatedImageFs, ["logs", "layers"], 1000)]
#[case::dedicated_imagefs_counts_writable_layers(Signal::ImageFsInodesFree, DiskLayout::DedicatedImageFs, ["layers", "logs"], 800)]
#[case::dedicated_containerfs_counts_writable_layers(Signal::ContainerFsInodesFree, DiskLayout::DedicatedImageFs, ["layers", "logs"], 800)]
#[case::split_nodefs_counts_every_inode(Signal::NodeFsInodesFree, DiskLayout::SplitImageFs, ["logs", "layers"], 1000)]
#[case::split_imagefs_counts_none(Signal::ImageFsInodesFree, DiskLayout::SplitImageFs, ["logs", "layers"], 0)]
fn inodes_measured_depend_on_the_filesystem(
    #[case] signal: Signal,
    #[case] layout: DiskLayout,
    #[case] order: [&str; 2],
    #[case] first_usage: i64,
) {
    let inodes = |rootfs, logs, volumes| PodUsage {
        inodes: rootfs + logs + volumes,
        rootfs_inodes: Some(rootfs),
        logs_inodes: Some(logs),
        local_volume_inodes: Some(volumes),
        ..PodUsage::default()
    };
    let pods = [
        disk_pod("logs", 0, None, inodes(0, 500, 500)),
        disk_pod("layers", 0, None, inodes(800, 50, 50)),
    ];
    let ranking = kubelet_rank(&pods, signal, layout);
    assert_eq!(names(&ranking, &pods), order);
    assert_eq!(ranking[0].usage, first_usage);
}

#[test]
fn without_the_split_the_inode_total_ranks_wherever_anything_counts() {
    let total = |count| PodUsage {
        inodes: count,
        ..PodUsage::default()
    };
    let pods = [
        disk_pod("few", 0, None, total(10)),
        disk_pod("many", 0, None, total(900)),
    ];
    for (signal, layout) in [
        (Signal::NodeFsInodesFree, DiskLayout::DedicatedImageFs),
        (Signal::ImageFsInodesFree, DiskLayout::DedicatedImageFs),
        (Signal::ContainerFsInodesFree, DiskLayout::SplitImageFs),
    ] {
        let ranking = kubelet_rank(&pods, signal, layout);
        assert_eq!(names(&ranking, &pods), ["many", "few"], "{signal}");
        assert_eq!(ranking[0].usage, 900);
    }
    // A split imagefs holds images alone, whatever the total says.
    let ranking = kubelet_rank(&pods, Signal::ImageFsInodesFree, DiskLayout::SplitImageFs);
    assert_eq!(ranking[1].usage, 0);
}

#[test]
fn disk_ranks_above_request_then_priority_then_excess() {
    let pods = [
        disk_pod("within", -10, Some("1Gi"), disk_usage(500, 0, 0)),
        disk_pod("above-important", 10, Some("100Mi"), disk_usage(900, 0, 0)),
        disk_pod("above-small", 0, Some("100Mi"), disk_usage(150, 0, 0)),
        disk_pod("above-big", 0, None, disk_usage(300, 0, 0)),
    ];
    let ranking = kubelet_rank(&pods, Signal::NodeFsAvailable, DiskLayout::Shared);
    assert_eq!(
        names(&ranking, &pods),
        ["above-big", "above-small", "above-important", "within"]
    );
}

#[test]
fn a_pod_whose_disk_usage_was_not_seen_whole_ranks_first_as_one_without_stats() {
    let hidden = |rootfs, volumes| PodUsage {
        disk_incomplete: true,
        ..disk_usage(rootfs, 0, volumes)
    };
    let pods = [
        disk_pod("big", 0, None, disk_usage(0, 0, 900)),
        // Seen: 1Mi, within its request, and more important than "big".
        disk_pod("hider", 10, Some("1Gi"), hidden(0, 1)),
        disk_pod("hider-low", 0, None, hidden(500, 0)),
    ];
    let ranking = kubelet_rank(&pods, Signal::NodeFsAvailable, DiskLayout::Shared);
    // Before every measured pod, and among themselves by priority only.
    assert_eq!(names(&ranking, &pods), ["hider-low", "hider", "big"]);
    assert!(ranking[1].usage_incomplete);
    assert!(
        ranking[1]
            .reason()
            .ends_with("; disk usage at least this (not all of it could be measured), ranked as a pod without stats"),
        "{}",
        ranking[1].reason()
    );
    assert_eq!(
        names(
            &kubelet_rank(&pods, Signal::NodeFsInodesFree, DiskLayout::Shared),
            &pods
        )[..2],
        ["hider-low", "hider"]
    );
    // With a dedicated imagefs, the imagefs signals rank by writable
    // layers, which the runtime measures: the walk does not count there.
    let ranking = kubelet_rank(
        &pods,
        Signal::ImageFsAvailable,
        DiskLayout::DedicatedImageFs,
    );
    assert_eq!(names(&ranking, &pods), ["hider-low", "big", "hider"]);
    assert!(!ranking[0].usage_incomplete);
    // Memory never looks at it.
    assert!(
        !kubelet_rank(&pods, Signal::MemoryAvailable, DiskLayout::Shared)
            .iter()
            .any(|r| r.usage_incomplete)
    );
}

#[test]
fn any_inode_use_exceeds_the_zero_request_and_the_storage_request_is_subtracted() {
    let inodes = |count| PodUsage {
        inodes: count,
        ..PodUsage::default()
    };
    let pods = [
        disk_pod("none", -1, None, inodes(0)),
        disk_pod("requested", 0, Some("1000"), inodes(1500)),
        disk_pod("unrequested", 0, None, inodes(1000)),
    ];
    let ranking = kubelet_rank(&pods, Signal::NodeFsInodesFree, DiskLayout::Shared);
    // 1500 - 1000 < 1000 - 0: the storage request counts against inodes,
    // as in kubelet.
    assert_eq!(names(&ranking, &pods), ["unrequested", "requested", "none"]);
    assert_eq!(ranking[2].exceeds_request, Some(false));
}

#[test]
fn explanations_say_why() {
    let mut critical = memory_pod("critical", SYSTEM_CRITICAL, Some("100Mi"), 200 * MI);
    critical.hosts_evictd = true;
    let pods = [critical, memory_pod("web", 0, Some("100Mi"), 50 * MI)];
    let ranking = kubelet_rank(&pods, Signal::MemoryAvailable, DiskLayout::Shared);
    assert_eq!(
        ranking[0].reason(),
        "memory 200Mi exceeds request 100Mi, priority 2000000000; system-critical priority, never evicted; runs evictd, never evicted"
    );
    assert!(!ranking[0].evictable);
    assert_eq!(
        ranking[1].reason(),
        "memory 50Mi within request 100Mi, priority 0"
    );
    assert_eq!(pods[ranking[1].index].qos_class(), QosClass::Burstable);
}

const SYSTEM_CRITICAL: i32 = crate::decide::snapshot::SYSTEM_CRITICAL_PRIORITY;

proptest! {
    /// With equal priority, a pod above its memory request is ranked
    /// before any pod within its request, whatever the amounts.
    #[test]
    fn above_request_precedes_within_request_at_equal_priority(
        pods in prop::collection::vec((0u64..2048, 0u64..2048), 1..12),
        priority in -5i32..5,
    ) {
        let pods: Vec<PodSnapshot> = pods
            .iter()
            .enumerate()
            .map(|(i, &(request, usage))| {
                memory_pod(&format!("p{i}"), priority, Some(&format!("{request}Mi")), usage * MI)
            })
            .collect();
        let ranking = kubelet_rank(&pods, Signal::MemoryAvailable, DiskLayout::Shared);
        prop_assert_eq!(ranking.len(), pods.len());
        let first_within = ranking.iter().position(|r| r.exceeds_request == Some(false));
        if let Some(first_within) = first_within {
            prop_assert!(ranking[first_within..].iter().all(|r| r.exceeds_request == Some(false)));
        }
    }
}

#[test]
fn a_pod_without_metadata_goes_after_every_pod_evictd_knows() {
    // The API was away when `stranger` started: only its cgroup is known,
    // and it is by far the largest.
    let mut stranger = memory_pod("stranger", 0, None, 900 * MI);
    stranger.unknown = vec!["priority".into(), "containers".into()];
    let pods = [
        stranger,
        memory_pod("guaranteed", 0, Some("500Mi"), 100 * MI),
        memory_pod("hog", 0, None, 300 * MI),
    ];
    let ranking = kubelet_rank(&pods, Signal::MemoryAvailable, DiskLayout::Shared);
    assert_eq!(names(&ranking, &pods), ["hog", "guaranteed", "stranger"]);
    assert!(
        ranking[2].reason().contains("metadata unknown"),
        "{}",
        ranking[2].reason()
    );
    let pids = kubelet_rank(&pods, Signal::PidAvailable, DiskLayout::Shared);
    assert_eq!(names(&pids, &pods).last(), Some(&"stranger"));
}

/// Why the first pod of `pods` ranked under `pid_ranking` is killed.
fn first_victims_reason(pods: &[PodSnapshot], pid_ranking: PidRanking) -> KillReason {
    let ranking = rank(pods, Signal::PidAvailable, DiskLayout::Shared, pid_ranking);
    KillReason::for_threshold(Signal::PidAvailable, &ranking, 0)
}

#[rstest]
#[case::kubelet_ranking_is_the_threshold(
    PidRanking::Kubelet,
    Some(0.0),
    KillReason::Threshold(Signal::PidAvailable)
)]
#[case::the_bomb_put_first_by_its_fork_rate(PidRanking::ForkRate, Some(0.0), KillReason::ForkRate)]
#[case::a_tie_in_fork_rate_is_the_process_count(
    PidRanking::ForkRate,
    Some(400.0),
    KillReason::Threshold(Signal::PidAvailable)
)]
fn a_pid_kill_is_for_the_fork_rate_only_when_the_fork_rate_put_the_pod_first(
    #[case] pid_ranking: PidRanking,
    #[case] quiet_rate: Option<f64>,
    #[case] reason: KillReason,
) {
    let pods = [
        forking_pod("db", 0, 200, quiet_rate),
        forking_pod("bomb", 0, 250, Some(400.0)),
    ];
    assert_eq!(first_victims_reason(&pods, pid_ranking), reason);
}

#[test]
fn a_pid_kill_decided_by_priority_is_for_the_threshold_under_either_ranking() {
    let pods = [
        forking_pod("important-quiet", 100, 10, Some(0.0)),
        forking_pod("bomb", 0, 150, Some(400.0)),
    ];
    let reason = first_victims_reason(&pods, PidRanking::ForkRate);
    assert_eq!(reason, KillReason::Threshold(Signal::PidAvailable));
    assert_eq!(reason.as_str(), "threshold");
    assert_eq!(reason.signal(), "pid.available");
}
