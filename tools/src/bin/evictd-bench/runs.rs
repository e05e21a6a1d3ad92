//! One run of a bomb: the sandbox node, the agent (or the oracle), the
//! bomb, and what each side logged, on CLOCK_MONOTONIC from the crossing.
use std::{
    cell::RefCell,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use evictd::node::{
    cgroupfs::{CgroupFs, CgroupVersion},
    forks::FORK_RATE_WINDOW,
};
use evictd_integration::{
    Agent, AgentLog, Controller, STEADY_POD_MEMORY, SandboxNode, TREE_PIDS_LIMIT, VMSTAT, http_get,
    machine_memory, memory_pods, program_stats, quiet_pods, set_oom_score_adj, wait_until,
    working_set_from_vmstat,
};
use serde_json::Value;

use crate::{
    Args, MIB, NO_AGENT, NodeKind, ORACLE, mode_args,
    oracle::{Oracle, OracleKill, exit_watch},
    peer::{EARLYOOM, Earlyoom, KernelOomKills, NODE_CRITICAL_OOM_SCORE_ADJ},
    reaper::Reaper,
    watch::{Counter, LevelWatch},
};

/// The pod that explodes; kubelet's ranking puts it first (BestEffort,
/// priority 0, largest usage over its request).
pub const BOMB: &str = "hog";
pub const EXPECTED_VICTIM: &str = "default/hog";
/// The pod of the bomb's priority that holds many quiet processes in the
/// busy-pod fork bomb.
const BUSY_POD: &str = "web";
/// Pods of every node: `memory_pods`.
pub const MEMORY_PODS: usize = 5;
/// What each quiet pod of the pod-count scenarios holds.
const QUIET_POD_MEMORY: u64 = MIB;
/// How long a bomb may run before the run is abandoned (a sandbox) or
/// counted as stalled (the root).
const RUN_DEADLINE: Duration = Duration::from_secs(30);
/// How long memory may take to come back once the bomb is gone.
const BACK_DEADLINE: Duration = Duration::from_secs(10);
const REFUSED_FORK: u64 = 1 << 63;
/// Memory is back once the node's page counter is below where it was
/// before the bomb plus this share of what the bomb held at the crossing.
const BACK_REMAINING_SHARE: u64 = 20;

/// What one run measured; times are µs from the ground-truth crossing.
#[derive(Debug, Default, serde::Serialize)]
pub struct Run {
    /// When the node really crossed the threshold (CLOCK_MONOTONIC): the
    /// first page-counter reading past it in the bomb's log or the
    /// kernel's notification of it before the agent's kill, whichever came
    /// first (both come after it: the bomb reads the counter every 64 KiB,
    /// and may be preempted between a page and its record).
    pub crossed_ns: Option<u64>,
    /// Which of the two it was: `log` or `kernel`.
    pub crossing_source: Option<String>,
    /// The agent decided, but neither the bomb's log nor the kernel saw
    /// the node cross: the bomb was stopped before its next record (or
    /// the agent decided early). Left out of the percentiles, counted.
    pub decided_without_crossing: bool,
    /// The page-counter level the crossing is taken at (capacity −
    /// threshold + 1 + the node's inactive file pages before the bomb), and the
    /// one memory is back below.
    pub crossing_level_bytes: u64,
    pub back_level_bytes: u64,
    /// The highest page counter (memory) or task count the bomb logged.
    pub peak_logged: Option<u64>,
    /// The signal of the agent's first decision and the available quantity
    /// it observed (bytes, or tasks).
    pub decided_signal: Option<String>,
    pub decided_available: Option<i64>,
    /// The bomb log's first record past the level, and the kernel's
    /// notification of the crossing (v1 eventfd; v2: the 1 ms reading),
    /// relative to the crossing.
    pub logged_us: Option<f64>,
    pub observer_us: Option<f64>,
    /// Where the bomb's own byte count alone would put the crossing.
    pub held_estimate_us: Option<f64>,
    /// What woke the agent's deciding run (the kernel record's timestamp,
    /// the timer tick, the notification); the oracle: when it read the
    /// crossing record.
    pub noticed_us: Option<f64>,
    /// The agent's `eviction decided`; the oracle: its SIGKILL.
    pub decided_us: Option<f64>,
    /// From the trigger that woke the deciding run to the decision (the
    /// agent's `at_ns − trigger_at_ns`): kernel record → decision in event
    /// mode.
    pub decision_us: Option<f64>,
    /// Where `decision_us` went, from the same line (µs): to the engine
    /// run (the wake-up, the kernel's records read), the node's signals
    /// read, the pods listed, every ranking, the exact reads of the pods
    /// the decision turned on, and how many pods those were.
    pub woken_to_run_us: Option<f64>,
    pub observe_us: Option<f64>,
    pub list_us: Option<f64>,
    pub rank_us: Option<f64>,
    pub exact_read_us: Option<f64>,
    pub exact_reads: Option<u64>,
    /// The deciding thread over its engine run (from the node read to the
    /// decision): CPU time, the rest of the run off the CPU, and its
    /// involuntary and voluntary context switches.
    pub run_on_cpu_us: Option<f64>,
    pub run_off_cpu_us: Option<f64>,
    pub run_preempted: Option<u64>,
    pub run_blocked: Option<u64>,
    /// Event mode's zone: the precise memory hooks' last attach before the
    /// first decision, negative when they were on before the node crossed
    /// (the lead the zone left); none when they never moved.
    pub hooks_attached_us: Option<f64>,
    /// The kill complete: the agent's `pod killed` (victim's cgroup empty);
    /// the oracle: the bomb's pidfd says it exited.
    pub killed_us: Option<f64>,
    /// Memory back as the kernel reports it: the node's page counter down
    /// past the back level (`watch.rs`). Only when the agent or the oracle
    /// killed the bomb and the kernel's OOM killer did not strike.
    pub back_us: Option<f64>,
    /// The agent's own `memory back` line, and the bytes it says came back.
    pub agent_back_us: Option<f64>,
    pub agent_freed_bytes: Option<u64>,
    /// The phases of the agent's kill (its `pod killed` line), relative to
    /// the crossing: the kill began; the v1 freezer said `FROZEN`; the
    /// first SIGKILL; the frozen pod thawed; the first round's
    /// `process_mrelease` calls returned; the victim's cgroup held no
    /// process.
    pub kill_started_us: Option<f64>,
    pub frozen_us: Option<f64>,
    pub sigkill_us: Option<f64>,
    pub thawed_us: Option<f64>,
    pub released_us: Option<f64>,
    pub empty_us: Option<f64>,
    /// The tasks the agent's freeze still waited on a millisecond after
    /// it asked (`pid state kernel-function`, from its `pod killed` line);
    /// none when the pod froze sooner.
    pub freeze_holdouts: Option<String>,
    pub trigger: Option<String>,
    /// Pods the agent (or the oracle) killed.
    pub victims: Vec<String>,
    /// Kernel OOM kills in the node (memory; on the root machine-wide, from
    /// /proc/vmstat) or forks refused at pids.max.
    pub kernel_kills: u64,
    /// On the root: the kernel OOM killer's victims, as its log names them
    /// (`default/<pod>`, or the pid and command of a process not a pod's).
    pub kernel_victims: Vec<String>,
    /// On the root: the bomb still ran after the run's deadline, nothing
    /// (agent, peer or kernel) having stopped it while the node thrashed;
    /// the bench killed it.
    pub stalled: bool,
    /// The least memory.available the bomb's log saw (bytes; negative: the
    /// working set past capacity), whether or not it crossed.
    pub lowest_available_logged: Option<i64>,
    /// Pods other than the bomb that did not survive.
    pub lost_pods: Vec<String>,
    /// The agent's WARN and ERROR lines.
    pub problems: Vec<String>,
    pub oracle: Option<OracleKill>,
    /// Whether the bench's level watches ran at real-time priority.
    pub watch_realtime: bool,
    pub agent_cpu_ms: f64,
    pub agent_peak_rss_bytes: u64,
    /// `(program, runs, ns)` of the agent's BPF programs over its life.
    pub bpf: Vec<(String, u64, u64)>,
    /// `(trigger, runs)` of the agent's engine over its life: what woke it,
    /// and whether anything did, when a run went wrong.
    pub engine_runs: Vec<(String, u64)>,
}

impl Run {
    fn wrong_victim(&self) -> bool {
        self.victims.iter().any(|v| v != EXPECTED_VICTIM) || !self.lost_pods.is_empty()
    }

    pub fn summary(&self) -> String {
        let at = |us: Option<f64>| us.map_or("-".to_owned(), |us| format!("{:.2} ms", us / 1e3));
        let mut text = format!(
            "decided {} ({}), killed {}, memory back {}",
            at(self.decided_us),
            self.trigger.as_deref().unwrap_or("no decision"),
            at(self.killed_us),
            at(self.back_us),
        );
        if self.kernel_kills > 0 {
            text += &format!(", KERNEL WON ({})", self.kernel_kills);
        }
        if self.stalled {
            text += ", STALLED (no kill before the deadline)";
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

/// A sandbox node with the memory scenarios' pods holding their steady
/// memory; with `pods` above [`MEMORY_PODS`], quiet pods make up the count.
pub fn sandbox(args: &Args, pods: usize) -> Result<SandboxNode> {
    let quiet = quiet_pods(pods.saturating_sub(MEMORY_PODS));
    let mut specs = memory_pods();
    specs.extend(quiet.iter().cloned());
    let workload = args.workload.display().to_string();
    let mut node = match args.node {
        NodeKind::Sandbox => SandboxNode::new(specs, args.capacity, &workload),
        NodeKind::Root => SandboxNode::on_root(specs, &workload),
    }
    .context("building the node")?;
    node.alloc(&STEADY_POD_MEMORY)?;
    for pod in &quiet {
        node.workload(&pod.name)?.alloc(QUIET_POD_MEMORY)?;
    }
    Ok(node)
}

pub fn start_agent(args: &Args, node: &SandboxNode, mode: &str, threshold: &str) -> Result<Agent> {
    let mut command = Command::new(&args.evictd);
    command
        .args(node.agent_args())
        .args(mode_args(mode)?)
        .args(["--eviction-hard", threshold])
        .env("RUST_LOG", &args.agent_log_level);
    AGENT_LOGS.with_borrow_mut(|logs| logs.dir = args.agent_logs.clone());
    let mut agent = Agent::spawn(command)?;
    if node.is_root() {
        // As kubelet sets it for the DaemonSet's system-node-critical pod;
        // the bench's own -1000 would otherwise be inherited.
        set_oom_score_adj(agent.pid(), NODE_CRITICAL_OOM_SCORE_ADJ)?;
    }
    agent.log.expect("protection armed", &[]);
    Ok(agent)
}

/// The node's memory capacity: the sandbox's limit, or the machine's.
pub fn capacity(args: &Args, node: &SandboxNode) -> Result<u64> {
    Ok(match node.is_root() {
        true => machine_memory()?,
        false => args.capacity,
    })
}

/// The machine's working set as kubelet computes it on the root, now.
fn machine_working_set() -> Result<u64> {
    let text = fs::read_to_string(VMSTAT)?;
    working_set_from_vmstat(&text).context("no page counts in /proc/vmstat")
}

/// Where the agents' logs are kept (`--agent-logs`), and the name of the
/// next run's file: set per run by the loop, read where the agent stops,
/// deep in each scenario.
#[derive(Default)]
struct AgentLogs {
    dir: Option<PathBuf>,
    next_name: String,
}

thread_local! {
    static AGENT_LOGS: RefCell<AgentLogs> = RefCell::default();
}

/// Names the file the next agent's log is kept in (`--agent-logs`).
pub fn name_agent_log(name: String) {
    AGENT_LOGS.with_borrow_mut(|logs| logs.next_name = name.replace(['/', ' ', ','], "_"));
}

fn keep_agent_log(log: &AgentLog) -> Result<()> {
    let Some(path) = AGENT_LOGS.with_borrow(|logs| {
        logs.dir
            .as_ref()
            .map(|dir| dir.join(format!("{}.jsonl", logs.next_name)))
    }) else {
        return Ok(());
    };
    let mut text = String::new();
    for line in &log.seen {
        text.push_str(&line.to_string());
        text.push('\n');
    }
    fs::write(&path, text).with_context(|| format!("keeping the agent's log in {}", path.display()))
}

pub fn stop(agent: Agent) -> Result<AgentLog> {
    let (status, mut log) = agent.stop()?;
    // Everything it printed, not only what the run waited for.
    log.drain();
    keep_agent_log(&log)?;
    if !status.success() {
        bail!("the agent exited with {status}");
    }
    Ok(log)
}

/// A memory bomb at `rate` bytes/s (0: flat out) on `node` against
/// `threshold` bytes of memory.available, stopped by the agent in `mode`,
/// by earlyoom, for [`ORACLE`] by the bench at the crossing, or for
/// [`NO_AGENT`] by the kernel's OOM killer.
pub fn memory_run(
    args: &Args,
    mut node: SandboxNode,
    mode: &str,
    rate: u64,
    threshold: u64,
) -> Result<Run> {
    let capacity = capacity(args, &node)?;
    let root = node.is_root();
    let agent = match mode {
        ORACLE | NO_AGENT | EARLYOOM => None,
        _ => Some(start_agent(
            args,
            &node,
            mode,
            &format!("memory.available<{threshold}"),
        )?),
    };
    let peer = match mode {
        EARLYOOM => {
            let binary = args
                .earlyoom
                .as_deref()
                .context("the earlyoom row needs --earlyoom")?;
            Some(Earlyoom::start(binary, threshold)?)
        }
        _ => None,
    };
    let cgroupfs = CgroupFs::discover()?;
    let node_cgroup = node.node_cgroup();
    let memory_dir = cgroupfs.memory_dir(&node_cgroup);
    // available < threshold once the working set passes capacity −
    // threshold (strictly: at it, the threshold is still available). In a
    // sandbox the bench watches the page counter, and the bomb (anonymous
    // memory only) leaves the inactive file pages as they were, so there
    // the level is that plus them; on the root it watches the working set
    // itself, as kubelet computes it.
    let (counter, level, needed, baseline_usage) = if root {
        let working_set = machine_working_set()?;
        let level = capacity - threshold + 1;
        (
            Counter::Machine,
            level,
            (capacity - threshold).saturating_sub(working_set),
            working_set,
        )
    } else {
        let baseline = cgroupfs.read_memory(&node_cgroup)?;
        (
            Counter::Cgroup(cgroupfs.version, memory_dir.clone()),
            capacity - threshold + 1 + baseline.inactive_file_bytes,
            (capacity - threshold).saturating_sub(baseline.working_set_bytes()),
            baseline.usage_bytes,
        )
    };
    let back_level = baseline_usage + level.saturating_sub(baseline_usage) / BACK_REMAINING_SHARE;
    let mut kernel_oom = root.then(KernelOomKills::start).transpose()?;
    // Level 0 is the crossing, level 1 memory back.
    let mut watch = LevelWatch::start(&counter, &[level, back_level])?;
    let log = bomb_log(&node);
    // Made now so the oracle can watch it before the bomb writes.
    fs::write(&log, b"")?;
    let bomb_pid = node.workload(BOMB)?.pid();
    let oracle = match mode {
        ORACLE => Some(Oracle::arm(bomb_pid, &log, level)?),
        _ => None,
    };
    let bomb_exit = exit_watch(bomb_pid)?;
    let usage_file = match (root, cgroupfs.version) {
        (true, _) => PathBuf::from(VMSTAT),
        (false, CgroupVersion::V1) => memory_dir.join("memory.usage_in_bytes"),
        (false, CgroupVersion::V2) => memory_dir.join("memory.current"),
    };
    node.workload(BOMB)?.command(&format!(
        "bomb {rate} {} {}",
        log.display(),
        usage_file.display()
    ))?;
    let exited = node.workload(BOMB)?.wait_exit(RUN_DEADLINE)?;
    // On a machine's root nothing may stop the bomb for long: the kernel
    // reclaims and retries while the node thrashes before its OOM killer
    // acts (minutes under emulation). That is an outcome, not a failure:
    // the bench ends it.
    let stalled = root && exited.is_none();
    if stalled {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(bomb_pid)?),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        node.workload(BOMB)?.wait_exit(RUN_DEADLINE)?;
    } else if exited.is_none() {
        bail!("the bomb was still running after {RUN_DEADLINE:?}");
    }
    let mut run = Run {
        crossing_level_bytes: level,
        back_level_bytes: back_level,
        watch_realtime: watch.realtime,
        stalled,
        ..Run::default()
    };
    match kernel_oom.as_mut() {
        Some(kernel_oom) => {
            let (count, victims) = kernel_oom.since()?;
            run.kernel_kills = count;
            run.kernel_victims = victims
                .into_iter()
                .map(|(pid, command)| {
                    pod_of(&mut node, pid).unwrap_or(format!("pid {pid} ({command})"))
                })
                .collect();
        }
        None => run.kernel_kills = node.oom_kills()?,
    }
    // The bomb is gone: its memory is on its way back.
    let _ = wait_until(BACK_DEADLINE, "the node's memory back", || {
        watch.went_down(1)
    });
    let mut agent_log = match agent {
        Some(agent) => Some(finish(&mut node, agent, &mut run, Controller::Memory)?),
        None => {
            run.lost_pods = lost_pods(&mut node);
            None
        }
    };
    let earlyoom = peer.map(Earlyoom::stop).transpose()?;
    if let Some(oracle) = oracle {
        run.oracle = oracle.outcome()?;
    }
    let bomb_exited = bomb_exit.recv_timeout(BACK_DEADLINE).ok();
    let records = read_log(&log, 3)?;
    // Ground truth: the node's page counter (on the root: the machine's
    // working set), read by the bomb right after each 64 KiB it touched.
    let logged = records
        .iter()
        .find(|record| record[2] >= level)
        .map(|record| record[0]);
    // A notification after the agent began to kill is not the crossing:
    // the kernel checks its eventfd thresholds every 128 page events per
    // CPU, and once the bomb is frozen or killed those are the teardown's.
    // The crossing was before the kill then, when is unknown.
    let kill_started = agent_log.as_mut().and_then(|log| {
        log.all("pod killed")
            .first()
            .and_then(|line| line["kill_started_ns"].as_u64())
    });
    let observed = watch
        .first_up(0)
        .filter(|&ns| kill_started.is_none_or(|started| ns < started));
    let (crossed, source) = match (logged, observed) {
        (Some(log), Some(kernel)) if kernel < log => (Some(kernel), Some("kernel")),
        (Some(log), _) => (Some(log), Some("log")),
        (None, Some(kernel)) => (Some(kernel), Some("kernel")),
        (None, None) => (None, None),
    };
    run.crossed_ns = crossed;
    run.crossing_source = source.map(str::to_owned);
    run.peak_logged = records.iter().map(|record| record[2]).max();
    // What the level adds to capacity − threshold + 1: the sandbox's
    // inactive file pages (none on the root).
    let inactive_file = level - (capacity - threshold + 1);
    run.lowest_available_logged = run
        .peak_logged
        .map(|peak| capacity as i64 - peak as i64 + inactive_file as i64);
    if let Some(log) = agent_log.as_mut() {
        fill_outcome(&mut run, log);
    }
    if let Some(kill) = &earlyoom {
        for &pid in &kill.pids {
            let victim = pod_of(&mut node, pid).unwrap_or(format!("pid {pid}"));
            run.victims.push(victim);
        }
        if kill.decided_ns.is_some() {
            run.trigger = Some(EARLYOOM.to_owned());
        }
    }
    let Some(crossed) = run.crossed_ns else {
        run.decided_without_crossing = run.trigger.is_some();
        return Ok(run);
    };
    run.logged_us = logged.map(|ns| relative_us(ns, crossed));
    run.observer_us = observed.map(|ns| relative_us(ns, crossed));
    // The bomb's own count is blind to the page tables and kernel memory
    // charged with its pages: where it alone would put the crossing.
    run.held_estimate_us = records
        .iter()
        .find(|record| record[1] >= needed)
        .map(|record| relative_us(record[0], crossed));
    if let Some(kill) = run.oracle {
        run.trigger = Some(ORACLE.to_owned());
        run.victims = vec![EXPECTED_VICTIM.to_owned()];
        run.noticed_us = Some(relative_us(kill.seen_ns, crossed));
        run.decided_us = Some(relative_us(kill.signalled_ns, crossed));
        run.killed_us = kill.exited_ns.map(|ns| relative_us(ns, crossed));
    }
    if let Some(kill) = &earlyoom {
        run.decided_us = kill.decided_ns.map(|ns| relative_us(ns, crossed));
        run.killed_us = bomb_exited.map(|ns| relative_us(ns, crossed));
    }
    if let Some(mut log) = agent_log {
        fill_times(&mut run, &mut log, crossed);
    }
    if mode == NO_AGENT {
        // The floor without an agent: the kernel's OOM killer.
        run.victims = run.kernel_victims.clone();
        run.killed_us = bomb_exited.map(|ns| relative_us(ns, crossed));
    }
    let killed_by_the_kernel_alone = mode == NO_AGENT && run.kernel_kills > 0;
    if (run.kernel_kills == 0 && !run.victims.is_empty()) || killed_by_the_kernel_alone {
        run.back_us = watch
            .first_down_after(1, crossed)
            .map(|ns| relative_us(ns, crossed));
    }
    Ok(run)
}

/// `default/<pod>` of the pod whose process is `pid`.
fn pod_of(node: &mut SandboxNode, pid: u32) -> Option<String> {
    let names: Vec<String> = node.pods.iter().map(|pod| pod.name.clone()).collect();
    names
        .into_iter()
        .find(|name| node.workload(name).is_ok_and(|w| w.pid() == pid))
        .map(|name| format!("default/{name}"))
}

/// The fork bomb against `pid.available`; with `busy_pod`, beside web
/// (priority 0, as the bomb) holding 60% of the tasks below the line in
/// processes that fork nothing, so that the bomb crosses with fewer.
pub fn fork_bomb_run(args: &Args, mode: &str, busy_pod: bool) -> Result<Run> {
    let mut node = sandbox(args, 0)?;
    // The private tree's own ceiling would bind first (the agent reads the
    // lowest limit above the node): it rises to the node's limit, which
    // stays the bound on the bomb.
    if args.pid_limit > TREE_PIDS_LIMIT {
        node.tree.set_pids_limit("", args.pid_limit)?;
    }
    node.tree.set_pids_limit("node", args.pid_limit)?;
    if busy_pod {
        let tasks = (args.pid_limit - args.pid_threshold) * 6 / 10;
        node.workload(BUSY_POD)?.fork(u32::try_from(tasks)?)?;
    }
    // Once the last of them is born.
    let busy_since = Instant::now();
    let agent = start_agent(
        args,
        &node,
        mode,
        &format!("pid.available<{}", args.pid_threshold),
    )?;
    let baseline = node.tree.pids_current("node")?;
    // available < threshold once tasks pass limit - threshold.
    let needed = (args.pid_limit - args.pid_threshold + 1).saturating_sub(baseline);
    let log = bomb_log(&node);
    let mut ours = vec![agent.pid()];
    for pod in node.pods.clone() {
        ours.push(node.workload(&pod.name)?.pid());
    }
    let reaper = Reaper::start(ours)?;
    if busy_pod {
        // A pod that has been up a while: its processes older than the
        // fork-rate window when the bomb starts, by more than the clock
        // ticks start times are counted in.
        let aged = FORK_RATE_WINDOW + Duration::from_millis(100);
        std::thread::sleep(aged.saturating_sub(busy_since.elapsed()));
    }
    node.workload(BOMB)?
        .command(&format!("fork-bomb {}", log.display()))?;
    let exited = node.workload(BOMB)?.wait_exit(RUN_DEADLINE)?;
    if exited.is_none() {
        bail!("the fork bomb was still running after {RUN_DEADLINE:?}");
    }
    let mut run = Run::default();
    let mut agent_log = finish(&mut node, agent, &mut run, Controller::Pids)?;
    drop(reaper);
    let records = read_log(&log, 2)?;
    run.crossed_ns = records
        .iter()
        .find(|record| record[1] & !REFUSED_FORK >= needed)
        .map(|record| record[0]);
    run.kernel_kills = records
        .iter()
        .filter(|record| record[1] & REFUSED_FORK != 0)
        .count() as u64;
    run.peak_logged = records.iter().map(|record| record[1] & !REFUSED_FORK).max();
    fill_outcome(&mut run, &mut agent_log);
    match run.crossed_ns {
        Some(crossed) => fill_times(&mut run, &mut agent_log, crossed),
        // The bomb records a child after its fork returns; a bomb frozen
        // in between never logs the fork that crossed.
        None => run.decided_without_crossing = run.trigger.is_some(),
    }
    Ok(run)
}

/// On tmpfs where there is one. The bomb's log is charged to the node, and
/// on a disk file system it is page cache on the inactive list, which
/// grows with the log (about 150 KiB by the crossing) while the crossing
/// level counts the inactive file pages of before the bomb: the level would
/// sit that far below the node's real crossing, and a run whose bomb
/// reaches it in the last pages of a burst would be timed from a crossing
/// the node only makes at the next burst. On tmpfs the log is shared
/// memory, in the working set like the bomb's own pages.
fn bomb_log(node: &SandboxNode) -> BombLog {
    let shm = Path::new("/dev/shm");
    let dir = if nix::sys::statfs::statfs(shm)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
    {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    };
    BombLog(dir.join(format!("evictd-bench-{}.log", node.tree.name())))
}

/// The bomb's log, removed however the run ends.
struct BombLog(PathBuf);

impl std::ops::Deref for BombLog {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for BombLog {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for BombLog {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// `(trigger, runs)` from the agent's `evictd_engine_runs_total` series.
fn engine_runs(metrics: &str) -> Vec<(String, u64)> {
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("evictd_engine_runs_total{trigger=\"")?;
            let (trigger, value) = rest.split_once("\"} ")?;
            Some((trigger.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Pods other than the bomb whose process no longer answers.
fn lost_pods(node: &mut SandboxNode) -> Vec<String> {
    let others: Vec<String> = node
        .pods
        .iter()
        .map(|pod| pod.name.clone())
        .filter(|name| name != BOMB)
        .collect();
    others
        .into_iter()
        .filter(|name| !node.alive(name))
        .collect()
}

/// Once the bomb is gone: waits for the agent to report the memory back,
/// collects its cost and the pods lost, and stops it; returns its log.
fn finish(
    node: &mut SandboxNode,
    mut agent: Agent,
    run: &mut Run,
    resource: Controller,
) -> Result<AgentLog> {
    if run.kernel_kills == 0 && resource == Controller::Memory {
        // Killed by the agent: wait for it to see the memory back.
        let _ = wait_until(BACK_DEADLINE, "memory back", || {
            !agent.log.all("memory back").is_empty() || !agent.log.all("eviction failed").is_empty()
        });
    }
    if resource == Controller::Pids && !agent.log.all("eviction decided").is_empty() {
        // The bomb's own process goes first; its children after it: wait
        // for the kill to end before stopping the agent.
        let _ = wait_until(BACK_DEADLINE, "the fork bomb killed", || {
            !agent.log.all("pod killed").is_empty() || !agent.log.all("eviction failed").is_empty()
        });
    }
    run.agent_cpu_ms = cpu_time(agent.pid())?.as_secs_f64() * 1e3;
    run.agent_peak_rss_bytes = status_bytes(agent.pid(), "VmHWM")?;
    // Logged before `protection armed`, which start_agent awaited.
    let address = agent.log.metrics_address();
    if let Ok(metrics) = http_get(&address, "/metrics") {
        run.bpf = program_stats(&metrics);
        run.engine_runs = engine_runs(&metrics);
    }
    run.lost_pods = lost_pods(node);
    let mut log = stop(agent)?;
    run.problems = log
        .problems()
        .iter()
        .map(|line| line["message"].as_str().unwrap_or_default().to_owned())
        .collect();
    Ok(log)
}

/// Whom the agent killed, and what woke and what it saw at its first
/// decision.
fn fill_outcome(run: &mut Run, log: &mut AgentLog) {
    run.victims = log
        .all("pod killed")
        .iter()
        .filter_map(|l| l["victim"].as_str().map(str::to_owned))
        .collect();
    let decided = log.all("eviction decided");
    let first = decided.first();
    run.trigger = first.and_then(|l| l["trigger"].as_str().map(str::to_owned));
    run.decided_signal = first.and_then(|l| l["signal"].as_str().map(str::to_owned));
    run.decided_available = first.and_then(|l| l["observed"].as_i64());
}

/// Decision, kill and memory-back times from the agent's log.
fn fill_times(run: &mut Run, log: &mut AgentLog, crossed: u64) {
    let killed = log.all("pod killed");
    let decided = log.all("eviction decided");
    let first = decided.first();
    let at = |line: Option<&Value>, field: &str| {
        line.and_then(|l| l[field].as_u64())
            .map(|ns| relative_us(ns, crossed))
    };
    run.noticed_us = at(first, "trigger_at_ns");
    run.decided_us = at(first, "at_ns");
    run.decision_us = first.and_then(|l| {
        let (at, trigger) = (l["at_ns"].as_u64()?, l["trigger_at_ns"].as_u64()?);
        Some(relative_us(at, trigger))
    });
    let took = |field: &str| first.and_then(|l| l[field].as_u64()).map(|us| us as f64);
    run.woken_to_run_us = took("woken_to_run_us");
    run.observe_us = took("observe_us");
    run.list_us = took("list_us");
    run.rank_us = took("rank_us");
    run.exact_read_us = took("exact_read_us");
    run.exact_reads = first.and_then(|l| l["exact_reads"].as_u64());
    run.run_on_cpu_us = took("run_on_cpu_us");
    run.run_off_cpu_us = took("run_off_cpu_us");
    run.run_preempted = first.and_then(|l| l["run_preempted"].as_u64());
    run.run_blocked = first.and_then(|l| l["run_blocked"].as_u64());
    let decided_ns = first.and_then(|l| l["at_ns"].as_u64());
    run.hooks_attached_us = log
        .all("precise memory hooks")
        .iter()
        .rev()
        .filter(|l| l["state"] == "armed")
        .filter_map(|l| l["at_ns"].as_u64())
        .find(|&ns| decided_ns.is_none_or(|decided| ns <= decided))
        .map(|ns| relative_us(ns, crossed));
    run.killed_us = at(killed.first(), "at_ns");
    let back = log.all("memory back");
    run.agent_back_us = at(back.first(), "at_ns");
    run.agent_freed_bytes = back.first().and_then(|l| l["freed_bytes"].as_u64());
    run.kill_started_us = at(killed.first(), "kill_started_ns");
    let phase = |field: &str| {
        let after_us = killed.first()?[field].as_u64()?;
        Some(run.kill_started_us? + after_us as f64)
    };
    run.frozen_us = phase("frozen_after_us");
    run.sigkill_us = phase("sigkill_after_us");
    run.thawed_us = phase("thawed_after_us");
    run.released_us = phase("released_after_us");
    run.empty_us = phase("empty_after_us");
    run.freeze_holdouts = killed
        .first()
        .and_then(|l| l["freeze_holdouts"].as_str())
        .map(str::to_owned);
}

pub fn relative_us(ns: u64, origin: u64) -> f64 {
    (ns as f64 - origin as f64) / 1e3
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

/// CPU and memory of an agent with nothing to do.
#[derive(Debug, serde::Serialize)]
pub struct Idle {
    pub cpu_percent: f64,
    /// Resident now, after startup's transient BTF parsing was freed.
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    pub seconds: f64,
}

pub fn idle_overhead(args: &Args, mode: &str) -> Result<Idle> {
    let mut node = sandbox(args, 0)?;
    let agent = start_agent(
        args,
        &node,
        mode,
        &format!("memory.available<{}", args.threshold),
    )?;
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

/// CPU time of a process so far, in nanoseconds: its process CPU clock,
/// which keeps the time of threads that have exited (a sum over the live
/// threads' schedstat drops when a tokio blocking thread ends, and
/// /proc/pid/stat has only 10 ms ticks).
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let pid = libc::pid_t::try_from(pid)?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: writes one clockid_t into `clock`.
    let error = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
    if error != 0 {
        bail!(
            "CPU clock of {pid}: {}",
            std::io::Error::from_raw_os_error(error)
        );
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a clock id the kernel just gave, and a timespec to fill.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        bail!("CPU time of {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(Duration::new(
        u64::try_from(now.tv_sec)?,
        u32::try_from(now.tv_nsec)?,
    ))
}

/// A `/proc/pid/status` memory field (`VmRSS`, `VmHWM`), in bytes.
pub fn status_bytes(pid: u32, field: &str) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(kib * 1024)
}
