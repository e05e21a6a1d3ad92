//! `cargo xtask bench`: what a user pays, with evictd's event mode against
//! polling (10s, 1s, 100ms), a PSI trigger and cgroup v1 memcg thresholds,
//! all real agent modes, and against floors measured in the same run:
//!
//! - memory bombs (256 MiB/s, 1 GiB/s, as fast as they go): from the node's
//!   real threshold crossing to the agent's decision and to the memory
//!   back; the *oracle* row is no agent at all, the bench killing the bomb
//!   at the crossing itself (`oracle.rs`): the kernel's floor;
//! - a fork bomb against `pid.available`, alone and beside a pod with more
//!   processes that forks nothing, under kubelet's PID ranking and
//!   `--pid-ranking fork-rate`;
//! - decision latency with 10, 100 and 250 pods on the node;
//! - workload overhead: page faults, munmap and the SIGKILL of a large
//!   process with each mode's agent attached against no agent, far from
//!   every threshold and close to one (`overhead.rs`).
//!
//! Each round runs every mode once in every scenario, the modes in an order
//! rotated by the round, so machine noise hits them alike; every run starts
//! a fresh sandbox node and a fresh agent.
//!
//! Ground truth comes from outside the agent: the bomb logs CLOCK_MONOTONIC
//! times of what it has touched (every 64 KiB, to a log on tmpfs) with the
//! node's page counter, so the crossing is known to within one such step;
//! the kernel itself reports the node's page counter coming back down
//! (`watch.rs`). The agent logs its decision, kill and memory-back times on
//! the same clock.
//!
//! Writes `bench.json` (every run) and `bench.md` (the tables and the
//! goals) to --out; xtask draws the plots from the JSON.
mod oracle;
mod overhead;
mod peer;
mod reaper;
mod report;
mod runs;
mod stats;
mod thrashing;
mod watch;

use std::{
    fmt, fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use evictd::{
    config::{parse_bytes, parse_period},
    node::cgroupfs::{CgroupFs, CgroupVersion},
};
use evictd_integration::{BpfStats, machine_memory, set_oom_score_adj};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use peer::EARLYOOM;
use serde_json::json;

const MIB: u64 = 1 << 20;
/// The oracle row of a memory scenario: no agent, the bench kills.
const ORACLE: &str = "oracle";
/// The floor of the overhead scenarios: the workload with no agent.
const NO_AGENT: &str = "none";

#[derive(Debug, Parser)]
#[command(about = "What users pay: evictd's modes against each other and against floors")]
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
    /// Rounds; each runs every mode once per scenario, so this is the
    /// number of runs behind each row's percentiles.
    #[arg(long, default_value_t = 20)]
    runs: u32,
    /// The sandbox node's memory capacity.
    #[arg(long, default_value = "2Gi", value_parser = parse_bytes)]
    capacity: u64,
    /// The hard threshold: memory.available below this.
    #[arg(long, default_value = "256Mi", value_parser = parse_bytes)]
    threshold: u64,
    /// Bomb allocation rates (bytes per second; `max`: as fast as it can);
    /// empty (`--rates=`): no memory scenario.
    #[arg(long, value_delimiter = ',', default_value = "256Mi,1Gi,max")]
    rates: Vec<String>,
    /// Agent modes compared (the oracle and the no-agent floor are added
    /// where they apply). `MODE+OPTION` runs MODE with an opt-in option:
    /// `+kubelet` or `+fork-rate` (`--pid-ranking`), `+thrashing-eviction`,
    /// `+hooks-always` (`--precise-hooks always`),
    /// `+reclaimable` (`--memory-signal reclaimable`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "event,poll-10s,poll-1s,poll-100ms,psi,memcg-threshold"
    )]
    modes: Vec<String>,
    /// The node's task limit in the fork-bomb scenario (0: no such scenario).
    #[arg(long, default_value_t = 1024)]
    pid_limit: u64,
    /// The fork-bomb scenario's threshold: pid.available below this (the
    /// overhead scenarios' agents watch it too, far from it).
    #[arg(long, default_value_t = 128)]
    pid_threshold: u64,
    /// Pods on the node in the pod-count scenarios (at least 5: the memory
    /// scenarios' pods, plus small ones); 0: no such scenario.
    #[arg(long, value_delimiter = ',', default_value = "10,100,250")]
    pod_counts: Vec<usize>,
    /// The bomb's rate in the pod-count scenarios.
    #[arg(long, default_value = "1Gi")]
    pod_count_rate: String,
    /// Agent modes of the pod-count scenarios.
    #[arg(long, value_delimiter = ',', default_value = "event")]
    pod_count_modes: Vec<String>,
    /// Bytes each workload-overhead operation faults in, unmaps or frees
    /// by SIGKILL (at most --threshold less 32 MiB, so that the node close
    /// to the threshold never crosses it); 0: no overhead scenarios.
    #[arg(long, default_value = "192Mi", value_parser = parse_bytes)]
    overhead_bytes: u64,
    /// Timed operations of each kind per overhead run (the run's median is
    /// compared with the floor's in the same round).
    #[arg(long, default_value_t = 9)]
    overhead_reps: u32,
    /// Agent modes of the overhead scenarios (default: every --modes).
    #[arg(long, value_delimiter = ',')]
    overhead_modes: Option<Vec<String>>,
    /// How long each mode's agent idles on the node for the idle numbers.
    #[arg(long, default_value = "10s", value_parser = parse_period)]
    idle: Duration,
    /// What the node is: `sandbox`, a cgroup limited to --capacity, or
    /// `root`, the machine itself as on a real node (`--node-cgroup /`,
    /// the pods in the root's `kubepods`, the machine's memory as
    /// capacity, kubelet's working set of the root, the kernel's global
    /// OOM killer). `root` is for a throwaway machine only (the VM guest of
    /// `cargo xtask bench --vm`): it refuses where a `kubepods` exists.
    #[arg(long, value_enum, default_value_t = NodeKind::Sandbox)]
    node: NodeKind,
    /// Debian's earlyoom binary, for the `earlyoom` mode (a peer that
    /// polls MemAvailable and kills the process of highest oom_score).
    #[arg(long)]
    earlyoom: Option<PathBuf>,
    /// The reserve sweep: the memory bomb at --sweep-rate against each of
    /// these thresholds (kernel OOM kills per mode per threshold); empty:
    /// no sweep.
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    sweep_thresholds: Vec<u64>,
    /// The bomb's rate in the reserve sweep.
    #[arg(long, default_value = "max")]
    sweep_rate: String,
    /// Modes of the reserve sweep (the oracle is added; default: every
    /// --modes).
    #[arg(long, value_delimiter = ',')]
    sweep_modes: Option<Vec<String>>,
    /// Once this file exists, the bench ends after the run under way and
    /// writes the complete rounds (what ends a long bench in a VM guest
    /// from the host). bench.json and bench.md are also rewritten after
    /// every round, so a bench ended otherwise keeps its complete rounds.
    #[arg(long)]
    stop_file: Option<PathBuf>,
    /// Keeps every agent's log (JSON lines, one file per run named by
    /// round, scenario and mode) in this directory: what an agent did in a
    /// run that a table cannot say.
    #[arg(long)]
    agent_logs: Option<PathBuf>,
    /// The agents' RUST_LOG (`debug` adds a line per engine run: what
    /// woke it, what it decided, what it cost).
    #[arg(long, default_value = "info")]
    agent_log_level: String,
    /// The thrashing scenario's cold files go here (a disk filesystem, not
    /// tmpfs, whose pages are never reclaimed without swap); unset: no
    /// thrashing scenario. Sandbox node only.
    #[arg(long)]
    thrashing_dir: Option<PathBuf>,
    /// The thrashing scenario's room for file pages: each of its two pods
    /// is limited to what it holds plus this, the hog cycles a file 9/8 of
    /// it, web one half of it.
    #[arg(long, default_value = "32Mi", value_parser = parse_bytes)]
    thrashing_room: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum NodeKind {
    Sandbox,
    Root,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    /// Bytes per second; 0: as fast as the bomb can.
    Memory {
        rate: u64,
    },
    ForkBomb,
    /// The fork bomb beside a pod of the same priority with more
    /// processes, all older than the fork-rate window: kubelet's order
    /// takes that pod first.
    ForkBombBesideBusyPod,
    /// The memory bomb with this many pods on the node.
    Pods {
        count: usize,
        rate: u64,
    },
    /// The workload-overhead operations, far from every threshold or close
    /// to the memory one.
    Overhead {
        near: bool,
    },
    /// The memory bomb against another threshold (bytes): the reserve
    /// sweep.
    Reserve {
        threshold: u64,
        rate: u64,
    },
    /// A pod thrashing at its own memory limit beside one whose working
    /// set fits, no threshold near.
    Thrashing,
}

impl Scenario {
    /// The `kind` field of bench.json, which the tables and plots group by.
    fn kind(self) -> &'static str {
        match self {
            Self::Memory { .. } => "memory",
            Self::ForkBomb | Self::ForkBombBesideBusyPod => "fork-bomb",
            Self::Pods { .. } => "pods",
            Self::Overhead { .. } => "overhead",
            Self::Reserve { .. } => "reserve",
            Self::Thrashing => "thrashing",
        }
    }
}

fn rate_name(rate: u64) -> String {
    match rate {
        0 => "max rate".to_owned(),
        rate => format!("{} MiB/s", rate / MIB),
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory { rate } => write!(f, "memory, {}", rate_name(*rate)),
            Self::ForkBomb => f.write_str("fork bomb"),
            Self::ForkBombBesideBusyPod => f.write_str("fork bomb beside a busy pod"),
            Self::Pods { count, .. } => write!(f, "{count} pods"),
            Self::Overhead { near: false } => f.write_str("overhead, far from thresholds"),
            Self::Overhead { near: true } => f.write_str("overhead, close to the threshold"),
            Self::Reserve { threshold, rate } => {
                write!(f, "reserve {} MiB, {}", threshold / MIB, rate_name(*rate))
            }
            Self::Thrashing => f.write_str("thrashing at its limit"),
        }
    }
}

/// The option of the thrashing scenario's second mode, `event+` it.
const THRASHING_EVICTION: &str = "thrashing-eviction";

/// The option of a mode that counts cold active file as available:
/// `event+` it is `--memory-signal reclaimable`.
const RECLAIMABLE: &str = "reclaimable";

/// The option of a mode that judges KEP-5986's per-container memory
/// pressure: `event+` it sets each `--memory-*-eviction-threshold` (1 a
/// second for the two rates, 10 % for PSI).
const MEMORY_HIGH: &str = "memory-high";

/// The option of a mode whose precise hooks (memory and PID) stay attached
/// at any distance from a line: `event+` it is `--precise-hooks always`,
/// the zone's baseline.
const HOOKS_ALWAYS: &str = "hooks-always";

/// One agent mode, as its command-line arguments; `MODE+RANKING` adds
/// `--pid-ranking RANKING`, `MODE+thrashing-eviction` that flag,
/// `MODE+reclaimable` `--memory-signal reclaimable`, `MODE+memory-high`
/// KEP-5986's thresholds, `MODE+hooks-always` `--precise-hooks always`.
fn mode_args(mode: &str) -> Result<Vec<String>> {
    if let Some((mode, option)) = mode.split_once('+') {
        let mut args = mode_args(mode)?;
        match option {
            THRASHING_EVICTION => args.push(format!("--{THRASHING_EVICTION}")),
            RECLAIMABLE => args.extend(["--memory-signal".into(), RECLAIMABLE.into()]),
            HOOKS_ALWAYS => args.extend(["--precise-hooks".into(), "always".into()]),
            MEMORY_HIGH => args.extend(
                [
                    "--memory-high-eviction-threshold=1",
                    "--memory-max-eviction-threshold=1",
                    "--memory-psi-eviction-threshold=10",
                ]
                .map(String::from),
            ),
            ranking => args.extend(["--pid-ranking".into(), ranking.into()]),
        }
        return Ok(args);
    }
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
    matches!(mode, "psi" | "memcg-threshold" | EARLYOOM)
}

fn parse_rate(rate: &str) -> Result<u64> {
    match rate {
        "max" => Ok(0),
        other => parse_bytes(other).map_err(|e| anyhow::anyhow!("rate {other:?}: {e}")),
    }
}

/// Set by SIGINT, SIGTERM or SIGHUP. The bench then stops after the run
/// under way, which removes what that run made (its cgroups, agent,
/// workloads and bomb log); ended by the signal itself it would leave them
/// behind.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn stop_on_signals() -> Result<()> {
    // SA_RESTART: the run under way goes on as if nothing had come;
    // SA_RESETHAND: a second signal ends the bench at once.
    let action = SigAction::new(
        SigHandler::Handler(request_stop),
        SaFlags::SA_RESTART | SaFlags::SA_RESETHAND,
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe { sigaction(signal, &action) }.with_context(|| format!("handling {signal}"))?;
    }
    Ok(())
}

/// The error of a bench stopped between runs.
#[derive(Debug)]
struct Stopped;

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stopped by a signal")
    }
}

impl std::error::Error for Stopped {}

/// [`Stopped`] once a stop was asked for.
fn check_stop() -> Result<()> {
    if STOP.load(Ordering::Relaxed) {
        return Err(Stopped.into());
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    if let Err(e) = stop_on_signals() {
        eprintln!("evictd-bench: {e:#}");
        return std::process::ExitCode::FAILURE;
    }
    match bench(&Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            if STOP.load(Ordering::Relaxed) {
                eprintln!(
                    "evictd-bench: stopped by a signal; what the runs made is removed, \
                     no results written"
                );
                // Ctrl-C reaches the agent and the pods too, and the run
                // under way fails.
                if e.downcast_ref::<Stopped>().is_none() {
                    eprintln!("evictd-bench: the run under way ended in: {e:#}");
                }
            } else {
                eprintln!("evictd-bench: {e:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// The scenarios to run and the modes of each, in their base order.
fn scenarios(args: &Args, modes: &[String]) -> Result<Vec<(Scenario, Vec<String>)>> {
    let mut scenarios = Vec::new();
    let root = args.node == NodeKind::Root;
    for rate in args.rates.iter().filter(|rate| !rate.is_empty()) {
        let mut with_floors = vec![ORACLE.to_owned()];
        if root {
            // Without an agent the kernel's global OOM killer stops the
            // bomb: the floor every mode must beat. (In a sandbox that is
            // the cgroup's OOM killer, which the node's limit makes a
            // different thing from a node's.)
            with_floors.push(NO_AGENT.to_owned());
        }
        with_floors.extend(modes.iter().cloned());
        scenarios.push((
            Scenario::Memory {
                rate: parse_rate(rate)?,
            },
            with_floors,
        ));
    }
    if args.pid_limit > 0 && root {
        println!(
            "no fork bomb on the root: pid.available there is the machine's pid_max less its \
             tasks, and the bomb would have to fill it (--pid-limit applies to a sandbox)"
        );
    }
    if args.pid_limit > 0 && !root {
        let pid_modes = modes.iter().filter(|m| !memory_only(m)).cloned().collect();
        scenarios.push((Scenario::ForkBomb, pid_modes));
        if modes.iter().any(|mode| mode == "event") {
            // Event mode only: the fork rate is read the same way in every
            // mode. Not named `event`, so the event-mode goal leaves out
            // kubelet's order taking the busy pod, which is the point.
            scenarios.push((
                Scenario::ForkBombBesideBusyPod,
                vec!["event+kubelet".to_owned(), "event+fork-rate".to_owned()],
            ));
        }
    }
    let rate = parse_rate(&args.pod_count_rate)?;
    for &count in args.pod_counts.iter().filter(|count| **count > 0) {
        if count < runs::MEMORY_PODS {
            bail!(
                "--pod-counts: {count} is fewer than the {} pods every node has",
                runs::MEMORY_PODS
            );
        }
        scenarios.push((Scenario::Pods { count, rate }, args.pod_count_modes.clone()));
    }
    if args.overhead_bytes > 0 {
        if args.overhead_bytes + overhead::NEAR_MARGIN > args.threshold {
            bail!(
                "--overhead-bytes {} MiB: the node close to the threshold would cross it; \
                 at most --threshold less {} MiB",
                args.overhead_bytes / MIB,
                overhead::NEAR_MARGIN / MIB
            );
        }
        let mut with_floor = vec![NO_AGENT.to_owned()];
        with_floor.extend(
            args.overhead_modes
                .clone()
                .unwrap_or_else(|| modes.to_vec()),
        );
        for near in [false, true] {
            scenarios.push((Scenario::Overhead { near }, with_floor.clone()));
        }
    }
    if args.thrashing_dir.is_some() && root {
        println!("no thrashing scenario on the root: it limits pods of the sandbox node");
    }
    if let Some(dir) = args
        .thrashing_dir
        .as_ref()
        .filter(|_| !root && modes.iter().any(|mode| mode == "event"))
    {
        // Event mode only: the pods' counters are read the same way in
        // every mode.
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--thrashing-dir {}", dir.display()))?;
        scenarios.push((
            Scenario::Thrashing,
            vec!["event".to_owned(), format!("event+{THRASHING_EVICTION}")],
        ));
    }
    let sweep_rate = parse_rate(&args.sweep_rate)?;
    for &threshold in &args.sweep_thresholds {
        let mut with_oracle = vec![ORACLE.to_owned()];
        with_oracle.extend(args.sweep_modes.clone().unwrap_or_else(|| modes.to_vec()));
        scenarios.push((
            Scenario::Reserve {
                threshold,
                rate: sweep_rate,
            },
            with_oracle,
        ));
    }
    for (_, modes) in &scenarios {
        for mode in modes
            .iter()
            .filter(|m| ![ORACLE, NO_AGENT, EARLYOOM].contains(&m.as_str()))
        {
            mode_args(mode)?;
        }
        if modes.iter().any(|m| m == EARLYOOM) && args.earlyoom.is_none() {
            bail!("the earlyoom mode needs --earlyoom PATH");
        }
    }
    Ok(scenarios)
}

fn bench(args: &Args) -> Result<()> {
    // SAFETY: single-threaded here; Agent::start reads it in this thread.
    unsafe { std::env::set_var("EVICTD_BIN", &args.evictd) };
    fs::create_dir_all(&args.out)?;
    if let Some(dir) = &args.agent_logs {
        fs::create_dir_all(dir)?;
    }
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
    let scenarios = scenarios(args, &modes)?;
    if args.node == NodeKind::Root {
        // The bench outlives the kernel's OOM killer whatever a run
        // does; the pods get kubelet's adjustments, the agent its
        // DaemonSet's.
        set_oom_score_adj(std::process::id(), -1000).context("protecting the bench")?;
    }
    let _stats = BpfStats::on().context("turning on kernel.bpf_stats_enabled")?;

    println!(
        "idle overhead: each mode's agent on the quiet node for {:?}",
        args.idle
    );
    let mut idle = serde_json::Map::new();
    for mode in modes.iter().filter(|mode| *mode != EARLYOOM) {
        check_stop()?;
        runs::name_agent_log(format!("idle-{mode}"));
        let measured = runs::idle_overhead(args, mode)?;
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
            scenarios.iter().flat_map(move |(scenario, modes)| {
                // Rotate the order each round so no mode always runs first.
                let shift = round as usize % modes.len().max(1);
                modes
                    .iter()
                    .cycle()
                    .skip(shift)
                    .take(modes.len())
                    .map(move |mode| (round, *scenario, mode.clone()))
            })
        })
        .collect();
    let mut results_runs = Vec::new();
    let mut failures = Vec::new();
    let started = Instant::now();
    let capacity = match args.node {
        NodeKind::Sandbox => args.capacity,
        NodeKind::Root => machine_memory()?,
    };
    let header = Header {
        cgroup: format!("{:?}", cgroupfs.version),
        capacity,
        modes: &modes,
        scenarios: &scenarios,
        idle: &idle,
    };
    let mut rounds_done = 0;
    let mut stopped = false;
    for (done, (round, scenario, mode)) in plan.iter().enumerate() {
        check_stop()?;
        rounds_done = *round;
        if args.stop_file.as_deref().is_some_and(Path::exists) {
            // The round under way keeps the runs it made: each table says
            // its n, and pairs only what ran in the same round.
            println!("stop file found: ending after {rounds_done} complete rounds");
            stopped = true;
            break;
        }
        runs::name_agent_log(format!("r{round:02}-{scenario}-{mode}"));
        let outcome = match scenario {
            Scenario::Memory { rate } => runs::sandbox(args, 0).and_then(|node| {
                let run = runs::memory_run(args, node, mode, *rate, args.threshold)?;
                Ok((serde_json::to_value(&run)?, run.summary()))
            }),
            Scenario::Reserve { threshold, rate } => runs::sandbox(args, 0).and_then(|node| {
                let run = runs::memory_run(args, node, mode, *rate, *threshold)?;
                Ok((serde_json::to_value(&run)?, run.summary()))
            }),
            Scenario::Pods { count, rate } => runs::sandbox(args, *count).and_then(|node| {
                let run = runs::memory_run(args, node, mode, *rate, args.threshold)?;
                Ok((serde_json::to_value(&run)?, run.summary()))
            }),
            Scenario::ForkBomb => runs::fork_bomb_run(args, mode, false)
                .and_then(|run| Ok((serde_json::to_value(&run)?, run.summary()))),
            Scenario::ForkBombBesideBusyPod => runs::fork_bomb_run(args, mode, true)
                .and_then(|run| Ok((serde_json::to_value(&run)?, run.summary()))),
            Scenario::Thrashing => thrashing::run(args, mode)
                .and_then(|run| Ok((serde_json::to_value(&run)?, run.summary()))),
            Scenario::Overhead { near } => {
                // What a workload pays on a node, where the statistics are
                // off: on, they add two clock reads to every program run.
                let _stats_off = BpfStats::off().context("turning off kernel.bpf_stats_enabled")?;
                overhead::run(args, mode, *near)
                    .and_then(|run| Ok((serde_json::to_value(&run)?, run.summary())))
            }
        };
        let (run, summary) = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                check_stop()?;
                // One run failing (a guest's OOM killer taking a pod's
                // process mid-command, say) costs that run, not the bench;
                // bench.md lists it.
                let error = format!("{e:#}");
                println!("run failed: {scenario} / {mode} in round {round}: {error}");
                failures.push(json!({
                    "round": round, "scenario": scenario.to_string(), "mode": mode,
                    "error": error,
                }));
                if failures.len() > MAX_FAILED_RUNS {
                    bail!("more than {MAX_FAILED_RUNS} runs failed; the last: {error}");
                }
                continue;
            }
        };
        println!(
            "[{:>4}/{}] {:>5.0}s  {:<34} {mode:<16} {summary}",
            done + 1,
            plan.len(),
            started.elapsed().as_secs_f64(),
            scenario.to_string(),
        );
        results_runs.push(json!({
            "round": round, "scenario": scenario.to_string(), "mode": mode, "run": run,
        }));
        // Kept after every run: a guest that thrashes for good must not
        // take the runs made with it.
        let so_far = header.results(args, rounds_done, &started, &results_runs, &failures);
        write_results(args, &so_far)?;
    }
    if !stopped {
        rounds_done = args.runs;
    }
    let results = header.results(args, rounds_done, &started, &results_runs, &failures);
    write_results(args, &results)?;
    println!("\n{}", report::markdown(&results));
    println!("results: {}", args.out.join("bench.json").display());
    Ok(())
}

/// A bench stops once more runs than this failed.
const MAX_FAILED_RUNS: usize = 10;

/// What bench.json says besides the runs.
struct Header<'a> {
    cgroup: String,
    capacity: u64,
    modes: &'a [String],
    scenarios: &'a [(Scenario, Vec<String>)],
    idle: &'a serde_json::Map<String, serde_json::Value>,
}

impl Header<'_> {
    /// bench.json's content after `rounds` complete rounds.
    fn results(
        &self,
        args: &Args,
        rounds: u32,
        started: &Instant,
        runs: &[serde_json::Value],
        failures: &[serde_json::Value],
    ) -> serde_json::Value {
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let partial_round_runs = runs
            .iter()
            .filter(|r| r["round"].as_u64().is_some_and(|r| r >= u64::from(rounds)))
            .count();
        json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "kernel": kernel.trim(),
            "cgroup": self.cgroup,
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "rounds": rounds,
            "rounds_planned": args.runs,
            "node": format!("{:?}", args.node).to_lowercase(),
            "capacity_bytes": self.capacity,
            "threshold_bytes": args.threshold,
            "pid_limit": args.pid_limit,
            "pid_threshold": args.pid_threshold,
            "overhead_forks": overhead::FORKS,
            "overhead_bytes": args.overhead_bytes,
            "overhead_reps": args.overhead_reps,
            "modes": self.modes,
            "scenarios": self.scenarios.iter().map(|(scenario, modes)| {
                let mut entry = json!({
                    "name": scenario.to_string(), "kind": scenario.kind(), "modes": modes,
                });
                match scenario {
                    Scenario::Memory { rate } => entry["rate"] = json!(rate),
                    Scenario::Pods { count, rate } => {
                        entry["pods"] = json!(count);
                        entry["rate"] = json!(rate);
                    }
                    Scenario::Overhead { near } => entry["near"] = json!(near),
                    Scenario::Reserve { threshold, rate } => {
                        entry["threshold"] = json!(threshold);
                        entry["rate"] = json!(rate);
                    }
                    Scenario::ForkBomb | Scenario::ForkBombBesideBusyPod | Scenario::Thrashing => {}
                }
                entry
            }).collect::<Vec<_>>(),
            "idle": self.idle,
            "wall_seconds": started.elapsed().as_secs_f64(),
            "partial_round_runs": partial_round_runs,
            "runs": runs,
            "failed_runs": failures,
        })
    }
}

fn write_results(args: &Args, results: &serde_json::Value) -> Result<()> {
    fs::write(
        args.out.join("bench.json"),
        serde_json::to_string_pretty(results)?,
    )?;
    fs::write(args.out.join("bench.md"), report::markdown(results))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_stops_the_bench_between_runs_instead_of_ending_it() {
        stop_on_signals().unwrap();
        check_stop().unwrap();
        // Without the handler this would end the test process.
        nix::sys::signal::raise(Signal::SIGTERM).unwrap();
        let stopped = check_stop().unwrap_err();
        assert!(stopped.downcast_ref::<Stopped>().is_some(), "{stopped}");
    }

    #[test]
    fn each_mode_is_the_agent_with_its_own_flags() {
        assert_eq!(
            mode_args("poll-100ms").unwrap(),
            ["--mode", "poll", "--housekeeping-interval", "100ms"]
        );
        assert_eq!(
            mode_args("event+thrashing-eviction").unwrap(),
            ["--mode", "event", "--thrashing-eviction"]
        );
        assert_eq!(
            mode_args("event+reclaimable").unwrap(),
            ["--mode", "event", "--memory-signal", "reclaimable"]
        );
        assert_eq!(
            mode_args("event+memory-high").unwrap(),
            [
                "--mode",
                "event",
                "--memory-high-eviction-threshold=1",
                "--memory-max-eviction-threshold=1",
                "--memory-psi-eviction-threshold=10"
            ]
        );
        assert_eq!(
            mode_args("event+hooks-always").unwrap(),
            ["--mode", "event", "--precise-hooks", "always"]
        );
        assert_eq!(mode_args("psi").unwrap(), ["--mode", "psi"]);
        assert!(mode_args("kprobe").is_err());
    }

    fn args(extra: &[&str]) -> Args {
        let base = [
            "evictd-bench",
            "--evictd",
            "e",
            "--workload",
            "w",
            "--out",
            "o",
        ];
        Args::parse_from(base.iter().chain(extra))
    }

    #[test]
    fn the_oracle_joins_memory_scenarios_and_the_floor_joins_overhead_ones() {
        let modes = vec!["event".to_owned(), "psi".to_owned()];
        let planned = scenarios(&args(&["--rates", "1Gi", "--pod-counts", "10"]), &modes).unwrap();
        let planned: Vec<(String, Vec<String>)> = planned
            .into_iter()
            .map(|(scenario, modes)| (scenario.to_string(), modes))
            .collect();
        let modes_of = |name: &str| {
            planned
                .iter()
                .find(|(scenario, _)| scenario == name)
                .map(|(_, modes)| modes.join(","))
        };
        assert_eq!(
            modes_of("memory, 1024 MiB/s").as_deref(),
            Some("oracle,event,psi")
        );
        // psi watches memory only.
        assert_eq!(modes_of("fork bomb").as_deref(), Some("event"));
        assert_eq!(
            modes_of("fork bomb beside a busy pod").as_deref(),
            Some("event+kubelet,event+fork-rate")
        );
        assert_eq!(modes_of("10 pods").as_deref(), Some("event"));
        assert_eq!(
            modes_of("overhead, close to the threshold").as_deref(),
            Some("none,event,psi")
        );
        assert_eq!(planned.len(), 6);
    }

    #[test]
    fn on_the_root_the_kernels_oom_killer_is_a_floor_and_the_sweep_adds_a_scenario_per_threshold() {
        let modes = vec!["event".to_owned(), EARLYOOM.to_owned()];
        let planned = scenarios(
            &args(&[
                "--node",
                "root",
                "--earlyoom",
                "/usr/bin/earlyoom",
                "--rates",
                "1Gi",
                "--pod-counts",
                "0",
                "--overhead-bytes",
                "0",
                "--sweep-thresholds",
                "4Mi,100Mi",
                "--sweep-modes",
                "event",
            ]),
            &modes,
        )
        .unwrap();
        let planned: Vec<(String, String)> = planned
            .into_iter()
            .map(|(scenario, modes)| (scenario.to_string(), modes.join(",")))
            .collect();
        // No fork bomb: the root has no pids.max to fill.
        assert_eq!(
            planned,
            [
                (
                    "memory, 1024 MiB/s".into(),
                    "oracle,none,event,earlyoom".into()
                ),
                ("reserve 4 MiB, max rate".into(), "oracle,event".into()),
                ("reserve 100 MiB, max rate".into(), "oracle,event".into()),
            ]
        );
        let without_binary = scenarios(&args(&["--node", "root"]), &modes).unwrap_err();
        assert!(
            without_binary.to_string().contains("--earlyoom"),
            "{without_binary}"
        );
    }

    #[test]
    fn overhead_too_large_to_stay_below_the_threshold_is_refused() {
        let err = scenarios(&args(&["--overhead-bytes", "240Mi"]), &[]).unwrap_err();
        assert!(err.to_string().contains("would cross it"), "{err}");
        let err = scenarios(&args(&["--pod-counts", "3"]), &[]).unwrap_err();
        assert!(err.to_string().contains("fewer than the 5 pods"), "{err}");
        let none = scenarios(
            &args(&[
                "--pod-counts",
                "0",
                "--overhead-bytes",
                "0",
                "--pid-limit",
                "0",
                "--rates",
                "1Gi",
            ]),
            &[],
        )
        .unwrap();
        assert_eq!(none.len(), 1, "the memory scenario alone");
    }
}
