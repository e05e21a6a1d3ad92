//! The loop that protects the node: a trigger (kernel crossing or timer)
//! -> fresh node signals -> [`Engine`] -> ranking -> kill -> wait until the
//! resource is back -> decide again. Kernel watches for the engine's
//! signals are re-armed from every fresh reading.
use std::{sync::Arc, time::Duration};

use tracing::{Instrument as _, info, info_span, warn};

use crate::{
    act::kill::{KillReport, Killer},
    config::EvictionAction,
    decide::engine::{Assessment, Choice, Engine, Starvation, VictimPolicy, observe_signals},
    decide::thresholds::{EvictionConfig, NodeCondition, Resource, Signal, Threshold},
    kernel::bpf::{Resource as KernelResource, monotonic_now_ns},
    node::cgroupfs::{CgroupError, CgroupFs},
    node::inventory::Inventory,
    node::snapshot::{NodeStats, PodSnapshot},
    report::kubernetes::{EvictOutcome, EvictionNotice, Kubernetes, StarvedSignal},
    report::metrics::Metrics,
    scopes::monitor::Monitor,
};

/// While a memory or PID signal is inside the zone where only a fresh read
/// can tell whether its threshold is met (usage past the point where the
/// working set could reach the threshold), or a soft threshold waits out
/// its grace period, the engine looks again this often. 20 ms: a hog
/// allocating 1 GiB/s moves 20 MiB in that time, well inside kubelet's
/// 100Mi default.
pub const CLOSE_WATCH_INTERVAL: Duration = Duration::from_millis(20);

/// How often a killed pod's cgroup is re-read while waiting for its memory
/// to come back.
const RECLAIM_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// A pod's memory counts as back once its working set is below this share
/// of what it was, or below [`RECLAIM_FLOOR_BYTES`].
const RECLAIM_REMAINING_SHARE: f64 = 0.05;
const RECLAIM_FLOOR_BYTES: u64 = 1 << 20;

/// How often the node's signals are re-read while waiting for disk to come
/// back after a kill.
const SIGNAL_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// What one decision achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Nothing killed: dry run, no evictable pod, a decision already
    /// reported, or a failed kill.
    Unacted,
    /// Killed, and the resource came back.
    Reclaimed,
    /// Killed, but the resource did not come back in time.
    NotBack,
}

/// Pods of the ranking a decision's log line explains.
const CANDIDATES_LOGGED: usize = 5;

/// Bound on decide-kill-verify rounds for one trigger, so a node where
/// kills do not help cannot keep the loop from serving events.
const MAX_ROUNDS_PER_TRIGGER: usize = 16;

/// What woke the engine.
#[derive(Debug, Clone, Copy)]
pub struct Trigger {
    /// `kernel`, `resync`, `poll` or `close-watch`.
    pub source: &'static str,
    /// CLOCK_MONOTONIC nanoseconds: the kernel record's timestamp, or when
    /// the timer fired.
    pub at_ns: u64,
}

impl Trigger {
    pub fn now(source: &'static str) -> Self {
        Self {
            source,
            at_ns: monotonic_now_ns(),
        }
    }

    fn elapsed(&self) -> Duration {
        Duration::from_nanos(monotonic_now_ns().saturating_sub(self.at_ns))
    }
}

#[derive(Debug, Clone, Copy)]
pub struct EvictorOptions {
    pub policy: VictimPolicy,
    pub dry_run: bool,
    pub reclaim_timeout: Duration,
    /// Arm kernel watches (event mode); in poll mode the timer is all.
    pub kernel_triggers: bool,
}

pub struct Evictor {
    engine: Engine,
    config: EvictionConfig,
    inventory: Inventory,
    killer: Killer,
    cgroupfs: CgroupFs,
    metrics: Arc<Metrics>,
    options: EvictorOptions,
    /// The API side (--node-name): where kills are reported.
    kubernetes: Option<Kubernetes>,
    /// Conditions reported by the last round, to log changes once.
    conditions: Vec<NodeCondition>,
    /// A decision that killed nothing (dry run, or no pod may go): reported
    /// once, not again on every run while the pressure lasts.
    unacted: Option<Vec<String>>,
}

impl Evictor {
    pub fn new(
        config: EvictionConfig,
        inventory: Inventory,
        killer: Killer,
        cgroupfs: CgroupFs,
        metrics: Arc<Metrics>,
        options: EvictorOptions,
        kubernetes: Option<Kubernetes>,
    ) -> Self {
        Self {
            engine: Engine::new(config.clone()),
            config,
            inventory,
            killer,
            cgroupfs,
            metrics,
            options,
            kubernetes,
            conditions: Vec::new(),
            unacted: None,
        }
    }

    /// Stops the API side, sending what reports it can within `within`.
    pub fn shutdown_kubernetes(&mut self, within: Duration) {
        if let Some(kubernetes) = self.kubernetes.take() {
            kubernetes.shutdown(within);
        }
    }

    /// Thaws pods a previous agent froze for a kill it never finished (it
    /// was killed itself): once, at startup.
    pub fn thaw_abandoned_pods(&mut self) {
        let pods = match self.inventory.pods() {
            Ok(pods) => pods,
            Err(e) => {
                warn!(error = %e, "cannot list the node's pods to thaw any left frozen");
                return;
            }
        };
        let cgroups: Vec<&str> = pods
            .iter()
            .filter_map(|pod| pod.cgroup.as_deref())
            .collect();
        for cgroup in self.killer.thaw_abandoned(&cgroups) {
            warn!(
                cgroup,
                "thawed a pod left frozen by an agent stopped in the middle of its kill"
            );
        }
    }

    /// Runs the engine on fresh numbers, evicting until no threshold needs
    /// reclaim (one victim per round unless --evict-set). Returns when the
    /// engine wants to look again sooner than the resync timer.
    pub async fn evaluate(&mut self, trigger: Trigger, monitor: &mut Monitor) -> Option<Duration> {
        for round in 0..MAX_ROUNDS_PER_TRIGGER {
            self.metrics
                .engine_runs
                .with_label_values(&[trigger.source])
                .inc();
            let node = match self.inventory.node() {
                Ok(node) => node,
                Err(e) => {
                    warn!(error = %e, "cannot read the node's signals");
                    return None;
                }
            };
            let assessment = self.engine.observe(engine_now(), &node);
            self.report_state(&assessment);
            if self.options.kernel_triggers {
                self.arm(monitor, &node);
            }
            let Some(starvation) = assessment.starvation.as_ref() else {
                self.unacted = None;
                return self.close_watch(monitor, &assessment);
            };
            let pods = match self.inventory.pods() {
                Ok(pods) => pods,
                Err(e) => {
                    warn!(error = %e, "cannot list the node's pods");
                    return self.soon();
                }
            };
            // Only running pods can give anything back (kubelet ranks its
            // active pods); a killed pod's empty cgroup may linger.
            let pods: Vec<PodSnapshot> =
                pods.into_iter().filter(|pod| pod.usage.pids > 0).collect();
            let choice = self.engine.choose(&assessment, &pods, self.options.policy);
            // Later rounds of the same trigger include the previous kills.
            if round == 0 {
                self.metrics
                    .decision_latency
                    .observe(trigger.elapsed().as_secs_f64());
            }
            let span = info_span!("eviction",
                signal = %starvation.threshold.signal, trigger = trigger.source);
            let outcome = self
                .execute(&trigger, starvation, &choice, &pods)
                .instrument(span)
                .await;
            match outcome {
                // Decide again at once, on fresh numbers.
                Outcome::Reclaimed => continue,
                Outcome::Unacted => return self.soon(),
                // Killing more before this one's resource is back would
                // take pods for nothing: wait for the next trigger.
                Outcome::NotBack => return None,
            }
        }
        warn!(
            rounds = MAX_ROUNDS_PER_TRIGGER,
            "still under pressure after the maximum evictions for one trigger"
        );
        self.soon()
    }

    /// Look again soon, unless the timer is the only trigger (poll mode).
    fn soon(&self) -> Option<Duration> {
        self.options.kernel_triggers.then_some(CLOSE_WATCH_INTERVAL)
    }

    /// Logs the decision and carries it out.
    async fn execute(
        &mut self,
        trigger: &Trigger,
        starvation: &Starvation,
        choice: &Choice,
        pods: &[PodSnapshot],
    ) -> Outcome {
        let candidates = explain(choice);
        let victims: Vec<String> = choice.victims.iter().map(|v| v.pod.clone()).collect();
        if self.unacted.as_ref() == Some(&victims) {
            return Outcome::Unacted;
        }
        if choice.victims.is_empty() {
            warn!(%candidates, "threshold met but no pod may be evicted (all critical or none running)");
            self.unacted = Some(victims);
            return Outcome::Unacted;
        }
        if self.options.dry_run {
            self.unacted = Some(victims.clone());
        }
        let mut outcome = Outcome::Unacted;
        for victim in &choice.victims {
            let pod = &pods[victim.index];
            let signal = starvation.threshold.signal;
            info!(
                %signal,
                observed = starvation.observation.available,
                threshold = starvation.threshold_quantity,
                min_reclaim = starvation.min_reclaim_quantity,
                deficit = starvation.deficit(),
                hard = starvation.threshold.hard,
                resource = %starvation.resource,
                victim = %victim.pod,
                victim_usage = victim.usage,
                qos = ?pod.qos_class(),
                grace_seconds = victim.grace_period.as_secs(),
                %candidates,
                trigger = trigger.source,
                trigger_at_ns = trigger.at_ns,
                decision_us = trigger.elapsed().as_micros() as u64,
                at_ns = monotonic_now_ns(),
                dry_run = self.options.dry_run,
                "eviction decided"
            );
            self.metrics
                .evictions
                .with_label_values(&[signal.as_str(), qos_label(pod)])
                .inc();
            if self.options.dry_run {
                continue;
            }
            let Some(cgroup) = pod.cgroup.as_deref() else {
                warn!(victim = %pod.key(), "pod has no cgroup; cannot kill it");
                return outcome;
            };
            let before = self.cgroupfs.read_memory(cgroup).ok();
            let notice = self.kubernetes.as_ref().and_then(|kubernetes| {
                let signal = StarvedSignal {
                    resource: starvation.resource,
                    threshold: starvation.threshold_quantity,
                    available: starvation.observation.available,
                };
                let notice = kubernetes.notice(pod, signal, &self.cgroupfs);
                if notice.is_none() {
                    info!(victim = %pod.key(), "pod unknown to the Kubernetes API: its eviction is not reported there");
                }
                notice
            });
            let mut evicted_by_api = false;
            if let (Some(kubernetes), Some(notice)) = (&self.kubernetes, &notice)
                && kubernetes.action() == EvictionAction::Evict
                && !starvation.threshold.hard
            {
                match kubernetes.evict(notice.clone(), victim.grace_period).await {
                    EvictOutcome::Evicted => {
                        info!(victim = %pod.key(), "evicted through the Kubernetes Eviction API");
                        kubernetes.report(EvictionNotice {
                            evicted_by_api: true,
                            ..notice.clone()
                        });
                        evicted_by_api = true;
                    }
                    EvictOutcome::Refused(reason) => {
                        // A PodDisruptionBudget (or RBAC) said no: the pod
                        // stays, and this decision is not retried until the
                        // ranking changes.
                        warn!(victim = %pod.key(), %reason, "the Eviction API refused the soft eviction; the pod stays");
                        self.unacted = Some(victims.clone());
                        return outcome;
                    }
                    EvictOutcome::Unanswered => {
                        warn!(victim = %pod.key(), "the Eviction API did not answer in --api-timeout; killing locally");
                    }
                }
            }
            let kill_started_ns = monotonic_now_ns();
            let killed = if evicted_by_api {
                // kubelet stops the pod, with its grace period.
                None
            } else {
                Some(self.killer.kill_pod(cgroup, victim.grace_period).await)
            };
            match killed {
                None => {}
                Some(Ok(report)) => {
                    if let (Some(kubernetes), Some(notice)) = (&self.kubernetes, notice) {
                        kubernetes.report(notice);
                    }
                    let to_kill = trigger_to_first_signal(trigger, kill_started_ns, &report);
                    self.metrics.trigger_to_kill.observe(to_kill.as_secs_f64());
                    info!(
                        victim = %pod.key(),
                        trigger_to_kill_us = to_kill.as_micros() as u64,
                        sigterm = report.sigterm_sent,
                        sigkill = report.sigkill_sent,
                        frozen = report.frozen,
                        released = report.mrelease_ok,
                        rounds = report.rounds,
                        empty_after_us = report.empty_after.as_micros() as u64,
                        at_ns = monotonic_now_ns(),
                        "pod killed"
                    );
                }
                Some(Err(e)) => {
                    self.metrics
                        .eviction_failures
                        .with_label_values(&[signal.as_str()])
                        .inc();
                    warn!(victim = %pod.key(), error = %e, "eviction failed");
                    return outcome;
                }
            }
            let back = match starvation.resource {
                Resource::Memory => {
                    let before = before.map(|m| m.working_set_bytes()).unwrap_or(0);
                    self.wait_for_memory(cgroup, &pod.key(), before).await
                }
                // The kill returns once the pod has no task left.
                Resource::Pids => true,
                // Disk comes back only when the pod's files are removed
                // (kubelet's cleanup of the killed pod).
                Resource::EphemeralStorage | Resource::Inodes => {
                    self.wait_for_signal(starvation, victim.usage, &pod.key())
                        .await
                }
            };
            outcome = if back {
                Outcome::Reclaimed
            } else {
                Outcome::NotBack
            };
            if !back {
                break;
            }
        }
        outcome
    }

    /// Waits, up to --reclaim-timeout, until the starved signal is past its
    /// threshold again or has gained half of what the victim used.
    async fn wait_for_signal(&self, starvation: &Starvation, usage: i64, pod: &str) -> bool {
        let started = tokio::time::Instant::now();
        let signal = starvation.threshold.signal;
        let before = starvation.observation.available;
        loop {
            let available = self
                .inventory
                .node()
                .ok()
                .and_then(|node| observe_signals(&node).get(&signal).map(|o| o.available));
            if let Some(available) = available
                && (available >= starvation.threshold_quantity
                    || available.saturating_sub(before) >= usage / 2)
            {
                info!(victim = pod, %signal, available, after_us = started.elapsed().as_micros() as u64,
                    "resource back");
                return true;
            }
            if started.elapsed() >= self.options.reclaim_timeout {
                warn!(victim = pod, %signal, available, timeout = ?self.options.reclaim_timeout,
                    "resource not back before --reclaim-timeout (its files are freed when the pod is cleaned up); waiting for the next trigger");
                return false;
            }
            tokio::time::sleep(SIGNAL_POLL_INTERVAL).await;
        }
    }

    /// Waits, up to --reclaim-timeout, until the killed pod's memory is
    /// back (its working set near zero, or its cgroup removed).
    async fn wait_for_memory(&self, cgroup: &str, pod: &str, before: u64) -> bool {
        let started = tokio::time::Instant::now();
        let target = ((before as f64 * RECLAIM_REMAINING_SHARE) as u64).max(RECLAIM_FLOOR_BYTES);
        loop {
            let remaining = match self.cgroupfs.read_memory(cgroup) {
                Ok(memory) => memory.working_set_bytes(),
                Err(CgroupError::Gone(_)) => 0,
                Err(e) => {
                    warn!(victim = pod, error = %e, "cannot read the victim's memory");
                    return false;
                }
            };
            if remaining <= target {
                info!(
                    victim = pod,
                    freed_bytes = before.saturating_sub(remaining),
                    after_us = started.elapsed().as_micros() as u64,
                    at_ns = monotonic_now_ns(),
                    "memory back"
                );
                return true;
            }
            if started.elapsed() >= self.options.reclaim_timeout {
                warn!(victim = pod, remaining_bytes = remaining, timeout = ?self.options.reclaim_timeout,
                    "memory not back before --reclaim-timeout; waiting for the next trigger");
                return false;
            }
            tokio::time::sleep(RECLAIM_POLL_INTERVAL).await;
        }
    }

    fn report_state(&mut self, assessment: &Assessment) {
        for (signal, observation) in &assessment.observations {
            self.metrics
                .signal_available
                .with_label_values(&[signal.as_str()])
                .set(observation.available);
        }
        let conditions = assessment.node_conditions.clone();
        for condition in NodeCondition::ALL {
            let on = conditions.contains(&condition);
            self.metrics
                .node_condition
                .with_label_values(&[condition.as_str()])
                .set(i64::from(on));
            if on != self.conditions.contains(&condition) {
                info!(
                    condition = condition.as_str(),
                    status = on,
                    "node condition"
                );
            }
        }
        self.conditions = conditions;
    }

    /// Arms the kernel at the values where each memory and PID threshold
    /// could first be met: memory.available < T needs usage >= capacity - T
    /// (working set never exceeds usage), pid.available < T needs
    /// tasks >= max - T + 1.
    fn arm(&self, monitor: &mut Monitor, node: &NodeStats) {
        let mut node_memory = Vec::new();
        let mut kubepods_memory = Vec::new();
        let mut pids = Vec::new();
        for threshold in &self.config.thresholds {
            match threshold.signal {
                Signal::MemoryAvailable => {
                    node_memory.push(usage_at_threshold(threshold, node.memory.capacity_bytes));
                }
                Signal::AllocatableMemoryAvailable => {
                    if let Some(allocatable) = node.allocatable {
                        kubepods_memory
                            .push(usage_at_threshold(threshold, allocatable.capacity_bytes));
                    }
                }
                Signal::PidAvailable => {
                    if let Some(pid) = node.pid {
                        let value = threshold.value.resolve(pid.max as i64).max(0) as u64;
                        pids.push((pid.max + 1).saturating_sub(value));
                    }
                }
                _ => {}
            }
        }
        let node_cgroup = self.inventory.node_cgroup();
        let kubepods = self.inventory.kubepods_cgroup();
        if node_cgroup == "/" {
            // The root memory cgroup has no page counter to watch: the pods'
            // cgroup stands in, offset by what the rest of the node holds.
            if let (Some(_), Some(allocatable)) = (&kubepods, node.allocatable) {
                let rest = node
                    .memory
                    .working_set_bytes
                    .saturating_sub(allocatable.working_set_bytes);
                kubepods_memory.extend(node_memory.iter().map(|t| t.saturating_sub(rest)));
            }
            monitor.watch_for_engine(KernelResource::Pids, None, pids);
        } else {
            monitor.watch_for_engine(KernelResource::Memory, Some(node_cgroup), node_memory);
            monitor.watch_for_engine(KernelResource::Pids, Some(node_cgroup), pids);
        }
        if let Some(kubepods) = kubepods {
            monitor.watch_for_engine(KernelResource::Memory, Some(&kubepods), kubepods_memory);
        }
    }

    /// Usage levels of the node cgroup at which its memory.available
    /// thresholds are met as of now, as kubelet arms memcg notifications:
    /// capacity - threshold + inactive_file (what usage has above the
    /// working set). `None` when the node cannot be read.
    pub fn memcg_notification_levels(&self) -> Option<Vec<u64>> {
        let capacity = self.inventory.node().ok()?.memory.capacity_bytes;
        let reading = self
            .cgroupfs
            .read_memory(self.inventory.node_cgroup())
            .ok()?;
        let levels = self
            .config
            .thresholds
            .iter()
            .filter(|threshold| threshold.signal == Signal::MemoryAvailable)
            .map(|threshold| usage_at_threshold(threshold, capacity) + reading.inactive_file_bytes)
            .collect();
        Some(levels)
    }

    /// Whether to look again before the resync timer: while a threshold is
    /// met but still inside its grace period, or a kernel-watched scope is
    /// past the usage where a threshold could be met (only the working set,
    /// read fresh, tells whether it is).
    /// In poll mode the timer is the only trigger, as in kubelet.
    fn close_watch(&self, monitor: &Monitor, assessment: &Assessment) -> Option<Duration> {
        if !self.options.kernel_triggers {
            return None;
        }
        let near = monitor.engine_scope_raised();
        if near || !assessment.thresholds_met.is_empty() {
            return self.soon();
        }
        None
    }
}

/// The usage at which a memory threshold is met on `capacity` bytes, were
/// all of it working set.
fn usage_at_threshold(threshold: &Threshold, capacity: u64) -> u64 {
    let value = threshold.value.resolve(capacity as i64).max(0) as u64;
    capacity.saturating_sub(value)
}

/// The head of the ranking, one pod per line-part: where each stands and why.
fn explain(choice: &Choice) -> String {
    let mut text: Vec<String> = choice
        .ranking
        .iter()
        .take(CANDIDATES_LOGGED)
        .enumerate()
        .map(|(place, ranked)| format!("{}. {}: {}", place + 1, ranked.pod, ranked.reason))
        .collect();
    if choice.ranking.len() > CANDIDATES_LOGGED {
        text.push(format!(
            "(+{} more)",
            choice.ranking.len() - CANDIDATES_LOGGED
        ));
    }
    text.join("; ")
}

fn qos_label(pod: &PodSnapshot) -> &'static str {
    match pod.qos_class() {
        crate::node::snapshot::QosClass::Guaranteed => "Guaranteed",
        crate::node::snapshot::QosClass::Burstable => "Burstable",
        crate::node::snapshot::QosClass::BestEffort => "BestEffort",
    }
}

/// From the trigger to the first signal the victim got: SIGTERM as the kill
/// starts for a soft eviction, else the first SIGKILL.
fn trigger_to_first_signal(
    trigger: &Trigger,
    kill_started_ns: u64,
    report: &KillReport,
) -> Duration {
    let to_start = Duration::from_nanos(kill_started_ns.saturating_sub(trigger.at_ns));
    match (report.sigterm_sent, report.first_sigkill_after) {
        (0, Some(after)) => to_start + after,
        _ => to_start,
    }
}

/// The engine's clock: CLOCK_MONOTONIC, the clock kernel records use.
fn engine_now() -> Duration {
    Duration::from_nanos(monotonic_now_ns())
}
