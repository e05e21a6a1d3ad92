//! Prometheus metrics; `report::endpoint` serves them. The ground
//! floor: every stage may count here, and this module imports no other.
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::{
    CounterVec, Encoder as _, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
    core::{Collector, Desc},
    proto::MetricFamily,
};

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("registering metric: {0}")]
    Register(#[from] prometheus::Error),
}

/// Every metric evictd exports.
pub struct Metrics {
    registry: Registry,
    /// Ring-buffer records by kind (`crossing`, `oom_victim`, ...).
    pub events: IntCounterVec,
    /// Records that did not decode (a kernel/agent version mismatch).
    pub decode_errors: IntCounter,
    /// Records the kernel could not queue because the ring buffer was full.
    pub ringbuf_drops: IntCounter,
    /// Page-counter reads the memory programs made.
    pub kernel_memory_checks: IntCounter,
    /// Kernel reads that failed (a struct layout problem if it grows).
    pub kernel_read_errors: IntCounter,
    /// Kernel timestamp to userspace read of each record.
    pub event_latency: Histogram,
    /// Threshold crossings by resource, direction and source
    /// (`kernel`, `resync`, `poll`).
    pub crossings: IntCounterVec,
    /// Current value of each watched scope from cgroupfs (bytes or tasks).
    pub scope_value: IntGaugeVec,
    /// kubelet's working set of each memory scope.
    pub scope_working_set: IntGaugeVec,
    /// Thresholds each scope currently has crossed.
    pub scope_level: IntGaugeVec,
    /// Kernel OOM killer victims.
    pub oom_kills: IntCounter,
    /// 1 for the trigger in use per resource (`memory`, `pids`, `oom_kills`,
    /// `cgroups`): `bpf`, `poll` or `none`.
    pub trigger: IntGaugeVec,
    /// 1 for the kernel hook behind a `bpf` trigger (`lru-insertion`,
    /// `memcg-stat`, `page-alloc`, ...), per resource.
    pub trigger_hook: IntGaugeVec,
    /// Runs of each eBPF program (counted while kernel.bpf_stats_enabled=1).
    pub program_runs: IntGaugeVec,
    /// Total run time of each eBPF program, nanoseconds (same condition).
    pub program_run_time: IntGaugeVec,
    /// Pods evicted (or, with --dry-run, that would have been) by signal,
    /// QoS class and kill reason (`threshold`, `fork-rate`, `pod-limit`).
    pub evictions: IntCounterVec,
    /// Evictions that failed (the kill did not complete).
    pub eviction_failures: IntCounterVec,
    /// Pre-kill hook runs by outcome (`done`, `failed`, `timeout`), and
    /// hard evictions that ran none (`skipped`).
    pub pre_kill_hooks: IntCounterVec,
    /// KEP-5986's stage 1 by outcome: a container's memory.high raised to
    /// its memory.max (`relaxed`), the write refused (`failed`), or only
    /// said (`dry-run`).
    pub memory_high_relaxations: IntCounterVec,
    /// Decisions held back by a safeguard (`budget`: --eviction-budget
    /// spent; `outside-pods`: a kill did not give the node back what the
    /// pod held).
    pub evictions_held: IntCounterVec,
    /// 1 while evictions for a signal are held because its pressure is
    /// outside the pods.
    pub pressure_outside_pods: IntGaugeVec,
    /// Trigger (kernel record timestamp, or the timer tick) to the decision.
    pub decision_latency: Histogram,
    /// Trigger to the first SIGKILL (or SIGTERM) of the victim.
    pub trigger_to_kill: Histogram,
    /// 1 while a node condition is reported (MemoryPressure, DiskPressure,
    /// PIDPressure), else 0.
    pub node_condition: IntGaugeVec,
    /// Latest observation of every eviction signal (available amount).
    pub signal_available: IntGaugeVec,
    /// Engine runs by trigger (`startup`, `kernel`, `resync`, `poll`,
    /// `close-watch`, `psi`, `memcg-threshold`, `eviction-ended`, `zone`).
    pub engine_runs: IntCounterVec,
    /// Seconds from the agent's start to protection: programs attached,
    /// scopes watched, the first engine run about to begin.
    pub startup: Gauge,
    /// 1 while /readyz answers ready: the node looked at and, under
    /// pressure, relieved, once after the start.
    pub ready: IntGauge,
    /// 1 for a resource event mode polls because its kernel hook is
    /// unavailable, by resource.
    pub trigger_fallback: IntGaugeVec,
    /// Pods bound to this node that the Kubernetes API has shown evictd.
    pub kube_pods: IntGauge,
    /// Failed Kubernetes API requests by verb, resource and reason
    /// (`Forbidden`, `Unreachable`, `Timeout`, the server's Status reason).
    pub kube_api_errors: IntCounterVec,
    /// Eviction reports by --eviction-action and result (`reported`,
    /// `pod-gone`, `failed`, `dropped`).
    pub eviction_reports: IntCounterVec,
    /// 1 while the precise memory hooks are attached.
    pub precise_hooks_armed: IntGauge,
    /// Attachments and detachments of the precise memory hooks, by the state
    /// reached (`armed`, `disarmed`) and why.
    pub precise_hooks_transitions: IntCounterVec,
    /// Eviction reports in the journal, not yet final in the API.
    pub eviction_reports_pending: IntGauge,
    /// Versions of the --pod-metadata file that could not be used, by
    /// reason (`unreadable`, `malformed`); the last good copy answered.
    pub pod_metadata_reload_failures: IntCounterVec,
    /// 1 while lookups are answered from the last good copy of the
    /// --pod-metadata file because the current one cannot be used.
    pub pod_metadata_stale: IntGauge,
    /// Connections open on the HTTP endpoint.
    pub http_connections: IntGauge,
    /// Connections the HTTP endpoint closed before answering, by reason:
    /// `displaced` (a slow client made room for a new one), `refused`
    /// (every slot was busy answering), `header-timeout`, `deadline`.
    pub http_connections_closed: IntCounterVec,
    /// 1 while the container runtime (--container-runtime-endpoint)
    /// answers, by endpoint; no series without one.
    pub container_runtime_connected: IntGaugeVec,
    /// Failed calls to the container runtime, by CRI method (`Connect` for
    /// the connection itself).
    pub container_runtime_errors: IntCounterVec,
    /// What node-level reclaim removed through the runtime before any
    /// eviction for disk, by kind (`container`, `image`).
    pub node_reclaim_removals: IntCounterVec,
    /// Pods whose logs and volumes the last disk reading could not walk
    /// whole, by why (`unreadable`, `entries`, `depth`, `time`).
    pub pods_disk_usage_incomplete: IntGaugeVec,
    /// How long each reading of the pods' disk usage took.
    pub disk_usage_reading: Histogram,
    /// Readings of the pods' disk usage still under way past their 10 s
    /// freshness window.
    pub disk_usage_readings_late: IntCounter,
    /// Each pod's refaults, activations, memory stalls and thrashing.
    pub pod_memory: PodMemorySeries,
}

/// A pod's kernel totals, each absent where the kernel keeps none:
/// `[anon, file]` refaults and activations, `[some, full]` microseconds
/// stalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PodMemoryTotals {
    pub refaults: [Option<u64>; 2],
    pub activations: [Option<u64>; 2],
    pub stalled_us: [Option<u64>; 2],
}

/// One pod's memory series in a reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodMemoryRow {
    pub namespace: String,
    pub pod: String,
    pub totals: PodMemoryTotals,
    /// Whether the pod thrashes at its own memory limit; `None` for a pod
    /// without one (no series).
    pub thrashing: Option<bool>,
}

/// Every pod's memory series, replaced whole by each reading: a scrape
/// sees one reading for every pod, never a pod whose series are still
/// being set (a scrape beside the first reading once found a pod's
/// refaults and stalls without its activations), and a pod gone from a
/// reading leaves no series.
#[derive(Clone)]
pub struct PodMemorySeries {
    /// Never filled: the families the registry is told of.
    described: PodMemoryFamilies,
    published: Arc<Mutex<Arc<PodMemoryFamilies>>>,
}

#[derive(Clone)]
struct PodMemoryFamilies {
    /// Workingset refaults by page kind, as memory.stat counts them.
    refaults: IntCounterVec,
    /// Refaulted pages activated at once (v2), by page kind.
    activations: IntCounterVec,
    /// Seconds some or all of the pod's tasks stalled on memory (v2).
    stall: CounterVec,
    /// 1 while the pod thrashes at its own memory limit
    /// ([`crate::decide::thrashing`]), for every pod with a limit.
    thrashing: IntGaugeVec,
}

const PAGE_KINDS: [&str; 2] = ["anon", "file"];
const STALL_KINDS: [&str; 2] = ["some", "full"];

impl PodMemoryFamilies {
    fn new() -> Result<Self, prometheus::Error> {
        let by_kind = ["namespace", "pod", "kind"];
        Ok(Self {
            refaults: IntCounterVec::new(
                Opts::new(
                    "pod_memory_refaults_total",
                    "Pages of a pod faulted back in soon after reclaim (memory.stat workingset_refault_*), by kind (anon, file)",
                ),
                &by_kind,
            )?,
            activations: IntCounterVec::new(
                Opts::new(
                    "pod_memory_activations_total",
                    "Refaulted pages of a pod activated at once (memory.stat workingset_activate_*, cgroup v2), by kind (anon, file)",
                ),
                &by_kind,
            )?,
            stall: CounterVec::new(
                Opts::new(
                    "pod_memory_stall_seconds_total",
                    "Seconds some or all of a pod's tasks stalled on memory (memory.pressure total, cgroup v2), by kind (some, full)",
                ),
                &by_kind,
            )?,
            thrashing: IntGaugeVec::new(
                Opts::new(
                    "pod_memory_thrashing",
                    "1 while a pod thrashes at its own memory limit (file refaults or full memory stall over the last 10 s past --thrashing-*-limit), else 0",
                ),
                &["namespace", "pod"],
            )?,
        })
    }

    fn collectors(&self) -> [&dyn Collector; 4] {
        [
            &self.refaults,
            &self.activations,
            &self.stall,
            &self.thrashing,
        ]
    }
}

impl PodMemorySeries {
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            described: PodMemoryFamilies::new()?,
            published: Arc::new(Mutex::new(Arc::new(PodMemoryFamilies::new()?))),
        })
    }

    /// Makes `rows` every pod's series: a counter is the kernel's total (a
    /// total below the last, the pod's cgroup made again under the same
    /// name, is the counter reset Prometheus takes it for), and a total the
    /// kernel does not keep has no series.
    pub(crate) fn publish(&self, rows: &[PodMemoryRow]) -> Result<(), MetricsError> {
        let families = PodMemoryFamilies::new()?;
        for row in rows {
            let (namespace, pod) = (row.namespace.as_str(), row.pod.as_str());
            let pages = [
                (&families.refaults, row.totals.refaults),
                (&families.activations, row.totals.activations),
            ];
            for (counters, totals) in pages {
                for (kind, total) in PAGE_KINDS.iter().zip(totals) {
                    if let Some(total) = total {
                        counters
                            .with_label_values(&[namespace, pod, kind])
                            .inc_by(total);
                    }
                }
            }
            for (kind, total_us) in STALL_KINDS.iter().zip(row.totals.stalled_us) {
                if let Some(total_us) = total_us {
                    families
                        .stall
                        .with_label_values(&[namespace, pod, kind])
                        .inc_by(total_us as f64 / 1e6);
                }
            }
            if let Some(thrashing) = row.thrashing {
                families
                    .thrashing
                    .with_label_values(&[namespace, pod])
                    .set(i64::from(thrashing));
            }
        }
        *self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(families);
        Ok(())
    }
}

impl Collector for PodMemorySeries {
    fn desc(&self) -> Vec<&Desc> {
        self.described
            .collectors()
            .into_iter()
            .flat_map(|family| family.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let published = Arc::clone(
            &self
                .published
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        published
            .collectors()
            .into_iter()
            .flat_map(|family| family.collect())
            .collect()
    }
}

impl Metrics {
    pub fn new() -> Result<Arc<Self>, MetricsError> {
        let registry = Registry::new_custom(Some("evictd".into()), None)?;
        let counter_vec = |name: &str, help: &str, labels: &[&str]| -> Result<_, MetricsError> {
            let metric = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(metric.clone()))?;
            Ok(metric)
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| -> Result<_, MetricsError> {
            let metric = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(metric.clone()))?;
            Ok(metric)
        };
        let counter = |name: &str, help: &str| -> Result<_, MetricsError> {
            let metric = IntCounter::new(name, help)?;
            registry.register(Box::new(metric.clone()))?;
            Ok(metric)
        };
        // 5 µs .. ~0.3 s: the ring buffer is read within microseconds when
        // the agent keeps up; the tail shows when it does not.
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "event_latency_seconds",
                "Kernel timestamp to userspace read of each ring-buffer record",
            )
            .buckets(prometheus::exponential_buckets(5e-6, 2.0, 16)?),
        )?;
        registry.register(Box::new(latency.clone()))?;
        // 10 µs .. ~0.65 s: a decision on fresh reads takes well under a
        // millisecond; polling puts it seconds after the pressure began,
        // which the top bucket (+Inf) shows.
        let latency_histogram = |name: &str, help: &str| -> Result<_, MetricsError> {
            let metric = Histogram::with_opts(
                HistogramOpts::new(name, help)
                    .buckets(prometheus::exponential_buckets(1e-5, 2.0, 17)?),
            )?;
            registry.register(Box::new(metric.clone()))?;
            Ok(metric)
        };
        Ok(Arc::new(Self {
            evictions: counter_vec(
                "evictions_total",
                "Pods evicted by signal, QoS class and kill reason (with --dry-run: would have been)",
                &["signal", "qos", "reason"],
            )?,
            eviction_failures: counter_vec(
                "eviction_failures_total",
                "Evictions whose kill did not complete, by signal and kill reason",
                &["signal", "reason"],
            )?,
            pre_kill_hooks: counter_vec(
                "pre_kill_hooks_total",
                "Pre-kill hook runs by outcome (done, failed, timeout; skipped: a hard eviction runs none)",
                &["outcome"],
            )?,
            memory_high_relaxations: counter_vec(
                "memory_high_relaxations_total",
                "Containers under memory pressure whose memory.high was raised to their memory.max (KEP-5986 stage 1), by outcome (relaxed, failed, dry-run)",
                &["outcome"],
            )?,
            evictions_held: counter_vec(
                "evictions_held_total",
                "Evictions held back by a safeguard (budget, outside-pods, disk-usage-unknown)",
                &["reason"],
            )?,
            pressure_outside_pods: gauge_vec(
                "pressure_outside_pods",
                "1 while evictions for a signal are held because a kill did not give the node back what the pod held",
                &["signal"],
            )?,
            decision_latency: latency_histogram(
                "decision_latency_seconds",
                "Trigger (kernel record or timer tick) to eviction decision",
            )?,
            trigger_to_kill: latency_histogram(
                "trigger_to_kill_seconds",
                "Trigger (kernel record or timer tick) to the first signal sent to the victim",
            )?,
            node_condition: gauge_vec(
                "node_condition",
                "1 while the node condition is reported",
                &["condition"],
            )?,
            engine_runs: counter_vec(
                "engine_runs_total",
                "Eviction engine runs by trigger (startup, kernel, resync, poll, close-watch, psi, memcg-threshold, eviction-ended, zone)",
                &["trigger"],
            )?,
            startup: {
                let metric = Gauge::new(
                    "startup_seconds",
                    "Seconds from the agent's start to protection: programs attached, scopes watched, first engine run",
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            ready: {
                let metric = IntGauge::new(
                    "ready",
                    "1 while /readyz answers ready: the node looked at and, under pressure, relieved",
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            trigger_fallback: gauge_vec(
                "trigger_fallback",
                "1 for a resource event mode polls because its kernel hook is unavailable",
                &["resource"],
            )?,
            signal_available: gauge_vec(
                "signal_available",
                "Latest observation of an eviction signal: bytes, inodes or PIDs available",
                &["signal"],
            )?,
            events: counter_vec("bpf_events_total", "Ring-buffer records by kind", &["kind"])?,
            precise_hooks_armed: {
                let metric = IntGauge::new(
                    "precise_hooks_armed",
                    "1 while the precise memory hooks (every page charged and freed) are attached",
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            precise_hooks_transitions: counter_vec(
                "precise_hooks_transitions_total",
                "Attachments and detachments of the precise memory hooks, by state reached and reason",
                &["state", "reason"],
            )?,
            decode_errors: counter(
                "bpf_decode_errors_total",
                "Ring-buffer records that did not decode",
            )?,
            ringbuf_drops: counter(
                "ringbuf_drops_total",
                "Records the kernel dropped because the ring buffer was full",
            )?,
            kernel_memory_checks: counter(
                "kernel_memory_checks_total",
                "Page-counter reads by the memory programs",
            )?,
            kernel_read_errors: counter(
                "kernel_read_errors_total",
                "Kernel memory reads by the programs that failed",
            )?,
            event_latency: latency,
            crossings: counter_vec(
                "threshold_crossings_total",
                "Threshold crossings by resource, direction and source",
                &["resource", "direction", "source"],
            )?,
            scope_value: gauge_vec(
                "scope_value",
                "Current value of a watched scope from cgroupfs (bytes for memory, tasks for pids)",
                &["scope", "resource"],
            )?,
            scope_working_set: gauge_vec(
                "scope_memory_working_set_bytes",
                "kubelet's working set (usage - inactive_file) of a watched memory scope",
                &["scope"],
            )?,
            scope_level: gauge_vec(
                "scope_thresholds_crossed",
                "Number of thresholds a watched scope is above",
                &["scope", "resource"],
            )?,
            oom_kills: counter(
                "kernel_oom_kills_total",
                "Victims chosen by the kernel OOM killer",
            )?,
            trigger: gauge_vec(
                "trigger_info",
                "Trigger in use per resource: bpf (kernel-pushed), poll, or none",
                &["resource", "trigger"],
            )?,
            trigger_hook: gauge_vec(
                "trigger_hook_info",
                "Kernel hook behind each bpf trigger, per resource",
                &["resource", "hook"],
            )?,
            program_runs: gauge_vec(
                "bpf_program_runs",
                "Runs of each eBPF program since load (counted while kernel.bpf_stats_enabled=1)",
                &["program"],
            )?,
            program_run_time: gauge_vec(
                "bpf_program_run_time_nanoseconds",
                "Total run time of each eBPF program since load (counted while kernel.bpf_stats_enabled=1)",
                &["program"],
            )?,
            kube_pods: {
                let metric = IntGauge::new(
                    "kube_pods",
                    "Pods bound to this node known from the Kubernetes API",
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            kube_api_errors: counter_vec(
                "kube_api_errors_total",
                "Failed Kubernetes API requests by verb, resource and reason",
                &["verb", "resource", "reason"],
            )?,
            eviction_reports: counter_vec(
                "eviction_reports_total",
                "Evictions reported to the Kubernetes API by action and result",
                &["action", "result"],
            )?,
            pod_metadata_reload_failures: counter_vec(
                "pod_metadata_reload_failures_total",
                "Versions of the --pod-metadata file that could not be used (the last good copy answered), by reason",
                &["reason"],
            )?,
            container_runtime_connected: gauge_vec(
                "container_runtime_connected",
                "1 while the container runtime (--container-runtime-endpoint) answers, by endpoint",
                &["endpoint"],
            )?,
            container_runtime_errors: counter_vec(
                "container_runtime_errors_total",
                "Failed calls to the container runtime, by CRI method (Connect for the connection)",
                &["call"],
            )?,
            node_reclaim_removals: counter_vec(
                "node_reclaim_removals_total",
                "Dead containers and unused images removed through the container runtime before evicting for disk, by kind",
                &["kind"],
            )?,
            pods_disk_usage_incomplete: gauge_vec(
                "pods_disk_usage_incomplete",
                "Pods whose logs and volumes the last disk reading could not walk whole (their figures are lower bounds), by reason",
                &["reason"],
            )?,
            // 1 ms .. ~65 s: a few pods read in milliseconds; a reading past
            // the 10 s freshness window is late.
            disk_usage_reading: {
                let metric = Histogram::with_opts(
                    HistogramOpts::new(
                        "disk_usage_reading_seconds",
                        "How long each reading of the pods' disk usage (CRI calls and the walk of their logs and volumes) took",
                    )
                    .buckets(prometheus::exponential_buckets(1e-3, 2.0, 17)?),
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            disk_usage_readings_late: counter(
                "disk_usage_readings_late_total",
                "Readings of the pods' disk usage still under way past their 10 s freshness window",
            )?,
            eviction_reports_pending: {
                let metric = IntGauge::new(
                    "eviction_reports_pending",
                    "Eviction reports in the journal, waiting for the Kubernetes API",
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            http_connections: {
                let metric = IntGauge::new(
                    "http_connections",
                    "Connections open on the metrics endpoint",
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            http_connections_closed: counter_vec(
                "http_connections_closed_total",
                "Connections the metrics endpoint closed before answering, by reason (displaced, refused, header-timeout, deadline)",
                &["reason"],
            )?,
            pod_memory: {
                let series = PodMemorySeries::new()?;
                registry.register(Box::new(series.clone()))?;
                series
            },
            pod_metadata_stale: {
                let metric = IntGauge::new(
                    "pod_metadata_stale",
                    "1 while pod metadata comes from the last good copy of the --pod-metadata file",
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            registry,
        }))
    }

    pub(crate) fn render(&self) -> String {
        let mut buffer = Vec::new();
        // Encoding into a Vec cannot fail for well-formed registries.
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8_lossy(&buffer).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_with_the_evictd_prefix() {
        let metrics = Metrics::new().unwrap();
        metrics.events.with_label_values(&["crossing"]).inc();
        metrics.event_latency.observe(12e-6);
        let text = metrics.render();
        assert!(
            text.contains("evictd_bpf_events_total{kind=\"crossing\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("evictd_event_latency_seconds_bucket{le=\"0.00002\"} 1"),
            "{text}"
        );
    }

    /// The pods on a metrics page that have series of `family`.
    fn pods_in(page: &str, family: &str) -> std::collections::BTreeSet<String> {
        page.lines()
            .filter(|line| line.starts_with(family))
            .filter_map(|line| line.split("pod=\"").nth(1)?.split('"').next())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_scrape_beside_a_reading_sees_every_pod_whole() {
        let metrics = Metrics::new().unwrap();
        let totals = PodMemoryTotals {
            refaults: [Some(1), Some(2)],
            activations: [Some(3), Some(4)],
            stalled_us: [Some(5), Some(6)],
        };
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // New pods at every reading, so each one's series are made
                // while the page is rendered.
                for reading in 0..200 {
                    let rows: Vec<PodMemoryRow> = (0..20)
                        .map(|n| PodMemoryRow {
                            namespace: "ns".into(),
                            pod: format!("{reading}-{n}"),
                            totals,
                            thrashing: Some(false),
                        })
                        .collect();
                    metrics.pod_memory.publish(&rows).unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::Release);
            });
            let mut pages = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) || pages == 0 {
                let page = metrics.render();
                let refaulted = pods_in(&page, "evictd_pod_memory_refaults_total");
                assert_eq!(refaulted.len() % 20, 0, "{page}");
                for family in [
                    "evictd_pod_memory_activations_total",
                    "evictd_pod_memory_stall_seconds_total",
                    "evictd_pod_memory_thrashing",
                ] {
                    assert_eq!(pods_in(&page, family), refaulted, "{family}: {page}");
                }
                pages += 1;
            }
        });
    }

    /// Every metric name evictd exports, from the collectors themselves.
    fn exported_names(metrics: &Metrics) -> std::collections::BTreeSet<String> {
        use prometheus::core::Collector;
        let collectors: [&dyn Collector; 44] = [
            &metrics.events,
            &metrics.decode_errors,
            &metrics.ringbuf_drops,
            &metrics.kernel_memory_checks,
            &metrics.kernel_read_errors,
            &metrics.event_latency,
            &metrics.crossings,
            &metrics.scope_value,
            &metrics.scope_working_set,
            &metrics.scope_level,
            &metrics.oom_kills,
            &metrics.trigger,
            &metrics.trigger_hook,
            &metrics.program_runs,
            &metrics.program_run_time,
            &metrics.evictions,
            &metrics.eviction_failures,
            &metrics.pre_kill_hooks,
            &metrics.evictions_held,
            &metrics.pressure_outside_pods,
            &metrics.decision_latency,
            &metrics.trigger_to_kill,
            &metrics.node_condition,
            &metrics.signal_available,
            &metrics.engine_runs,
            &metrics.startup,
            &metrics.ready,
            &metrics.trigger_fallback,
            &metrics.kube_pods,
            &metrics.kube_api_errors,
            &metrics.eviction_reports,
            &metrics.eviction_reports_pending,
            &metrics.pod_metadata_reload_failures,
            &metrics.pod_metadata_stale,
            &metrics.http_connections,
            &metrics.http_connections_closed,
            &metrics.container_runtime_connected,
            &metrics.container_runtime_errors,
            &metrics.node_reclaim_removals,
            &metrics.pods_disk_usage_incomplete,
            &metrics.disk_usage_reading,
            &metrics.disk_usage_readings_late,
            &metrics.pod_memory,
            &metrics.memory_high_relaxations,
        ];
        collectors
            .iter()
            .flat_map(|c| c.desc())
            // The registry adds the prefix when it gathers.
            .map(|desc| format!("evictd_{}", desc.fq_name))
            .collect()
    }

    #[test]
    fn the_dashboard_queries_only_metrics_evictd_exports() {
        let dashboard: serde_json::Value = serde_json::from_str(include_str!(
            "../../deploy/monitoring/grafana-dashboard.json"
        ))
        .unwrap();
        let exported = exported_names(&Metrics::new().unwrap());
        let mut queried = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                let names = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|word| word.starts_with("evictd_"));
                for name in names {
                    let family = ["_bucket", "_sum", "_count"]
                        .iter()
                        .find_map(|suffix| name.strip_suffix(suffix))
                        .filter(|family| exported.contains(*family))
                        .unwrap_or(name);
                    assert!(
                        exported.contains(family),
                        "panel {:?} queries {name}, which evictd does not export",
                        panel["title"]
                    );
                    queried += 1;
                }
            }
        }
        // Every exported metric is on the dashboard somewhere.
        let text = serde_json::to_string(&dashboard).unwrap();
        for name in &exported {
            assert!(text.contains(name.as_str()), "{name} is on no panel");
        }
        assert!(queried >= exported.len());
    }
}
