//! The `evictd` binary as a user runs it: a watched cgroup, a workload that
//! crosses and hovers at the threshold, the log lines, the metrics endpoint,
//! and a clean stop that leaves no program behind.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers: a failed step is a failed test"
)]

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use evictd_integration::{PrivateCgroupTree, Workload, wait_until};
use serde_json::Value;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_evictd-workload");
const MIB: u64 = 1 << 20;
const DEADLINE: Duration = Duration::from_secs(20);

/// The agent binary: $EVICTD_BIN, or `evictd` in the target directory this
/// test was built into (`cargo xtask test` builds it first).
fn agent_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("EVICTD_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let binary = profile_dir.join("evictd");
    assert!(
        binary.exists(),
        "{} not built: run `cargo build -p evictd` (cargo xtask test does)",
        binary.display()
    );
    binary
}

/// Log lines of the agent, parsed from its JSON output.
struct Log {
    lines: mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

impl Log {
    fn expect(&mut self, message: &str, fields: &[(&str, &str)]) -> Value {
        let matches = |line: &Value| {
            line["message"] == message && fields.iter().all(|(k, v)| line[*k].as_str() == Some(*v))
        };
        let started = Instant::now();
        loop {
            if let Some(line) = self.seen.iter().find(|l| matches(l)) {
                return line.clone();
            }
            let left = DEADLINE.saturating_sub(started.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no log line {message:?} {fields:?}; saw {:#?}", self.seen),
            }
        }
    }

    fn count(&mut self, message: &str, field: &str, value: &str) -> usize {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        self.seen
            .iter()
            .filter(|l| l["message"] == message && l[field] == value)
            .count()
    }
}

/// Starts the agent with JSON logs, metrics on a free port and `args`.
fn start_agent(args: &[&str]) -> (std::process::Child, Log, std::thread::JoinHandle<()>) {
    let mut agent = Command::new(agent_binary())
        .args(["--log-format", "json", "--metrics-address", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = agent.stdout.take().unwrap();
    let (log, reader) = read_log(stdout);
    (agent, log, reader)
}

/// Parses the agent's JSON log lines on a thread.
fn read_log(stdout: std::process::ChildStdout) -> (Log, std::thread::JoinHandle<()>) {
    let (sender, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(value) = serde_json::from_str::<Value>(&line) {
                let _ = sender.send(value);
            }
        }
    });
    let log = Log {
        lines,
        seen: Vec::new(),
    };
    (log, reader)
}

fn stop(mut agent: std::process::Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut status = None;
    wait_until(DEADLINE, "the agent to exit", || {
        status = agent.try_wait().unwrap();
        status.is_some()
    })
    .unwrap();
    status.unwrap()
}

fn http_get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: evictd\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn agent_reports_one_crossing_each_way_for_a_hovering_workload_and_detaches_on_sigterm() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let scope = tree.relative_path("pod");
    let (agent, mut log, reader) = start_agent(&[
        "--watch-memory",
        &format!("{scope}=64Mi"),
        "--memory-hysteresis",
        "16Mi",
    ]);
    let attached = log.expect("eBPF programs attached", &[]);
    let program_ids: Vec<u32> = attached["programs"]
        .as_str()
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    assert_eq!(program_ids.len(), 7, "{attached}");
    let address = log.expect("serving /metrics and /healthz", &[])["address"]
        .as_str()
        .unwrap()
        .to_owned();
    log.expect("watching scope", &[("scope", &scope), ("trigger", "bpf")]);

    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(62 * MIB).unwrap();
    for _ in 0..10 {
        workload.alloc(4 * MIB).unwrap();
        workload.free(4 * MIB).unwrap();
    }
    let above = log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "above"),
            ("source", "kernel"),
        ],
    );
    assert_eq!(above["threshold"], 64 * MIB);
    assert!(above["value"].as_u64().unwrap() >= 64 * MIB);
    assert!(above["latency_us"].as_u64().is_some());
    workload.free(30 * MIB).unwrap();
    log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "below"),
            ("source", "kernel"),
        ],
    );
    assert_eq!(log.count("threshold crossed", "direction", "above"), 1);
    assert_eq!(log.count("threshold crossed", "direction", "below"), 1);

    let metrics = http_get(&address, "/metrics");
    assert!(
        metrics.contains(
            "evictd_threshold_crossings_total{direction=\"above\",resource=\"memory\",source=\"kernel\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("evictd_trigger_info{resource=\"memory\",trigger=\"bpf\"} 1"));
    assert!(metrics.contains("evictd_event_latency_seconds_count"));

    let status = stop(agent);
    assert!(status.success(), "{status:?}");
    log.expect("all eBPF programs detached", &[]);
    reader.join().unwrap();
    // The kernel frees a program once its last reference (link, fd) is
    // gone, after an RCU grace period: wait for that, bounded.
    let still_loaded = || -> Vec<u32> {
        aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .map(|p| p.id())
            .filter(|id| program_ids.contains(id))
            .collect()
    };
    let freed = wait_until(DEADLINE, "the agent's programs to be freed", || {
        still_loaded().is_empty()
    });
    assert!(freed.is_ok(), "programs left loaded: {:?}", still_loaded());
}

#[test]
#[ignore = "needs root and a BPF-capable kernel: run with cargo xtask test"]
fn a_cgroup_created_after_start_is_watched_through_its_mkdir_event() {
    let tree = PrivateCgroupTree::new().unwrap();
    let pattern = format!("{}/*", tree.relative_path(""));
    let (agent, mut log, reader) = start_agent(&["--watch-memory", &format!("{pattern}=32Mi")]);
    log.expect("serving /metrics and /healthz", &[]);
    tree.create("late-pod").unwrap();
    let scope = tree.relative_path("late-pod");
    log.expect("watching scope", &[("scope", &scope), ("trigger", "bpf")]);
    let mut workload = Workload::spawn_in(&tree, "late-pod", WORKLOAD).unwrap();
    workload.alloc(48 * MIB).unwrap();
    log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "above"),
            ("source", "kernel"),
        ],
    );
    drop(workload);
    tree.remove("late-pod").unwrap();
    log.expect("scope removed", &[("scope", &scope)]);
    assert!(stop(agent).success());
    reader.join().unwrap();
}

#[test]
#[ignore = "needs root and cgroups: run with cargo xtask test"]
fn poll_mode_reports_crossings_from_cgroupfs() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let scope = tree.relative_path("pod");
    let (agent, mut log, reader) = start_agent(&[
        "--mode",
        "poll",
        "--housekeeping-interval",
        "100ms",
        "--watch-memory",
        &format!("{scope}=32Mi"),
    ]);
    log.expect("watching scope", &[("scope", &scope), ("trigger", "poll")]);
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(48 * MIB).unwrap();
    let above = log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "above"),
            ("source", "poll"),
        ],
    );
    assert!(above["value"].as_u64().unwrap() >= 32 * MIB);
    assert!(above["kernel_value"].is_null());
    assert_eq!(
        log.count(
            "eBPF programs attached",
            "message",
            "eBPF programs attached"
        ),
        0
    );
    assert!(stop(agent).success());
    reader.join().unwrap();
}

#[test]
#[ignore = "needs root (to drop privileges) and cgroups: run with cargo xtask test"]
fn without_privilege_to_load_bpf_the_agent_says_why_and_polls() {
    let tree = PrivateCgroupTree::new().unwrap();
    tree.create("pod").unwrap();
    let scope = tree.relative_path("pod");
    // setpriv (util-linux) runs the agent as nobody, which may not load BPF.
    let mut agent = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(agent_binary())
        .args(["--log-format", "json", "--metrics-address", "127.0.0.1:0"])
        .args(["--resync-interval", "100ms"])
        .args(["--watch-memory", &format!("{scope}=32Mi")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = agent.stdout.take().unwrap();
    let (mut log, reader) = read_log(stdout);
    let unavailable = log.expect(
        "eBPF programs unavailable: POLLING cgroupfs instead of kernel events",
        &[],
    );
    let error = unavailable["error"].as_str().unwrap();
    assert!(error.contains("loading BPF needs root"), "{error}");
    log.expect("watching scope", &[("scope", &scope), ("trigger", "poll")]);
    let mut workload = Workload::spawn_in(&tree, "pod", WORKLOAD).unwrap();
    workload.alloc(48 * MIB).unwrap();
    log.expect(
        "threshold crossed",
        &[
            ("scope", &scope),
            ("direction", "above"),
            ("source", "poll"),
        ],
    );
    assert!(stop(agent).success());
    reader.join().unwrap();
}
