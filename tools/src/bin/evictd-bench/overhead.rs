//! Workload overhead: what an attached agent costs a workload that is
//! nowhere near being evicted. A pod on the sandbox node repeats four
//! operations, the first three on --overhead-bytes of anonymous memory in
//! 4 KiB pages:
//!
//! - page faults: map fresh memory and write one byte of every page
//!   (one fault and one memcg charge per page);
//! - munmap of those pages (one uncharge per page);
//! - the SIGKILL of a process holding that much, until it is reaped (the
//!   kernel tears its address space down before the parent can reap it);
//! - [`FORKS`] children forked one after another, each exiting at once and
//!   reaped (a task born and freed each time: what the PID programs see).
//!
//! The agent watches `memory.available` and `pid.available` (below
//! --pid-threshold tasks, of a sandbox node's [`NODE_TASKS`]), as a node's
//! configuration does, so both its memory and its PID side are far from
//! their lines, or attached with `+hooks-always`.
//!
//! Each mode's agent attached is compared with no agent at all (the floor),
//! in the same run and interleaved with the modes, with
//! `kernel.bpf_stats_enabled` off as on a node (the kernel then counts no
//! program runs). Twice: with the node far
//! from every threshold (only the steady pods: available memory about 7×
//! the threshold), and close to the memory threshold: ballast in the pod
//! brings the node's available memory to threshold + bytes + 32 MiB before
//! each operation, so a touch takes it down to threshold + 32 MiB: every
//! operation runs within twice the threshold's distance and never crosses
//! it (an eviction there is a bench failure, counted in `evictions`).
use anyhow::{Context as _, Result};
use evictd::node::cgroupfs::CgroupFs;
use evictd_integration::{Agent, SandboxNode};

use crate::{
    Args, MIB, NO_AGENT,
    peer::{EARLYOOM, Earlyoom},
    runs::{BOMB, capacity, cpu_time, sandbox, start_agent, stop},
    stats::median,
};

/// Room left above the threshold at the fullest point of an operation
/// close to it: page tables, the killed child's own binary and the node's
/// page cache move the working set by a few MiB.
pub const NEAR_MARGIN: u64 = 32 * MIB;

/// The sandbox node's task limit in the overhead scenarios: the kernel's
/// default pid_max, so that pid.available is as far from its line as on a
/// node, past twice the PID zone's least width (its hooks detached).
const NODE_TASKS: u64 = 32_768;

/// Children forked per timed fork operation: a few tenths of a second of
/// forking on this host, long enough that a per-task cost of 1 µs shows.
pub const FORKS: u32 = 2000;

/// The operations' durations in one run, in ns, one entry per repetition.
#[derive(Debug, Default, serde::Serialize)]
pub struct OverheadRun {
    pub fault_ns: Vec<u64>,
    pub unmap_ns: Vec<u64>,
    pub kill_ns: Vec<u64>,
    pub fork_ns: Vec<u64>,
    /// The node's available memory (capacity − working set) before each
    /// touch, and with the touched pages held.
    pub available_before: Vec<i64>,
    pub available_touched: Vec<i64>,
    /// `eviction decided` lines: must be none.
    pub evictions: usize,
    /// The agent's WARN and ERROR lines.
    pub problems: Vec<String>,
    /// The agent's CPU time while the operations ran.
    pub agent_cpu_ms: f64,
}

impl OverheadRun {
    pub fn summary(&self) -> String {
        let ms = |values: &[u64]| {
            let values: Vec<f64> = values.iter().map(|ns| *ns as f64 / 1e6).collect();
            median(&values).map_or("-".to_owned(), |ms| format!("{ms:.1} ms"))
        };
        let lowest = self
            .available_touched
            .iter()
            .min()
            .map_or(0, |bytes| bytes / MIB as i64);
        let mut text = format!(
            "faults {}, munmap {}, SIGKILL {}, forks {} (medians); available down to {lowest} MiB",
            ms(&self.fault_ns),
            ms(&self.unmap_ns),
            ms(&self.kill_ns),
            ms(&self.fork_ns),
        );
        if self.evictions > 0 {
            text += &format!(", EVICTED {} TIMES", self.evictions);
        }
        text
    }
}

pub fn run(args: &Args, mode: &str, near: bool) -> Result<OverheadRun> {
    let bytes = args.overhead_bytes;
    let mut node = sandbox(args, 0)?;
    if !node.is_root() {
        // The private tree's own ceiling would bind first.
        node.tree.set_pids_limit("", NODE_TASKS)?;
        node.tree.set_pids_limit("node", NODE_TASKS)?;
    }
    let cgroupfs = CgroupFs::discover()?;
    let node_cgroup = node.node_cgroup();
    let capacity = capacity(args, &node)?;
    let available = || -> Result<i64> {
        let reading = cgroupfs.read_memory(&node_cgroup)?;
        Ok(capacity as i64 - reading.working_set_bytes() as i64)
    };
    if near {
        let target = (args.threshold + bytes + NEAR_MARGIN) as i64;
        // Twice: the first ballast brings its page tables along.
        for _ in 0..2 {
            let excess = available()? - target;
            if excess >= MIB as i64 {
                node.workload(BOMB)?.alloc(excess as u64)?;
            } else if excess <= -(MIB as i64) {
                node.workload(BOMB)?.free(excess.unsigned_abs())?;
            }
        }
    }
    let agent = match mode {
        NO_AGENT | EARLYOOM => None,
        _ => Some(start_agent(
            args,
            &node,
            mode,
            &format!(
                "memory.available<{},pid.available<{}",
                args.threshold, args.pid_threshold
            ),
        )?),
    };
    let peer = match (mode, args.earlyoom.as_deref()) {
        (EARLYOOM, Some(binary)) => Some(Earlyoom::start(binary, args.threshold)?),
        (EARLYOOM, None) => anyhow::bail!("the earlyoom row needs --earlyoom"),
        _ => None,
    };
    // One untimed round: the workload's first faults on fresh page tables
    // and the agent's first moments are not what is measured.
    operations(&mut node, bytes).context("warm-up")?;
    let cpu_before = agent.as_ref().map(|a| cpu_time(a.pid())).transpose()?;
    let mut run = OverheadRun::default();
    for _ in 0..args.overhead_reps {
        run.available_before.push(available()?);
        let workload = node.workload(BOMB)?;
        run.fault_ns.push(workload.touch(bytes)?.as_nanos() as u64);
        run.available_touched.push(available()?);
        let workload = node.workload(BOMB)?;
        run.unmap_ns.push(workload.unmap()?.as_nanos() as u64);
        run.kill_ns
            .push(workload.kill_large(bytes)?.as_nanos() as u64);
        run.fork_ns
            .push(workload.fork_exit(FORKS)?.as_nanos() as u64);
    }
    if let (Some(agent), Some(before)) = (agent, cpu_before) {
        finish(agent, before, &mut run)?;
    }
    if let Some(peer) = peer {
        // A kill by earlyoom is an eviction here as much as the agent's.
        run.evictions = peer.stop()?.pids.len();
    }
    Ok(run)
}

fn operations(node: &mut SandboxNode, bytes: u64) -> Result<()> {
    let workload = node.workload(BOMB)?;
    workload.touch(bytes)?;
    workload.unmap()?;
    workload.kill_large(bytes)?;
    workload.fork_exit(FORKS)?;
    Ok(())
}

fn finish(agent: Agent, cpu_before: std::time::Duration, run: &mut OverheadRun) -> Result<()> {
    run.agent_cpu_ms = cpu_time(agent.pid())?
        .saturating_sub(cpu_before)
        .as_secs_f64()
        * 1e3;
    let mut log = stop(agent)?;
    run.evictions = log.all("eviction decided").len();
    run.problems = log
        .problems()
        .iter()
        .map(|line| line["message"].as_str().unwrap_or_default().to_owned())
        .collect();
    Ok(())
}
