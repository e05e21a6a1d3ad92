//! Ring-buffer records as the agent reads them from the kernel programs:
//! any bytes, of any length, through [`decode`], and a decoded record
//! through what the agent does with it first: a cgroup's path matched
//! against the `--watch-*` patterns, an OOM victim logged and counted. Each
//! input is also tried as the body of every kind of record at exactly its
//! size, so that every kind's fields are fuzzed whatever the length.
use std::{sync::OnceLock, time::Duration};

use evictd::{
    kernel::bpf::{DecodeError, KernelEvent, decode},
    metrics::Metrics,
    report,
    scopes::spec::{Target, WatchSpec},
};
use evictd_common::{
    CGROUP_PATH_LEN, CgroupEvent, CrossingEvent, EVENT_CGROUP_MKDIR, EVENT_CGROUP_RMDIR,
    EVENT_CROSSING, EVENT_OOM_VICTIM, OomVictimEvent,
};

pub fn ring_buffer(data: &[u8]) {
    check(data);
    for (kind, size) in [
        (EVENT_CROSSING, size_of::<CrossingEvent>()),
        (EVENT_OOM_VICTIM, size_of::<OomVictimEvent>()),
        (EVENT_CGROUP_MKDIR, size_of::<CgroupEvent>()),
        (EVENT_CGROUP_RMDIR, size_of::<CgroupEvent>()),
    ] {
        let mut record = vec![0; size];
        record[..4].copy_from_slice(&kind.to_ne_bytes());
        let body = data.get(4..).unwrap_or_default();
        let len = body.len().min(size - 4);
        record[4..4 + len].copy_from_slice(&body[..len]);
        match decode(&record) {
            Ok(_) | Err(DecodeError::UnknownResource(_)) => check(&record),
            Err(e) => panic!("a whole record of kind {kind} does not decode: {e}"),
        }
    }
}

/// A record decodes to the fields at its C layout's offsets, or to an
/// error that says why; what the agent does first with it never fails.
fn check(bytes: &[u8]) {
    let event = match decode(bytes) {
        Ok(event) => event,
        Err(e) => {
            report::kernel_side::decode_error(metrics(), &e);
            return;
        }
    };
    let _ = (event.kind(), event.timestamp_ns());
    match &event {
        KernelEvent::Crossing(crossing) => {
            let raw = &crossing.raw;
            assert_eq!(
                encode(&[
                    &raw.kind.to_ne_bytes(),
                    &raw.resource.to_ne_bytes(),
                    &raw.timestamp_ns.to_ne_bytes(),
                    &raw.scope_id.to_ne_bytes(),
                    &raw.trigger_cgroup_id.to_ne_bytes(),
                    &raw.value.to_ne_bytes(),
                    &raw.bound.to_ne_bytes(),
                    &raw.rising.to_ne_bytes(),
                    &raw._pad.to_ne_bytes(),
                ]),
                bytes[..size_of::<CrossingEvent>()]
            );
            let _ = crossing.rising();
        }
        KernelEvent::OomVictim(victim) => {
            assert_eq!(
                encode(&[
                    &victim.kind.to_ne_bytes(),
                    &victim.pid.to_ne_bytes(),
                    &victim.timestamp_ns.to_ne_bytes(),
                    &victim.memory_cgroup_id.to_ne_bytes(),
                    &victim.rss_bytes.to_ne_bytes(),
                    &victim.comm,
                ]),
                bytes[..size_of::<OomVictimEvent>()]
            );
            report::kernel_side::oom_victim(metrics(), victim, Some("pod"), Duration::ZERO);
        }
        KernelEvent::CgroupCreated(change) | KernelEvent::CgroupRemoved(change) => {
            let raw = &change.0;
            assert_eq!(
                encode(&[
                    &raw.kind.to_ne_bytes(),
                    &raw.hierarchy_id.to_ne_bytes(),
                    &raw.timestamp_ns.to_ne_bytes(),
                    &raw.cgroup_id.to_ne_bytes(),
                    &raw.level.to_ne_bytes(),
                    &raw.path_len.to_ne_bytes(),
                    &raw.path,
                ]),
                bytes[..size_of::<CgroupEvent>()]
            );
            let (path, cut) = change.path();
            assert!(!path.contains('\0'), "{path:?}");
            // Every byte the kernel copied is at most one character.
            assert!(path.chars().count() <= CGROUP_PATH_LEN, "{path:?}");
            assert_eq!(cut, raw.path_len as usize >= CGROUP_PATH_LEN);
            if !cut {
                for spec in watches() {
                    if let Target::Cgroups(pattern) = &spec.target {
                        let _ = pattern.matches(&path);
                    }
                }
            }
        }
    }
}

fn encode(fields: &[&[u8]]) -> Vec<u8> {
    fields.concat()
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<std::sync::Arc<Metrics>> = OnceLock::new();
    METRICS.get_or_init(|| match Metrics::new() {
        Ok(metrics) => metrics,
        Err(e) => panic!("{e}"),
    })
}

/// Watch patterns as users write them, which a new cgroup's path is
/// matched against.
fn watches() -> &'static [WatchSpec] {
    static WATCHES: OnceLock<Vec<WatchSpec>> = OnceLock::new();
    WATCHES.get_or_init(|| {
        [
            WatchSpec::memory("/kubepods/*/*=512Mi,1Gi"),
            WatchSpec::memory("/kubepods.slice/*=1Gi"),
            WatchSpec::pids("/kubepods/burstable/*=100"),
            WatchSpec::pids("/system.slice/containerd.service=1000"),
        ]
        .into_iter()
        .map(|spec| match spec {
            Ok(spec) => spec,
            Err(e) => panic!("{e}"),
        })
        .collect()
    })
}
