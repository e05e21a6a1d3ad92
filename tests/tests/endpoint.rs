//! The metrics endpoint cannot hurt protection: while hundreds of slow
//! connections hammer /metrics (half of them trickle an endless header a
//! byte at a time, half send 128 KiB of header first; each is reopened as
//! soon as the agent drops it), the agent
//! still evicts a memory hog before the kernel's OOM killer fires, answers
//! a prompt client, keeps its connections at the cap, answers kubelet's
//! probes on their own port, and its resident memory stays within a few
//! MiB of what it was before the flood.
use std::{
    io::Write as _,
    net::TcpStream,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use evictd_integration::{SandboxNode, http_get, memory_pods, metric, wait_until};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// Slow connections the flood keeps open (or trying to be).
const SLOW_CONNECTIONS: usize = 400;
/// The endpoint's connection cap (EndpointLimits::default).
const MAX_CONNECTIONS: f64 = 16.0;
/// What the flood may add to the agent's resident memory: 16 slots of an
/// 8 KiB buffer and a task each, and the allocator's slack.
const RSS_GROWTH_BOUND: u64 = 16 * MIB;
/// What every other slow connection sends at once: an endpoint that buffers
/// whatever headers it is sent would hold this much per connection.
const LARGE_HEADER: usize = 128 * 1024;
/// The flood stops by itself after this long, whatever the test does.
const FLOOD_LIMIT: Duration = Duration::from_secs(120);

/// VmRSS of `pid`, bytes; None once it is gone.
fn resident(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())?;
    Some(kib * 1024)
}

/// Holds `SLOW_CONNECTIONS` half-sent requests open against `address`,
/// reopening each one the agent closes, until `stop` (or FLOOD_LIMIT).
/// Returns how many connections it opened in all.
fn flood(address: String, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let started = Instant::now();
        let mut held: Vec<Option<TcpStream>> = (0..SLOW_CONNECTIONS).map(|_| None).collect();
        let large = vec![b'a'; LARGE_HEADER];
        let mut opened = 0;
        while !stop.load(Ordering::Acquire) && started.elapsed() < FLOOD_LIMIT {
            for (index, slot) in held.iter_mut().enumerate() {
                // A connection the agent closed fails its next write.
                let alive = slot
                    .as_mut()
                    .is_some_and(|stream| stream.write_all(b"t").is_ok());
                if alive {
                    continue;
                }
                *slot = TcpStream::connect(&address).ok().map(|mut stream| {
                    // A peer that stops reading must not stall the flood.
                    let _ = stream.set_write_timeout(Some(Duration::from_millis(20)));
                    let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: evictd\r\nX-Slow: ");
                    if index % 2 == 0 {
                        let _ = stream.write_all(&large);
                    }
                    stream
                });
                opened += 1;
            }
            // One round of trickled bytes per 100 ms per connection.
            thread::sleep(Duration::from_millis(100));
        }
        opened
    })
}

#[test]
#[ignore = "needs root, cgroups and a BPF-capable kernel: run with cargo xtask test"]
fn a_slow_connection_flood_holds_up_no_eviction_and_no_memory() {
    let mut node = SandboxNode::new(memory_pods(), NODE_MEMORY, WORKLOAD).unwrap();
    node.alloc(&[("db", 48 * MIB), ("web", 32 * MIB), ("batch", 48 * MIB)])
        .unwrap();
    // The hooks attached for good: moving them near the line and at the
    // kill races a full-speed hog in the emulated guests (kubernetes.rs
    // says how); this test is about the endpoint, the zone has its own.
    let mut agent = node
        .start_agent(&[
            "--eviction-hard",
            "memory.available<96Mi",
            "--precise-hooks",
            "always",
        ])
        .unwrap();
    agent
        .log
        .expect("watching scope", &[("scope", &node.node_cgroup())]);
    let address = agent.log.metrics_address();
    let pid = agent.pid();
    let before = resident(pid).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let flooding = flood(address.clone(), stop.clone());
    // Resident memory and open connections, sampled through the flood.
    let peak = Arc::new(AtomicU64::new(before));
    let sampling = {
        let (stop, peak) = (stop.clone(), peak.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let Some(now) = resident(pid) else { break };
                peak.fetch_max(now, Ordering::AcqRel);
                thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // The flood is on: slow clients are being displaced.
    wait_until(
        Duration::from_secs(20),
        "the flood to fill the endpoint",
        || {
            let metrics = http_get(&address, "/metrics").unwrap_or_default();
            metric(
                &metrics,
                r#"evictd_http_connections_closed_total{reason="displaced"}"#,
            )
            .is_some_and(|displaced| displaced >= (SLOW_CONNECTIONS / 2) as f64)
        },
    )
    .unwrap();

    node.grow_until_stopped("hog", 16 * MIB, NODE_MEMORY)
        .unwrap();
    agent.log.expect_eviction("default/hog", "memory");
    agent
        .log
        .expect("memory back", &[("victim", "default/hog")]);
    for name in ["db", "web", "batch", "node-exporter"] {
        assert!(node.alive(name), "{name} was killed");
    }
    assert_eq!(node.oom_kills().unwrap(), 0, "the kernel OOM killer fired");

    // A prompt client is answered mid-flood, and the cap held.
    let health = http_get(&address, "/healthz").unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    // kubelet's probes have their own port, which the flood never reaches.
    let probes = agent.log.health_address();
    for path in ["/healthz", "/readyz"] {
        let answer = http_get(&probes, path).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }
    let metrics = http_get(&address, "/metrics").unwrap();
    let open = metric(&metrics, "evictd_http_connections").unwrap();
    assert!(open <= MAX_CONNECTIONS, "{open} connections open");

    stop.store(true, Ordering::Release);
    let opened = flooding.join().unwrap();
    sampling.join().unwrap();
    assert!(
        opened >= SLOW_CONNECTIONS as u64,
        "the flood opened only {opened}"
    );
    let growth = peak.load(Ordering::Acquire).saturating_sub(before);
    eprintln!(
        "{opened} slow connections opened; resident memory {before} bytes before, peak growth {growth} bytes"
    );
    assert!(
        growth < RSS_GROWTH_BOUND,
        "resident memory grew {growth} bytes under {opened} slow connections (from {before})"
    );
    let (status, _) = agent.stop().unwrap();
    assert!(status.success());
}
