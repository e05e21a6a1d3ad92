//! `cargo xtask bench`: evictd's event mode against polling (10s, 1s,
//! 100ms), a PSI trigger and cgroup v1 memcg thresholds, all real agent
//! modes, on one sandbox node, one workload, one run. Modes alternate
//! within each round so machine noise hits them alike.
//!
//! Ground truth comes from outside the agent: the bomb logs CLOCK_MONOTONIC
//! times of what it has touched (every 256 KiB), so the crossing is known to
//! within one such step; on cgroup v1 a memcg eventfd threshold at the same
//! level, armed by this program, cross-checks it from the kernel. The agent
//! logs its decision, kill and memory-back times on the same clock.
//!
//! Writes `bench.json` (every run) and `bench.md` (the table) to --out;
//! xtask draws `bench.png` from the JSON.
use std::{
    fmt, fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use evictd::{
    config::{parse_bytes, parse_period},
    kernel::notify::MemcgThresholds,
    node::cgroupfs::{CgroupFs, CgroupVersion},
};
use evictd_integration::{
    Agent, AgentLog, BpfStatsEnabled, Controller, STEADY_POD_MEMORY, SandboxNode, http_get,
    memory_pods, program_stats, wait_until,
};
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;
/// The pod that explodes; kubelet's ranking puts it first (BestEffort,
/// priority 0, largest usage over its request).
const BOMB: &str = "hog";
const EXPECTED_VICTIM: &str = "default/hog";
/// How long a bomb may run before the run is abandoned.
const RUN_DEADLINE: Duration = Duration::from_secs(60);
const REFUSED_FORK: u64 = 1 << 63;

#[derive(Debug, Parser)]
#[command(about = "evictd's event mode against polling, PSI and memcg thresholds")]
struct Args {
    /// The evictd binary.
    #[arg(long)]
    evictd: PathBuf,
    /// The evictd-workload binary.
    #[arg(long)]
    workload: PathBuf,
    /// Where bench.json and bench.md go.
    #[arg(long)]
    out: PathBuf,
    /// Rounds; each runs every mode once per scenario.
    #[arg(long, default_value_t = 10)]
    runs: u32,
    /// The sandbox node's memory capacity.
    #[arg(long, default_value = "2Gi", value_parser = parse_bytes)]
    capacity: u64,
    /// The hard threshold: memory.available below this.
    #[arg(long, default_value = "256Mi", value_parser = parse_bytes)]
    threshold: u64,
    /// Bomb allocation rates (bytes per second; `max`: as fast as it can).
    #[arg(long, value_delimiter = ',', default_value = "256Mi,1Gi,max")]
    rates: Vec<String>,
    /// Modes compared.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "event,poll-10s,poll-1s,poll-100ms,psi,memcg-threshold"
    )]
    modes: Vec<String>,
    /// The node's task limit in the fork-bomb scenario (0: no such scenario).
    #[arg(long, default_value_t = 1024)]
    pid_limit: u64,
    /// The fork-bomb scenario's threshold: pid.available below this.
    #[arg(long, default_value_t = 128)]
    pid_threshold: u64,
    /// How long each mode's agent idles on the node for the overhead numbers.
    #[arg(long, default_value = "10s", value_parser = parse_period)]
    idle: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    /// Bytes per second; 0: as fast as the bomb can.
    Memory {
        rate: u64,
    },
    ForkBomb,
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory { rate: 0 } => f.write_str("memory, max rate"),
            Self::Memory { rate } => write!(f, "memory, {} MiB/s", rate / MIB),
            Self::ForkBomb => f.write_str("fork bomb"),
        }
    }
}

/// One agent mode, as its command-line arguments.
fn mode_args(mode: &str) -> Result<Vec<String>> {
    Ok(match mode {
        "event" => vec!["--mode".into(), "event".into()],
        "psi" => vec!["--mode".into(), "psi".into()],
        "memcg-threshold" => vec!["--mode".into(), "memcg-threshold".into()],
        _ => match mode.strip_prefix("poll-") {
            Some(period) => vec![
                "--mode".into(),
                "poll".into(),
                "--housekeeping-interval".into(),
                period.into(),
            ],
            None => bail!("unknown mode {mode:?}"),
        },
    })
}

/// Modes that watch memory only; in the fork-bomb scenario they are the
/// polling they fall back to, so they are not run there.
fn memory_only(mode: &str) -> bool {
    matches!(mode, "psi" | "memcg-threshold")
}

fn main() -> std::process::ExitCode {
    match bench(&Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("evictd-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn bench(args: &Args) -> Result<()> {
    // SAFETY: single-threaded here; Agent::start reads it in this thread.
    unsafe { std::env::set_var("EVICTD_BIN", &args.evictd) };
    fs::create_dir_all(&args.out)?;
    let cgroupfs = CgroupFs::discover().context("finding the cgroup hierarchies")?;
    let modes: Vec<String> = args
        .modes
        .iter()
        .filter(|mode| {
            let usable =
                mode.as_str() != "memcg-threshold" || cgroupfs.version == CgroupVersion::V1;
            if !usable {
                println!("skipping memcg-threshold: memory thresholds exist on cgroup v1 only");
            }
            usable
        })
        .cloned()
        .collect();
    for mode in &modes {
        mode_args(mode)?;
    }
    let mut scenarios: Vec<Scenario> = args
        .rates
        .iter()
        .map(|rate| match rate.as_str() {
            "max" => Ok(Scenario::Memory { rate: 0 }),
            other => Ok(Scenario::Memory {
                rate: parse_bytes(other).map_err(|e| anyhow::anyhow!("rate {other:?}: {e}"))?,
            }),
        })
        .collect::<Result<_>>()?;
    if args.pid_limit > 0 {
        scenarios.push(Scenario::ForkBomb);
    }
    let _stats = BpfStatsEnabled::new().context("turning on kernel.bpf_stats_enabled")?;

    println!(
        "idle overhead: each mode's agent on the quiet node for {:?}",
        args.idle
    );
    let mut idle = serde_json::Map::new();
    for mode in &modes {
        let measured = idle_overhead(args, mode)?;
        println!(
            "  {mode:<16} CPU {:.3}% of a core, RSS {:.1} MiB (peak {:.1} MiB)",
            measured.cpu_percent,
            measured.rss_bytes as f64 / MIB as f64,
            measured.peak_rss_bytes as f64 / MIB as f64
        );
        idle.insert(mode.clone(), serde_json::to_value(&measured)?);
    }

    let plan: Vec<(u32, Scenario, String)> = (0..args.runs)
        .flat_map(|round| {
            let modes = &modes;
            scenarios.iter().flat_map(move |scenario| {
                // Rotate the order each round so no mode always runs first.
                let shift = round as usize % modes.len();
                modes
                    .iter()
                    .cycle()
                    .skip(shift)
                    .take(modes.len())
                    .filter(|mode| *scenario != Scenario::ForkBomb || !memory_only(mode))
                    .map(move |mode| (round, *scenario, mode.clone()))
            })
        })
        .collect();
    let mut runs = Vec::new();
    let started = Instant::now();
    for (done, (round, scenario, mode)) in plan.iter().enumerate() {
        let run = match scenario {
            Scenario::Memory { rate } => memory_run(args, mode, *rate),
            Scenario::ForkBomb => fork_bomb_run(args, mode),
        }
        .with_context(|| format!("{scenario}, {mode}, round {round}"))?;
        println!(
            "[{:>3}/{}] {:>5.0}s  {scenario:<20} {mode:<16} {}",
            done + 1,
            plan.len(),
            started.elapsed().as_secs_f64(),
            run.summary()
        );
        runs.push(json!({
            "round": round, "scenario": scenario.to_string(), "mode": mode,
            "run": serde_json::to_value(&run)?,
        }));
    }

    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let results = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "kernel": kernel.trim(),
        "cgroup": format!("{:?}", cgroupfs.version),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "capacity_bytes": args.capacity,
        "threshold_bytes": args.threshold,
        "pid_limit": args.pid_limit,
        "pid_threshold": args.pid_threshold,
        "modes": modes,
        "scenarios": scenarios.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "idle": idle,
        "runs": runs,
    });
    let json_path = args.out.join("bench.json");
    fs::write(&json_path, serde_json::to_string_pretty(&results)?)?;
    let table = table(&results);
    fs::write(args.out.join("bench.md"), &table)?;
    println!("\n{table}");
    println!("results: {}", json_path.display());
    Ok(())
}

/// CPU and memory of an agent with nothing to do.
#[derive(Debug, serde::Serialize)]
struct Idle {
    cpu_percent: f64,
    /// Resident now, after startup's transient BTF parsing was freed.
    rss_bytes: u64,
    peak_rss_bytes: u64,
    seconds: f64,
}

fn idle_overhead(args: &Args, mode: &str) -> Result<Idle> {
    let mut node = sandbox(args)?;
    let agent = start_agent(&node, mode, &format!("memory.available<{}", args.threshold))?;
    let before = cpu_time(agent.pid())?;
    let window = Instant::now();
    // The measurement is the waiting: nothing happens on the node.
    std::thread::sleep(args.idle);
    let cpu = cpu_time(agent.pid())?.saturating_sub(before);
    let seconds = window.elapsed().as_secs_f64();
    let rss_bytes = status_bytes(agent.pid(), "VmRSS")?;
    let peak_rss_bytes = status_bytes(agent.pid(), "VmHWM")?;
    if !node.alive(BOMB) {
        bail!("the idle node lost a pod");
    }
    stop(agent)?;
    Ok(Idle {
        cpu_percent: cpu.as_secs_f64() / seconds * 100.0,
        rss_bytes,
        peak_rss_bytes,
        seconds,
    })
}

/// What one run measured; times are from the ground-truth crossing.
#[derive(Debug, Default, serde::Serialize)]
struct Run {
    /// When the node really crossed the threshold: the first page-counter
    /// reading past it in the bomb's log (CLOCK_MONOTONIC).
    crossed_ns: Option<u64>,
    /// The kernel-side observer's notification (v1 eventfd), relative to
    /// the crossing.
    observer_us: Option<f64>,
    /// Where the bomb's own byte count alone would put the crossing.
    held_estimate_us: Option<f64>,
    /// What woke the agent's deciding run (the kernel record's timestamp,
    /// the timer tick, the notification), relative to the crossing.
    noticed_us: Option<f64>,
    /// The agent's decision, relative to the crossing.
    decided_us: Option<f64>,
    /// The kill complete (victim's cgroup empty).
    killed_us: Option<f64>,
    /// The victim's memory (or tasks) back.
    back_us: Option<f64>,
    trigger: Option<String>,
    /// Pods the agent killed.
    victims: Vec<String>,
    /// Kernel OOM kills in the node (memory) or forks refused at pids.max.
    kernel_kills: u64,
    /// Pods other than the bomb that did not survive.
    lost_pods: Vec<String>,
    agent_cpu_ms: f64,
    agent_peak_rss_bytes: u64,
    /// `(program, runs, ns)` of the agent's BPF programs over its life.
    bpf: Vec<(String, u64, u64)>,
}

impl Run {
    fn wrong_victim(&self) -> bool {
        self.victims.iter().any(|v| v != EXPECTED_VICTIM) || !self.lost_pods.is_empty()
    }

    fn summary(&self) -> String {
        let at = |us: Option<f64>| us.map_or("-".to_owned(), |us| format!("{:.2} ms", us / 1e3));
        let mut text = format!(
            "decided {} ({}), killed {}",
            at(self.decided_us),
            self.trigger.as_deref().unwrap_or("no decision"),
            at(self.killed_us)
        );
        if self.kernel_kills > 0 {
            text += &format!(", KERNEL WON ({})", self.kernel_kills);
        }
        if self.wrong_victim() {
            text += &format!(
                ", WRONG VICTIM {:?} lost {:?}",
                self.victims, self.lost_pods
            );
        }
        text
    }
}

fn sandbox(args: &Args) -> Result<SandboxNode> {
    let mut node = SandboxNode::new(
        memory_pods(),
        args.capacity,
        &args.workload.display().to_string(),
    )
    .context("building the sandbox node")?;
    node.alloc(&STEADY_POD_MEMORY)?;
    Ok(node)
}

fn start_agent(node: &SandboxNode, mode: &str, threshold: &str) -> Result<Agent> {
    let mut agent_args = node.agent_args();
    agent_args.extend(mode_args(mode)?);
    agent_args.extend(["--eviction-hard".into(), threshold.into()]);
    let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
    let mut agent = Agent::start(&agent_args)?;
    agent.log.expect("protection armed", &[]);
    Ok(agent)
}

fn memory_run(args: &Args, mode: &str, rate: u64) -> Result<Run> {
    let capacity: u64 = args.capacity;
    let threshold: u64 = args.threshold;
    let mut node = sandbox(args)?;
    let agent = start_agent(&node, mode, &format!("memory.available<{}", args.threshold))?;
    let cgroupfs = CgroupFs::discover()?;
    let node_cgroup = node.node_cgroup();
    let baseline = cgroupfs.read_memory(&node_cgroup)?;
    // available < threshold once the working set passes capacity - threshold.
    let needed = (capacity - threshold).saturating_sub(baseline.working_set_bytes());
    let observer = (cgroupfs.version == CgroupVersion::V1)
        .then(|| {
            Observer::start(
                &cgroupfs.memory_dir(&node_cgroup),
                capacity - threshold + baseline.inactive_file_bytes,
            )
        })
        .transpose()?;
    let log = bomb_log(&node);
    let usage_file = cgroupfs
        .memory_dir(&node_cgroup)
        .join(match cgroupfs.version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        });
    node.workload(BOMB)?.command(&format!(
        "bomb {rate} {} {}",
        log.display(),
        usage_file.display()
    ))?;
    let (mut run, mut agent) = finish(&mut node, agent, Controller::Memory)?;
    let records = read_log(&log, 3)?;
    fs::remove_file(&log)?;
    // Ground truth: the node's page counter, read by the bomb right after
    // each 256 KiB it touched. The working set is usage less inactive file
    // pages, which the bomb (anonymous memory only) leaves as they were.
    let level = capacity - threshold + baseline.inactive_file_bytes;
    run.crossed_ns = records
        .iter()
        .find(|record| record[2] >= level)
        .map(|record| record[0]);
    if let Some(crossed) = run.crossed_ns {
        // Cross-checks: the bomb's own count (blind to the page tables and
        // kernel memory charged with its pages), and the kernel's eventfd.
        run.held_estimate_us = records
            .iter()
            .find(|record| record[1] >= needed)
            .map(|record| relative_us(record[0], crossed));
        run.observer_us = observer
            .and_then(|observer| observer.notified())
            .map(|ns| relative_us(ns, crossed));
    }
    fill_times(&mut run, &mut agent);
    Ok(run)
}

fn fork_bomb_run(args: &Args, mode: &str) -> Result<Run> {
    let mut node = sandbox(args)?;
    node.tree.set_pids_limit("node", args.pid_limit)?;
    let agent = start_agent(
        &node,
        mode,
        &format!("pid.available<{}", args.pid_threshold),
    )?;
    let baseline = node.tree.pids_current("node")?;
    // available < threshold once tasks pass limit - threshold.
    let needed = (args.pid_limit - args.pid_threshold + 1).saturating_sub(baseline);
    let log = bomb_log(&node);
    node.workload(BOMB)?
        .command(&format!("fork-bomb {}", log.display()))?;
    let (mut run, mut agent) = finish(&mut node, agent, Controller::Pids)?;
    let records = read_log(&log, 2)?;
    fs::remove_file(&log)?;
    run.crossed_ns = records
        .iter()
        .find(|record| record[1] & !REFUSED_FORK >= needed)
        .map(|record| record[0]);
    run.kernel_kills = records
        .iter()
        .filter(|record| record[1] & REFUSED_FORK != 0)
        .count() as u64;
    fill_times(&mut run, &mut agent);
    Ok(run)
}

fn bomb_log(node: &SandboxNode) -> PathBuf {
    std::env::temp_dir().join(format!("evictd-bench-{}.log", node.tree.name()))
}

/// Waits for the bomb to be stopped (by the agent or the kernel), then for
/// the agent to report its memory back; collects the outcome and stops the
/// agent.
fn finish(
    node: &mut SandboxNode,
    mut agent: Agent,
    resource: Controller,
) -> Result<(Run, AgentLog)> {
    let exited = node.workload(BOMB)?.wait_exit(RUN_DEADLINE)?;
    if exited.is_none() {
        bail!("the bomb was still running after {RUN_DEADLINE:?}");
    }
    let mut run = Run::default();
    if resource == Controller::Memory {
        run.kernel_kills = node.oom_kills()?;
    }
    if run.kernel_kills == 0 && resource == Controller::Memory {
        // Killed by the agent: wait for it to see the memory back.
        let _ = wait_until(Duration::from_secs(10), "memory back", || {
            !agent.log.all("memory back").is_empty() || !agent.log.all("eviction failed").is_empty()
        });
    }
    run.agent_cpu_ms = cpu_time(agent.pid())?.as_secs_f64() * 1e3;
    run.agent_peak_rss_bytes = status_bytes(agent.pid(), "VmHWM")?;
    // Logged before `protection armed`, which start_agent awaited.
    let address = agent.log.metrics_address();
    if let Ok(metrics) = http_get(&address, "/metrics") {
        run.bpf = program_stats(&metrics);
    }
    for (name, _) in STEADY_POD_MEMORY {
        if !node.alive(name) {
            run.lost_pods.push(name.to_owned());
        }
    }
    let log = stop(agent)?;
    Ok((run, log))
}

/// Decision, kill and memory-back times from the agent's log.
fn fill_times(run: &mut Run, log: &mut AgentLog) {
    let killed = log.all("pod killed");
    run.victims = killed
        .iter()
        .filter_map(|l| l["victim"].as_str().map(str::to_owned))
        .collect();
    let decided = log.all("eviction decided");
    run.trigger = decided
        .first()
        .and_then(|l| l["trigger"].as_str().map(str::to_owned));
    let Some(crossed) = run.crossed_ns else {
        return;
    };
    let at = |lines: &[Value]| {
        lines
            .first()
            .and_then(|l| l["at_ns"].as_u64())
            .map(|ns| relative_us(ns, crossed))
    };
    run.noticed_us = decided
        .first()
        .and_then(|l| l["trigger_at_ns"].as_u64())
        .map(|ns| relative_us(ns, crossed));
    run.decided_us = at(&decided);
    run.killed_us = at(&killed);
    run.back_us = at(&log.all("memory back"));
}

fn relative_us(ns: u64, crossed: u64) -> f64 {
    (ns as f64 - crossed as f64) / 1e3
}

fn stop(agent: Agent) -> Result<AgentLog> {
    let (status, log) = agent.stop()?;
    if !status.success() {
        bail!("the agent exited with {status}");
    }
    Ok(log)
}

/// A bomb's log: records of `width` little-endian u64s, the first
/// CLOCK_MONOTONIC ns.
fn read_log(path: &Path, width: usize) -> Result<Vec<Vec<u64>>> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(bytes
        .chunks_exact(8 * width)
        .map(|record| {
            record
                .chunks_exact(8)
                .map(|word| {
                    let mut value = [0u8; 8];
                    value.copy_from_slice(word);
                    u64::from_le_bytes(value)
                })
                .collect()
        })
        .collect())
}

/// CPU time of every thread of a process so far, in nanoseconds (the
/// scheduler's own count; /proc/pid/stat has only 10 ms ticks).
fn cpu_time(pid: u32) -> Result<Duration> {
    let mut nanos = 0;
    for thread in fs::read_dir(format!("/proc/{pid}/task"))? {
        let schedstat = fs::read_to_string(thread?.path().join("schedstat"))?;
        nanos += schedstat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .context("unreadable schedstat")?;
    }
    Ok(Duration::from_nanos(nanos))
}

/// A `/proc/pid/status` memory field (`VmRSS`, `VmHWM`), in bytes.
fn status_bytes(pid: u32, field: &str) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(kib * 1024)
}

/// A cgroup v1 memory threshold on the node, armed by the bench itself: the
/// kernel's own word on when usage crossed the level.
struct Observer {
    notified: std::sync::mpsc::Receiver<u64>,
}

impl Observer {
    fn start(memory_dir: &Path, level: u64) -> Result<Self> {
        let mut thresholds = MemcgThresholds::open(memory_dir)?;
        let (sender, notified) = std::sync::mpsc::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        // Registered here, so the level is armed before the bomb starts.
        runtime.block_on(async { thresholds.arm(&[level]) })?;
        std::thread::spawn(move || {
            runtime.block_on(async {
                // The first notification is the crossing upward.
                if let Ok(ns) = thresholds.wait().await {
                    let _ = sender.send(ns);
                }
            });
        });
        Ok(Self { notified })
    }

    /// The notification's time, if one came.
    fn notified(&self) -> Option<u64> {
        self.notified.try_recv().ok()
    }
}

/// The Markdown table: per scenario and mode, latency percentiles from the
/// crossing to the trigger that woke the deciding run (noticed), the
/// decision and the completed kill (a run without one counts as infinitely
/// late), how often the kernel won, wrong victims, and the agent's overhead.
fn table(results: &Value) -> String {
    let empty = Vec::new();
    let runs = results["runs"].as_array().unwrap_or(&empty);
    let mut text = String::new();
    text += "| scenario | mode | runs | noticed p50 / p90 / p99 (ms) | decided p50 / p90 / p99 (ms) | killed p50 / p90 / p99 (ms) | kernel won | wrong victim | agent CPU per run (ms) | peak RSS (MiB) |\n";
    text += "|---|---|---:|---|---|---|---:|---:|---:|---:|\n";
    for scenario in results["scenarios"].as_array().unwrap_or(&empty) {
        for mode in results["modes"].as_array().unwrap_or(&empty) {
            let these: Vec<&Value> = runs
                .iter()
                .filter(|r| r["scenario"] == *scenario && r["mode"] == *mode)
                .map(|r| &r["run"])
                .collect();
            if these.is_empty() {
                continue;
            }
            let latencies = |field: &str| {
                let values: Vec<Option<f64>> = these.iter().map(|r| r[field].as_f64()).collect();
                let p = |q| format_ms(percentile(&values, q));
                format!("{} / {} / {}", p(0.5), p(0.9), p(0.99))
            };
            let count = |what: &dyn Fn(&Value) -> bool| these.iter().filter(|r| what(r)).count();
            let kernel_won = count(&|r| r["kernel_kills"].as_u64().unwrap_or(0) > 0);
            let wrong = count(&|r| {
                r["lost_pods"].as_array().is_some_and(|l| !l.is_empty())
                    || r["victims"]
                        .as_array()
                        .is_some_and(|v| v.iter().any(|v| v != EXPECTED_VICTIM))
            });
            let mean = |field: &str| {
                these.iter().filter_map(|r| r[field].as_f64()).sum::<f64>() / these.len() as f64
            };
            let rss = these
                .iter()
                .filter_map(|r| r["agent_peak_rss_bytes"].as_f64())
                .fold(0.0, f64::max);
            text += &format!(
                "| {} | {} | {} | {} | {} | {} | {kernel_won}/{n} | {wrong}/{n} | {:.1} | {:.1} |\n",
                scenario.as_str().unwrap_or_default(),
                mode.as_str().unwrap_or_default(),
                these.len(),
                latencies("noticed_us"),
                latencies("decided_us"),
                latencies("killed_us"),
                mean("agent_cpu_ms"),
                rss / MIB as f64,
                n = these.len(),
            );
        }
    }
    text += "\nIdle agent, no pressure:\n\n| mode | CPU (% of a core) | RSS (MiB) | peak RSS (MiB) |\n|---|---:|---:|---:|\n";
    if let Some(idle) = results["idle"].as_object() {
        for (mode, measured) in idle {
            let mib = |field: &str| measured[field].as_f64().unwrap_or(f64::NAN) / MIB as f64;
            text += &format!(
                "| {mode} | {:.3} | {:.1} | {:.1} |\n",
                measured["cpu_percent"].as_f64().unwrap_or(f64::NAN),
                mib("rss_bytes"),
                mib("peak_rss_bytes"),
            );
        }
    }
    text += "\nBPF programs of event mode, over every event-mode run:\n\n| program | runs | ns per run |\n|---|---:|---:|\n";
    for (program, count, nanos) in bpf_totals(runs) {
        text += &format!(
            "| {program} | {count} | {:.1} |\n",
            nanos as f64 / count.max(1) as f64
        );
    }
    text
}

/// Per-program run counts and time summed over every run's agent.
fn bpf_totals(runs: &[Value]) -> Vec<(String, u64, u64)> {
    let mut totals: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for run in runs {
        for entry in run["run"]["bpf"].as_array().into_iter().flatten() {
            if let (Some(program), Some(count), Some(nanos)) =
                (entry[0].as_str(), entry[1].as_u64(), entry[2].as_u64())
            {
                let total = totals.entry(program.to_owned()).or_default();
                total.0 += count;
                total.1 += nanos;
            }
        }
    }
    totals
        .into_iter()
        .filter(|(_, (count, _))| *count > 0)
        .map(|(program, (count, nanos))| (program, count, nanos))
        .collect()
}

/// The `q` quantile (nearest rank) of `values`, a missing value ranking
/// above every other (`None` when the quantile falls on one).
fn percentile(values: &[Option<f64>], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(b),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn format_ms(us: Option<f64>) -> String {
    match us {
        Some(us) if us.abs() < 10_000.0 => format!("{:.2}", us / 1e3),
        Some(us) => format!("{:.0}", us / 1e3),
        None => "never".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_never_decided_counts_as_later_than_any() {
        let values = [Some(3.0), None, Some(1.0), Some(2.0)];
        assert_eq!(percentile(&values, 0.5), Some(2.0));
        assert_eq!(percentile(&values, 0.75), Some(3.0));
        assert_eq!(percentile(&values, 0.99), None);
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn each_mode_is_the_agent_with_its_own_flags() {
        assert_eq!(
            mode_args("poll-100ms").unwrap(),
            ["--mode", "poll", "--housekeeping-interval", "100ms"]
        );
        assert_eq!(mode_args("psi").unwrap(), ["--mode", "psi"]);
        assert!(mode_args("kprobe").is_err());
    }
}
