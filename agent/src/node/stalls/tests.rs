use std::path::Path;

use super::*;
use crate::node::cgroupfs::CgroupFs;

/// A pod cgroup's memory.stat on this machine's v1 (Linux 6.18), cut to the
/// lines that matter: the pod's own counters are 0, its containers' are in
/// the `total_` ones.
const V1_STAT: &str = "\
cache 0
workingset_refault_anon 0
workingset_refault_file 0
pgmajfault 0
inactive_file 0
total_cache 1048576
total_workingset_refault_anon 3
total_workingset_refault_file 4242
total_inactive_file 1048576
total_active_file 2097152
";

const V2_STAT: &str = "\
anon 4096
file 1048576
workingset_refault_anon 7
workingset_refault_file 900
workingset_activate_anon 1
workingset_activate_file 300
workingset_restore_anon 0
workingset_restore_file 12
workingset_nodereclaim 0
inactive_file 524288
active_file 262144
";

const V2_PRESSURE: &str = "\
some avg10=1.50 avg60=0.30 avg300=0.06 total=2500000
full avg10=0.75 avg60=0.15 avg300=0.03 total=1250000
";

fn texts(stat: &str, pressure: Option<&str>) -> StallTexts {
    StallTexts {
        stat: stat.to_owned(),
        pressure: pressure.map(str::to_owned),
    }
}

fn parsed(texts: &StallTexts, version: CgroupVersion) -> Result<MemoryStalls, StallsError> {
    parse(texts, version, 42, Path::new("/sys/fs/cgroup/pod1"))
}

#[test]
fn v1_has_hierarchical_refaults_and_nothing_else() {
    let stalls = parsed(&texts(V1_STAT, None), CgroupVersion::V1).unwrap();
    assert_eq!(
        stalls,
        MemoryStalls {
            read_at_ns: 42,
            workingset_refault_anon: Some(3),
            workingset_refault_file: Some(4242),
            file_bytes: Some(3 << 20),
            ..MemoryStalls::default()
        }
    );
}

#[test]
fn v2_has_refaults_activations_and_stall_totals() {
    let stalls = parsed(&texts(V2_STAT, Some(V2_PRESSURE)), CgroupVersion::V2).unwrap();
    assert_eq!(
        stalls,
        MemoryStalls {
            read_at_ns: 42,
            workingset_refault_anon: Some(7),
            workingset_refault_file: Some(900),
            workingset_activate_anon: Some(1),
            workingset_activate_file: Some(300),
            pressure_some_us: Some(2_500_000),
            pressure_full_us: Some(1_250_000),
            file_bytes: Some(786_432),
            ..MemoryStalls::default()
        }
    );
}

#[test]
fn a_kernel_without_the_counters_has_none_and_that_is_no_error() {
    // v1 before Linux 5.9 has no workingset lines at all.
    let stalls = parsed(&texts("total_inactive_file 0\n", None), CgroupVersion::V1).unwrap();
    assert_eq!(
        stalls,
        MemoryStalls {
            read_at_ns: 42,
            ..MemoryStalls::default()
        }
    );
}

#[test]
fn malformed_counters_are_errors_naming_the_file() {
    let cases = [
        (
            texts("total_workingset_refault_file -1\n", None),
            "memory.stat",
        ),
        (
            texts("total_workingset_refault_anon\n", None),
            "memory.stat",
        ),
        (texts(V2_STAT, Some("")), "memory.pressure"),
        (
            texts(V2_STAT, Some("some avg10=0.00 total=1\n")),
            "memory.pressure",
        ),
        (
            texts(V2_STAT, Some("some avg10=0.00\nfull total=1\n")),
            "memory.pressure",
        ),
        (
            texts(V2_STAT, Some("some total=x\nfull total=1\n")),
            "memory.pressure",
        ),
        (texts(V2_STAT, Some("\u{0}\u{1}garbage")), "memory.pressure"),
    ];
    for (texts, file) in cases {
        let version = match texts.pressure {
            Some(_) => CgroupVersion::V2,
            None => CgroupVersion::V1,
        };
        match parsed(&texts, version) {
            Err(StallsError::Malformed { path, .. }) => {
                assert_eq!(
                    path,
                    Path::new("/sys/fs/cgroup/pod1").join(file),
                    "{texts:?}"
                );
            }
            other => panic!("{texts:?}: {other:?}"),
        }
    }
}

fn cgroupfs(root: &Path, version: CgroupVersion) -> CgroupFs {
    CgroupFs::memory_only(version, root)
}

#[test]
fn missing_files_are_typed_errors_and_v2_without_psi_has_no_stall_totals() {
    let dir = tempfile::tempdir().unwrap();
    let v2 = cgroupfs(dir.path(), CgroupVersion::V2);
    // No cgroup at all: gone, as a pod removed while it is read.
    assert!(matches!(v2.stall_texts("/pod1"), Err(CgroupError::Gone(_))));
    // A kernel booted with psi=0 has no memory.pressure.
    let pod = dir.path().join("pod1");
    std::fs::create_dir(&pod).unwrap();
    std::fs::write(pod.join("memory.stat"), V2_STAT).unwrap();
    assert_eq!(v2.stall_texts("/pod1").unwrap(), texts(V2_STAT, None));
    // A memory.pressure longer than PSI's two lines is refused unread.
    std::fs::write(pod.join("memory.pressure"), "some total=1\n".repeat(100)).unwrap();
    assert!(matches!(
        v2.stall_texts("/pod1"),
        Err(CgroupError::Io { path, .. }) if path.ends_with("memory.pressure")
    ));
    std::fs::write(pod.join("memory.pressure"), V2_PRESSURE).unwrap();
    assert_eq!(
        v2.stall_texts("/pod1").unwrap(),
        texts(V2_STAT, Some(V2_PRESSURE))
    );
    // Kept open, as a listed pod's files are.
    let open = v2.open_memory("/pod1");
    assert!(open.is_err(), "no memory.current: {open:?}");
    std::fs::write(pod.join("memory.current"), "4096\n").unwrap();
    let open = v2.open_memory("/pod1").unwrap().unwrap();
    assert_eq!(
        open.stall_texts().unwrap(),
        texts(V2_STAT, Some(V2_PRESSURE))
    );
    // v1 reads no pressure file, whatever is there.
    let v1 = cgroupfs(dir.path(), CgroupVersion::V1);
    assert_eq!(v1.stall_texts("/pod1").unwrap(), texts(V2_STAT, None));
}

fn reading(refault_file: u64, some_us: Option<u64>) -> MemoryStalls {
    MemoryStalls {
        read_at_ns: 1,
        workingset_refault_anon: Some(0),
        workingset_refault_file: Some(refault_file),
        pressure_some_us: some_us,
        pressure_full_us: some_us.map(|us| us / 2),
        ..MemoryStalls::default()
    }
}

fn labels(namespace: &str, pod: &str) -> PodLabels {
    [namespace.to_owned(), pod.to_owned()]
}

/// The `evictd_pod_memory_*` lines of the metrics page.
fn pod_series(metrics: &Metrics) -> Vec<String> {
    metrics
        .render()
        .lines()
        .filter(|line| line.starts_with("evictd_pod_memory_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn series_follow_the_kernel_totals_and_go_with_their_pod() {
    let metrics = Metrics::new().unwrap();
    let mut stalls = PodStalls::default();
    assert!(stalls.due(0));
    stalls.record(
        vec![
            (
                "/kubepods/poda".into(),
                labels("ns", "a"),
                reading(10, Some(1_500_000)),
            ),
            ("/kubepods/podb".into(), labels("ns", "b"), reading(0, None)),
        ],
        0,
        Some(&metrics),
    );
    assert!(!stalls.due(STALLS_INTERVAL.as_nanos() as u64 - 1));
    assert!(stalls.due(STALLS_INTERVAL.as_nanos() as u64));
    assert_eq!(
        stalls.get("/kubepods/poda"),
        Some(reading(10, Some(1_500_000)))
    );
    let series = pod_series(&metrics);
    for expected in [
        r#"evictd_pod_memory_refaults_total{kind="file",namespace="ns",pod="a"} 10"#,
        r#"evictd_pod_memory_refaults_total{kind="file",namespace="ns",pod="b"} 0"#,
        r#"evictd_pod_memory_stall_seconds_total{kind="some",namespace="ns",pod="a"} 1.5"#,
        r#"evictd_pod_memory_stall_seconds_total{kind="full",namespace="ns",pod="a"} 0.75"#,
    ] {
        assert!(
            series.iter().any(|line| line == expected),
            "{expected} in {series:#?}"
        );
    }
    // No activations kept (v1): no series; b has no PSI: no stall series.
    assert!(
        !series.iter().any(|line| line.contains("activations")),
        "{series:#?}"
    );
    assert!(
        !series
            .iter()
            .any(|line| line.contains("stall") && line.contains("pod=\"b\""))
    );

    // a goes; b is made again under the same name (its counters start
    // over); c, found without metadata first, is then named.
    stalls.record(
        vec![
            (
                "/kubepods/podb2".into(),
                labels("ns", "b"),
                reading(5, None),
            ),
            (
                "/kubepods/podc".into(),
                labels("", "podc"),
                reading(1, None),
            ),
        ],
        10,
        Some(&metrics),
    );
    stalls.record(
        vec![
            (
                "/kubepods/podb2".into(),
                labels("ns", "b"),
                reading(3, None),
            ),
            ("/kubepods/podc".into(), labels("ns", "c"), reading(2, None)),
        ],
        20,
        Some(&metrics),
    );
    let series = pod_series(&metrics);
    assert!(stalls.get("/kubepods/poda").is_none());
    assert!(
        !series.iter().any(|line| line.contains("pod=\"a\"")),
        "{series:#?}"
    );
    assert!(
        !series.iter().any(|line| line.contains("pod=\"podc\"")),
        "{series:#?}"
    );
    assert!(
        series.iter().any(|line| line
            == r#"evictd_pod_memory_refaults_total{kind="file",namespace="ns",pod="b"} 3"#),
        "{series:#?}"
    );
    assert!(
        series.iter().any(|line| line
            == r#"evictd_pod_memory_refaults_total{kind="file",namespace="ns",pod="c"} 2"#),
        "{series:#?}"
    );

    // Churn leaves nothing behind: 1,000 pods come and go, one at a time.
    for n in 0..1000 {
        stalls.record(
            vec![(
                format!("/kubepods/pod{n}"),
                labels("churn", &n.to_string()),
                reading(n, Some(n)),
            )],
            30 + n,
            Some(&metrics),
        );
    }
    stalls.record(Vec::new(), 2000, Some(&metrics));
    assert_eq!(pod_series(&metrics), Vec::<String>::new());
}

/// Pod a at its limit, b without one, both having refaulted `refaults`
/// file pages of their 1000 by `at_ns`.
fn read_two_pods(
    stalls: &mut PodStalls,
    metrics: &Metrics,
    at_ns: u64,
    refaults: u64,
) -> Vec<(String, Thrashing)> {
    let page = page_size();
    let at_limit = MemoryStalls {
        read_at_ns: at_ns,
        workingset_refault_file: Some(refaults),
        file_bytes: Some(1000 * page),
        usage_bytes: Some(1024 * page),
        limit_bytes: Some(1024 * page),
        limit_hits: Some(at_ns),
        ..MemoryStalls::default()
    };
    let unlimited = MemoryStalls {
        limit_bytes: None,
        ..at_limit
    };
    stalls.record(
        vec![
            ("/kubepods/poda".into(), labels("ns", "a"), at_limit),
            ("/kubepods/podb".into(), labels("ns", "b"), unlimited),
        ],
        at_ns,
        Some(metrics),
    )
}

#[test]
fn thrashing_is_judged_between_two_readings_and_its_gauge_follows_the_pod() {
    let metrics = Metrics::new().unwrap();
    let mut stalls = PodStalls::default();
    let second = 1_000_000_000;
    assert!(
        read_two_pods(&mut stalls, &metrics, 0, 0).is_empty(),
        "one reading is no window"
    );
    let found = read_two_pods(&mut stalls, &metrics, 10 * second, 1000);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "/kubepods/poda");
    assert_eq!(found[0].1.refaulted_percent, 100);
    let thrashing = |series: &[String]| -> Vec<String> {
        series
            .iter()
            .filter(|line| line.starts_with("evictd_pod_memory_thrashing"))
            .cloned()
            .collect()
    };
    assert_eq!(
        thrashing(&pod_series(&metrics)),
        [r#"evictd_pod_memory_thrashing{namespace="ns",pod="a"} 1"#],
        "b has no limit: no series"
    );
    // Half its file pages refaulted in the next window: below lmkd's 100 %.
    assert!(read_two_pods(&mut stalls, &metrics, 20 * second, 1500).is_empty());
    assert_eq!(
        thrashing(&pod_series(&metrics)),
        [r#"evictd_pod_memory_thrashing{namespace="ns",pod="a"} 0"#]
    );
    // Gone, with its series.
    stalls.record(Vec::new(), 30 * second, Some(&metrics));
    assert!(thrashing(&pod_series(&metrics)).is_empty());
}
