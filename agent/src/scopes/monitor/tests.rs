//! The monitor shell on a cgroupfs laid out in a temporary directory, with
//! a fake band table.
use std::{fs, path::Path};

use evictd_common::{CrossingEvent, EVENT_CROSSING, RESOURCE_MEMORY};

use super::*;
use crate::{
    node::cgroupfs::CgroupVersion,
    testing::{LogCapture, fakes::FakeBands},
};

const MIB: u64 = 1 << 20;

fn write_memory(root: &Path, path: &str, usage: u64) {
    let dir = root.join("memory").join(path.trim_start_matches('/'));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("memory.current"), format!("{usage}\n")).unwrap();
    fs::write(dir.join("memory.stat"), "inactive_file 0\n").unwrap();
}

fn monitor(root: &Path, specs: Vec<WatchSpec>) -> Monitor<FakeBands> {
    let cgroupfs = CgroupFs::memory_only(CgroupVersion::V2, &root.join("memory"));
    Monitor::new(
        cgroupfs,
        specs,
        Some(FakeBands::default()),
        KernelCoverage {
            memory: true,
            pids: false,
            cgroup_lifecycle: true,
        },
        Metrics::new().unwrap(),
        MonitorOptions {
            memory_hysteresis: MIB,
            pids_hysteresis: 1,
        },
    )
}

fn crossing(root: &Path, path: &str, value: u64) -> Crossing {
    let id = CgroupFs::cgroup_id(&root.join("memory").join(path.trim_start_matches('/'))).unwrap();
    Crossing {
        kind: ScopeKind::Memory,
        raw: CrossingEvent {
            kind: EVENT_CROSSING,
            resource: RESOURCE_MEMORY,
            timestamp_ns: 1,
            scope_id: id,
            trigger_cgroup_id: id,
            value,
            bound: 0,
            rising: 1,
            _pad: 0,
        },
    }
}

#[test]
fn a_flag_scope_is_armed_reread_on_its_crossing_and_rearmed() {
    let dir = tempfile::tempdir().unwrap();
    write_memory(dir.path(), "/pod", 10 * MIB);
    let mut monitor = monitor(dir.path(), vec![WatchSpec::memory("/pod=64Mi").unwrap()]);
    monitor.install_all();
    let bands = monitor.bands.as_ref().unwrap();
    let band = *bands.bands.values().next().unwrap();
    assert_eq!((band.fall_below, band.rise_at), (0, 64 * MIB));

    write_memory(dir.path(), "/pod", 70 * MIB);
    let (log, _guard) = LogCapture::start();
    let wakes_engine = monitor.on_crossing(&crossing(dir.path(), "/pod", 65 * MIB), Duration::ZERO);
    assert!(!wakes_engine, "a --watch scope only reports");
    assert!(log.contains("threshold crossed"), "{:?}", log.lines());
    assert!(
        log.contains("value=73400320"),
        "re-read from cgroupfs: {:?}",
        log.lines()
    );
    let band = *monitor
        .bands
        .as_ref()
        .unwrap()
        .bands
        .values()
        .next()
        .unwrap();
    assert_eq!(
        (band.fall_below, band.rise_at),
        (63 * MIB, u64::MAX),
        "re-armed above"
    );
}

#[test]
fn an_engine_scope_crossing_waits_for_the_engines_reading() {
    let dir = tempfile::tempdir().unwrap();
    write_memory(dir.path(), "/node", 10 * MIB);
    let mut monitor = monitor(dir.path(), Vec::new());
    let scope = |value| EngineScope {
        kind: ScopeKind::Memory,
        path: Some("/node".into()),
        thresholds: vec![64 * MIB],
        reading: Reading {
            value,
            working_set: Some(value),
        },
        file_value: value,
    };
    assert!(!monitor.apply_engine(&[scope(10 * MIB)]));
    // The files go: the monitor must not read them for an engine scope.
    fs::remove_file(dir.path().join("memory/node/memory.current")).unwrap();
    let (log, _guard) = LogCapture::start();
    assert!(monitor.on_crossing(&crossing(dir.path(), "/node", 65 * MIB), Duration::ZERO));
    assert!(log.problems().is_empty(), "{:?}", log.problems());
    assert!(monitor.apply_engine(&[scope(66 * MIB)]), "raised");
    assert!(log.contains("source=\"kernel\""), "{:?}", log.lines());
    assert!(log.contains("kernel_value=68157440"), "{:?}", log.lines());

    // No threshold needs it any more: it goes, from the kernel too.
    let removed = EngineScope {
        thresholds: Vec::new(),
        ..scope(0)
    };
    assert!(!monitor.apply_engine(&[removed]));
    assert!(monitor.bands.as_ref().unwrap().bands.is_empty());
}

#[test]
fn a_scope_the_kernel_map_cannot_hold_is_polled_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    write_memory(dir.path(), "/pod", 10 * MIB);
    let mut monitor = monitor(dir.path(), vec![WatchSpec::memory("/pod=64Mi").unwrap()]);
    monitor.bands.as_mut().unwrap().full = true;
    let (log, _guard) = LogCapture::start();
    monitor.install_all();
    assert!(
        log.contains("trigger=\"poll\""),
        "watched, by polling: {:?}",
        log.lines()
    );
    write_memory(dir.path(), "/pod", 70 * MIB);
    monitor.resync(false);
    assert!(log.contains("threshold crossed"), "{:?}", log.lines());
}
