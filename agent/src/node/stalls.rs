//! Each pod's memory stalls and refaults: the kernel's cumulative counters
//! from its cgroup's memory.stat (`workingset_refault_*`,
//! `workingset_activate_*`) and, on v2, memory.pressure (`some` and `full`
//! `total=`, microseconds stalled), read every [`STALLS_INTERVAL`] at most
//! at a timer tick, never on a decision's path, and exported per pod.
//!
//! What each version has (Linux 6.18): v1's memory.stat carries
//! `workingset_refault_anon`/`_file` and the hierarchical
//! `total_workingset_refault_anon`/`_file` (a pod's pages are charged to
//! its containers' cgroups below it, so the `total_` ones), no
//! `workingset_activate_*` and no per-cgroup PSI. v2's memory.stat is
//! hierarchical and has all four; its memory.pressure has both lines.
//!
//! The files are the kernel's (a pod cannot write them), read bounded, and
//! a pod whose files do not parse is left out of one reading with a
//! warning; the others are read.
use std::{collections::HashMap, path::PathBuf, time::Duration};

use nix::time::{ClockId, clock_gettime};
use tracing::warn;

use crate::{
    decide::snapshot::MemoryStalls,
    decide::thrashing::{self, Thrashing, ThrashingLimits},
    metrics::{Metrics, PodMemoryRow, PodMemoryTotals},
    node::{
        cgroupfs::{CgroupError, CgroupVersion, StallTexts},
        stats::page_size,
    },
};

/// How often the pods' counters are read at most: cAdvisor's housekeeping
/// interval, at which kubelet's own pod stats are fresh. Two files a pod
/// (one on v1), so a few milliseconds for 250 pods every 10 s, while a
/// Prometheus scrape (15-60 s) still sees each reading.
pub const STALLS_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub(crate) enum StallsError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{path}: {problem}")]
    Malformed { path: PathBuf, problem: String },
}

/// The counters in `texts`, read from pod cgroup directory `dir` at
/// `read_at_ns`.
pub(crate) fn parse(
    texts: &StallTexts,
    version: CgroupVersion,
    read_at_ns: u64,
    dir: &std::path::Path,
) -> Result<MemoryStalls, StallsError> {
    let malformed = |file: &str, problem: String| StallsError::Malformed {
        path: dir.join(file),
        problem,
    };
    let mut stalls =
        parse_stat(&texts.stat, version).map_err(|problem| malformed("memory.stat", problem))?;
    if let Some(pressure) = &texts.pressure {
        let (some, full) =
            parse_pressure(pressure).map_err(|problem| malformed("memory.pressure", problem))?;
        stalls.pressure_some_us = Some(some);
        stalls.pressure_full_us = Some(full);
    }
    stalls.read_at_ns = read_at_ns;
    Ok(stalls)
}

/// The workingset counters of a memory.stat text, in one pass: a key the
/// kernel does not keep is absent; a key whose value is not a count is an
/// error.
fn parse_stat(text: &str, version: CgroupVersion) -> Result<MemoryStalls, String> {
    let prefix = match version {
        CgroupVersion::V1 => "total_",
        CgroupVersion::V2 => "",
    };
    let mut stalls = MemoryStalls::default();
    let (mut active_file, mut inactive_file) = (None, None);
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(key) = fields.next().and_then(|key| key.strip_prefix(prefix)) else {
            continue;
        };
        let slot = match key {
            "workingset_refault_anon" => &mut stalls.workingset_refault_anon,
            "workingset_refault_file" => &mut stalls.workingset_refault_file,
            "workingset_activate_anon" => &mut stalls.workingset_activate_anon,
            "workingset_activate_file" => &mut stalls.workingset_activate_file,
            "active_file" => &mut active_file,
            "inactive_file" => &mut inactive_file,
            _ => continue,
        };
        let value = fields.next().unwrap_or_default();
        *slot = Some(
            value
                .parse::<u64>()
                .map_err(|_| format!("{prefix}{key} is {value:?}, not a count"))?,
        );
    }
    stalls.file_bytes = active_file.zip(inactive_file).map(|(a, i)| a + i);
    Ok(stalls)
}

/// `some` and `full` totals (microseconds) of a memory.pressure text:
/// `some avg10=0.00 avg60=0.00 avg300=0.00 total=123` and a `full` line.
fn parse_pressure(text: &str) -> Result<(u64, u64), String> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let slot = match fields.next() {
            Some("some") => &mut some,
            Some("full") => &mut full,
            _ => continue,
        };
        let total = fields
            .find_map(|field| field.strip_prefix("total="))
            .ok_or_else(|| format!("no total in {line:?}"))?;
        *slot = Some(
            total
                .parse()
                .map_err(|_| format!("total {total:?} is not a count"))?,
        );
    }
    match (some, full) {
        (Some(some), Some(full)) => Ok((some, full)),
        _ => Err(format!("no some and full lines in {text:?}")),
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_now_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |now| Duration::from(now).as_nanos() as u64)
}

/// A pod as its metrics name it: namespace and name.
pub(crate) type PodLabels = [String; 2];

/// The last reading of every pod.
#[derive(Debug, Default)]
pub(crate) struct PodStalls {
    by_cgroup: HashMap<String, MemoryStalls>,
    last_read_ns: Option<u64>,
    thrashing_limits: ThrashingLimits,
}

impl PodStalls {
    /// Judges thrashing by `limits` from the next reading on.
    pub(crate) fn set_thrashing_limits(&mut self, limits: ThrashingLimits) {
        self.thrashing_limits = limits;
    }

    /// Pod cgroup `path`'s last reading.
    pub(crate) fn get(&self, path: &str) -> Option<MemoryStalls> {
        self.by_cgroup.get(path).copied()
    }

    /// Whether a reading is due at `now_ns`.
    pub(crate) fn due(&self, now_ns: u64) -> bool {
        self.last_read_ns
            .is_none_or(|last| now_ns.saturating_sub(last) >= STALLS_INTERVAL.as_nanos() as u64)
    }

    /// Takes `readings` (pod cgroup, labels, counters) made at `now_ns` as
    /// the pods' counters, exported as every pod's series: a pod not among
    /// them has none, so pods that come and go leave none behind. Returns the pods
    /// thrashing at their limit since their last reading, by cgroup.
    pub(crate) fn record(
        &mut self,
        readings: Vec<(String, PodLabels, MemoryStalls)>,
        now_ns: u64,
        metrics: Option<&Metrics>,
    ) -> Vec<(String, Thrashing)> {
        self.last_read_ns = Some(now_ns);
        let mut by_cgroup = HashMap::with_capacity(readings.len());
        let mut rows = Vec::with_capacity(readings.len());
        let mut thrashing = Vec::new();
        let page_size = page_size();
        for (cgroup, [namespace, pod], stalls) in readings {
            let found = self.by_cgroup.get(&cgroup).and_then(|before| {
                thrashing::judge(before, &stalls, page_size, self.thrashing_limits)
            });
            rows.push(PodMemoryRow {
                namespace,
                pod,
                totals: totals(&stalls),
                thrashing: stalls.limit_bytes.map(|_| found.is_some()),
            });
            if let Some(found) = found {
                thrashing.push((cgroup.clone(), found));
            }
            by_cgroup.insert(cgroup, stalls);
        }
        if let Some(metrics) = metrics
            && let Err(e) = metrics.pod_memory.publish(&rows)
        {
            warn!(error = %e, "cannot export the pods' memory series");
        }
        self.by_cgroup = by_cgroup;
        thrashing
    }
}

fn totals(stalls: &MemoryStalls) -> PodMemoryTotals {
    PodMemoryTotals {
        refaults: [
            stalls.workingset_refault_anon,
            stalls.workingset_refault_file,
        ],
        activations: [
            stalls.workingset_activate_anon,
            stalls.workingset_activate_file,
        ],
        stalled_us: [stalls.pressure_some_us, stalls.pressure_full_us],
    }
}

#[cfg(test)]
mod tests;
