//! What the kernel side tells the operator: the kernel OOM killer's victims
//! and the programs' own counters (records dropped by a full ring buffer,
//! page-counter checks, read errors, run statistics).
use std::time::Duration;

use evictd_common::OomVictimEvent;
use tracing::warn;

use crate::{
    kernel::bpf::{DecodeError, KernelCounters, Probes},
    logs,
    metrics::Metrics,
};

/// Logs and counts a victim of the kernel OOM killer; `scope` is the
/// watched scope of its memory cgroup, if any.
pub fn oom_victim(
    metrics: &Metrics,
    victim: &OomVictimEvent,
    scope: Option<&str>,
    latency: Duration,
) {
    metrics.oom_kills.inc();
    let comm = String::from_utf8_lossy(victim.comm.split(|b| *b == 0).next().unwrap_or_default())
        .into_owned();
    warn!(
        pid = victim.pid,
        comm,
        memory_cgroup_id = victim.memory_cgroup_id,
        scope,
        rss_bytes = logs::bytes(victim.rss_bytes).logged(),
        latency_us = latency.as_micros() as u64,
        "kernel OOM killer chose a victim"
    );
}

/// Counts and logs a record that did not decode.
pub fn decode_error(metrics: &Metrics, error: &DecodeError) {
    metrics.decode_errors.inc();
    warn!(%error, "undecodable ring-buffer record");
}

/// The programs' counters as last exported, to export what changed.
#[derive(Debug, Default)]
pub(crate) struct CounterExport {
    last: KernelCounters,
}

impl CounterExport {
    /// Records dropped by a full ring buffer since the last look (the agent
    /// was busy, or stopped), logged and counted: one map read, cheap
    /// enough after every batch of records.
    pub(crate) fn new_drops(&mut self, probes: &Probes, metrics: &Metrics) -> u64 {
        let total = match probes.ringbuf_drops() {
            Ok(total) => total,
            Err(e) => {
                warn!(error = %e, "cannot read kernel counters");
                return 0;
            }
        };
        let drops = total.saturating_sub(self.last.ringbuf_drops);
        self.last.ringbuf_drops = total;
        report_drops(metrics, drops);
        drops
    }

    /// Brings every counter and the programs' run statistics into the
    /// metrics. Returns the records dropped since the last look.
    pub(crate) fn refresh(&mut self, probes: &Probes, metrics: &Metrics) -> u64 {
        let counters = match probes.counters() {
            Ok(counters) => counters,
            Err(e) => {
                warn!(error = %e, "cannot read kernel counters");
                return 0;
            }
        };
        let drops = counters
            .ringbuf_drops
            .saturating_sub(self.last.ringbuf_drops);
        report_drops(metrics, drops);
        metrics.kernel_memory_checks.inc_by(
            counters
                .memory_checks
                .saturating_sub(self.last.memory_checks),
        );
        metrics
            .kernel_read_errors
            .inc_by(counters.read_errors.saturating_sub(self.last.read_errors));
        self.last = counters;
        for stats in probes.program_stats() {
            metrics
                .program_runs
                .with_label_values(&[stats.program])
                .set(stats.runs as i64);
            metrics
                .program_run_time
                .with_label_values(&[stats.program])
                .set(stats.run_time.as_nanos() as i64);
        }
        drops
    }
}

fn report_drops(metrics: &Metrics, drops: u64) {
    if drops == 0 {
        return;
    }
    warn!(
        drops,
        "ring buffer was full and dropped records; resyncing from cgroupfs"
    );
    metrics.ringbuf_drops.inc_by(drops);
}
