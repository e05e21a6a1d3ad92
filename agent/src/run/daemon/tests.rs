//! The serve loop on fakes, with tokio's clock paused: what wakes the
//! engine, and how often it reads the node.
use evictd_common::{CrossingEvent, EVENT_CROSSING, RESOURCE_MEMORY};
use tokio::sync::mpsc;

use super::*;
use crate::{
    act::{evictor::CLOSE_WATCH_INTERVAL, wake::WakeCause},
    kernel::bpf::{Crossing, KernelEvent, Received, ScopeKind},
    node::cgroupfs::CgroupFs,
    testing::{
        LogCapture,
        fakes::{Fake, FakeKernel, Harness, HarnessOptions, MIB, NODE_CAPACITY, NODE_CGROUP, pod},
    },
};

/// Serves `harness` for `run_for` of (paused) time with `kernel` records,
/// the resync timer an hour away.
async fn serve_for(harness: &mut Harness, kernel: &mut FakeKernel, run_for: Duration) {
    let ready = AtomicBool::new(false);
    let sources = Sources::<FakeKernel> {
        kernel: Some(kernel),
        notifier: None,
        check_interval: Duration::from_secs(3600),
        timer_cause: WakeCause::Resync,
    };
    serve::<Fake>(
        &mut harness.evictor,
        sources,
        &ready,
        tokio::time::sleep(run_for),
    )
    .await
    .unwrap();
    assert!(ready.load(Ordering::Acquire), "ready after the first run");
}

/// A kernel record of the node memory scope crossing its band.
fn node_crossing(harness: &Harness) -> Received {
    let dir = harness
        ._dir
        .path()
        .join("memory")
        .join(NODE_CGROUP.trim_start_matches('/'));
    let id = CgroupFs::cgroup_id(&dir).unwrap();
    let now = harness.evictor.clock().now_ns();
    Received {
        event: KernelEvent::Crossing(Crossing {
            kind: ScopeKind::Memory,
            raw: CrossingEvent {
                kind: EVENT_CROSSING,
                resource: RESOURCE_MEMORY,
                timestamp_ns: now,
                scope_id: id,
                trigger_cgroup_id: id,
                value: NODE_CAPACITY,
                bound: NODE_CAPACITY - 100 * MIB,
                rising: 1,
                _pad: 0,
            },
        }),
        received_ns: now,
    }
}

#[tokio::test(start_paused = true)]
async fn the_close_watch_fires_while_usage_stays_past_the_band() {
    // Page cache keeps usage past capacity − 100Mi; the working set leaves
    // 150 MiB, so the threshold is not met: only a fresh look tells when.
    let mut harness = Harness::new(HarnessOptions {
        outside_pods: NODE_CAPACITY - 150 * MIB,
        ..HarnessOptions::default()
    });
    harness.node.0.borrow_mut().page_cache = 100 * MIB;
    let (_records, receiver) = mpsc::unbounded_channel();
    let mut kernel = FakeKernel(receiver);
    serve_for(
        &mut harness,
        &mut kernel,
        CLOSE_WATCH_INTERVAL * 5 + CLOSE_WATCH_INTERVAL / 2,
    )
    .await;
    assert_eq!(harness.engine_runs("startup"), 1);
    assert_eq!(harness.engine_runs("close-watch"), 5);

    // Once usage is back below the band, nothing wakes the engine.
    harness.node.0.borrow_mut().page_cache = 0;
    let (_records, receiver) = mpsc::unbounded_channel();
    let mut kernel = FakeKernel(receiver);
    serve_for(&mut harness, &mut kernel, CLOSE_WATCH_INTERVAL * 5).await;
    assert_eq!(harness.engine_runs("close-watch"), 5);
}

#[tokio::test(start_paused = true)]
async fn one_kernel_record_is_one_observation_of_the_node() {
    let mut harness = Harness::new(HarnessOptions {
        outside_pods: NODE_CAPACITY - 300 * MIB,
        ..HarnessOptions::default()
    });
    let (records, receiver) = mpsc::unbounded_channel();
    records.send(node_crossing(&harness)).unwrap();
    let mut kernel = FakeKernel(receiver);
    let (log, _guard) = LogCapture::start();
    serve_for(&mut harness, &mut kernel, Duration::from_millis(100)).await;
    assert_eq!(harness.engine_runs("kernel"), 1);
    // The fake cgroupfs has no memory files: a read by the monitor would
    // have warned.
    assert!(log.problems().is_empty(), "{:?}", log.problems());
    let model = harness.node.0.borrow();
    assert_eq!(
        model.observations, 2,
        "startup, then the kernel record: the engine scope is settled from that one read"
    );
    assert_eq!(model.listings, 0, "nothing starved: no pod is read");
}

#[tokio::test(start_paused = true)]
async fn a_failed_kill_does_not_wedge_the_loop() {
    let mut harness = Harness::new(HarnessOptions {
        pods: vec![pod("hog", 300)],
        outside_pods: NODE_CAPACITY - 350 * MIB,
        ..HarnessOptions::default()
    });
    *harness.killer.fail.borrow_mut() = true;
    let (records, receiver) = mpsc::unbounded_channel();
    let mut kernel = FakeKernel(receiver);
    serve_for(&mut harness, &mut kernel, Duration::from_secs(1)).await;
    assert_eq!(
        harness.killer.killed.borrow().len(),
        1,
        "backing off, not retried every close watch"
    );
    // The loop still serves records and, past the back-off, kills.
    *harness.killer.fail.borrow_mut() = false;
    tokio::time::advance(Duration::from_secs(10)).await;
    records.send(node_crossing(&harness)).unwrap();
    serve_for(&mut harness, &mut kernel, Duration::from_millis(100)).await;
    assert!(harness.node.0.borrow().pods.is_empty());
}
