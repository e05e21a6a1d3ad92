//! A pod thrashing at its own memory limit, on the sandbox node far from
//! every threshold: the hog's pod cgroup is limited to what it holds plus
//! --thrashing-room, and it cycles through a cold file 12 % larger than that
//! room (every pass rereads from disk what the pass before pushed out); web,
//! limited the same way, cycles through a file half its room, which fits.
//! Timed from the hog's first pass (CLOCK_MONOTONIC, the agent's `at_ns`
//! clock): when the agent reports the hog thrashing and, with
//! `--thrashing-eviction`, when the hog is killed. Without the option a
//! run watches two more readings of the pods' counters after the report,
//! to show that nothing is evicted. A report or an eviction of web is a
//! false positive.
use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result, bail};
use evictd::node::stalls::{STALLS_INTERVAL, monotonic_now_ns};
use evictd_integration::{ColdFile, SandboxNode, wait_until};
use serde_json::Value;

use crate::{
    Args, MIB,
    runs::{BOMB, sandbox, start_agent, stop},
};

/// The neighbour whose working set fits its limit.
const NEIGHBOUR: &str = "web";
/// How long the first report may take: two readings of the counters once
/// the thrashing is steady, with room for a slow guest.
const REPORT_DEADLINE: Duration = Duration::from_secs(90);
/// How long the kill of a reported pod may take: its grace period (at
/// most --eviction-max-pod-grace-period, 0 here) and the kill.
const KILL_DEADLINE: Duration = Duration::from_secs(30);

/// What one thrashing run measured, in µs from the hog's first pass.
#[derive(Debug, Default, serde::Serialize)]
pub struct ThrashingRun {
    pub reported_us: Option<f64>,
    pub killed_us: Option<f64>,
    /// From the report: the hog's file refaults in the window, percent of
    /// its file pages, and its `full` stall share (v2).
    pub refaulted_percent: Option<u64>,
    pub stalled_percent: Option<u64>,
    /// `eviction decided` lines, and reports or evictions of the neighbour.
    pub evictions: usize,
    pub neighbour_reported: bool,
    pub neighbour_alive: bool,
}

impl ThrashingRun {
    pub fn summary(&self) -> String {
        let at = |us: Option<f64>| us.map_or("-".to_owned(), |us| format!("{:.1} s", us / 1e6));
        format!(
            "reported {}, killed {}, refaulted {}%, evictions {}{}",
            at(self.reported_us),
            at(self.killed_us),
            self.refaulted_percent
                .map_or("-".to_owned(), |p| p.to_string()),
            self.evictions,
            if self.neighbour_reported {
                ", NEIGHBOUR REPORTED"
            } else {
                ""
            },
        )
    }
}

/// The pod cgroup above pod `name`'s container, relative to the tree.
fn pod_cgroup(node: &SandboxNode, name: &str) -> Result<String> {
    let pod = node
        .pods
        .iter()
        .find(|pod| pod.name == name)
        .with_context(|| format!("no pod {name}"))?;
    let container = format!("node/{}", pod.container);
    let parent = Path::new(&container)
        .parent()
        .with_context(|| format!("{container} has no parent"))?;
    Ok(parent.display().to_string())
}

/// Limits pod `name` to what it is charged now plus `room`, and has it
/// cycle through `file`.
fn cycle_within(node: &mut SandboxNode, name: &str, room: u64, file: &ColdFile) -> Result<()> {
    let cgroup = pod_cgroup(node, name)?;
    let held = node.tree.memory_usage(&cgroup)?;
    node.tree.set_memory_limit(&cgroup, held + room)?;
    let answer = node
        .workload(name)?
        .command(&format!("cycle {}", file.path()))?;
    if answer != "cycling" {
        bail!("{name} answered {answer:?} to cycle");
    }
    Ok(())
}

pub fn run(args: &Args, mode: &str) -> Result<ThrashingRun> {
    let dir = args
        .thrashing_dir
        .as_deref()
        .context("the thrashing scenario needs --thrashing-dir")?;
    let room = args.thrashing_room;
    let thrashing_file = ColdFile::new(dir, "thrashes", room / MIB * MIB * 9 / 8)?;
    let fitting_file = ColdFile::new(dir, "fits", room / 2)?;
    let mut node = sandbox(args, 0)?;
    let threshold = format!("memory.available<{}", args.threshold);
    let agent = start_agent(args, &node, mode, &threshold)?;
    cycle_within(&mut node, NEIGHBOUR, room, &fitting_file)?;
    let started_ns = monotonic_now_ns();
    cycle_within(&mut node, BOMB, room, &thrashing_file)?;
    let since = |line: &Value| {
        line["at_ns"]
            .as_u64()
            .map(|at| at.saturating_sub(started_ns) as f64 / 1e3)
    };
    let mut agent = agent;
    let hog = format!("default/{BOMB}");
    let mut report = None;
    let _ = wait_until(REPORT_DEADLINE, "the hog reported thrashing", || {
        report = agent
            .log
            .all("pod thrashing at its memory limit")
            .into_iter()
            .find(|line| line["pod"] == hog.as_str());
        report.is_some()
    });
    let mut run = ThrashingRun::default();
    if let Some(report) = &report {
        run.reported_us = since(report);
        run.refaulted_percent = report["refaulted_percent"].as_u64();
        run.stalled_percent = report["stalled_percent"].as_u64();
        if mode.contains("thrashing-eviction") {
            let mut killed = None;
            let _ = wait_until(KILL_DEADLINE, "the hog killed", || {
                killed = agent
                    .log
                    .all("pod killed")
                    .into_iter()
                    .find(|line| line["victim"] == hog.as_str());
                killed.is_some()
            });
            run.killed_us = killed.as_ref().and_then(since);
        } else {
            // Two more readings: what the default does with it (nothing).
            std::thread::sleep(STALLS_INTERVAL * 2);
        }
    }
    run.neighbour_alive = node.alive(NEIGHBOUR);
    let log = stop(agent)?;
    let neighbour = format!("default/{NEIGHBOUR}");
    run.evictions = log
        .seen
        .iter()
        .filter(|line| line["message"] == "eviction decided")
        .count();
    run.neighbour_reported = log.seen.iter().any(|line| {
        (line["message"] == "pod thrashing at its memory limit"
            && line["pod"] == neighbour.as_str())
            || (line["message"] == "eviction decided" && line["victim"] == neighbour.as_str())
    });
    if report.is_none() {
        bail!("the hog was not reported thrashing within {REPORT_DEADLINE:?}");
    }
    Ok(run)
}
