//! One decision carried out: announced once, sent through the Eviction API
//! where `--eviction-action evict` asks for it, killed locally, reported,
//! and waited on until the starved resource is back.
use std::time::Duration;

use tracing::{info, warn};

use super::Evictor;
use crate::{
    act::{
        io::{EvictionApi, Io, NodeSource, PodKiller},
        kill::KillReport,
        wake::Wake,
    },
    config::EvictionAction,
    decide::{
        engine::{Choice, Starvation, Victim, observe_signals},
        thresholds::Resource,
    },
    node::snapshot::PodSnapshot,
    report::kubernetes::{EvictOutcome, EvictionNotice, StarvedSignal},
};

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

/// Pods of the ranking a decision's log line explains.
const CANDIDATES_LOGGED: usize = 5;

/// What one decision achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Nothing killed: dry run, no evictable pod, a decision already
    /// reported, a refused eviction, or a failed kill.
    Unacted,
    /// Killed, and the resource came back.
    Reclaimed,
    /// Killed, but the resource did not come back in time.
    NotBack,
}

/// How one victim left, if it did.
enum Stopped {
    /// The Eviction API took the pod; kubelet stops it with its grace.
    ByApi,
    Killed,
    /// The Eviction API refused (a PodDisruptionBudget): the pod stays.
    Refused,
    /// The kill failed.
    Failed,
}

impl<I: Io> Evictor<I> {
    /// Logs the decision and carries it out.
    pub(super) async fn execute(
        &mut self,
        wake: &Wake,
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
            self.announce(wake, starvation, victim, pod, &candidates);
            if self.options.dry_run {
                continue;
            }
            let Some(cgroup) = pod.cgroup.as_deref() else {
                warn!(victim = %pod.key(), "pod has no cgroup; cannot kill it");
                return outcome;
            };
            let before = self.node.working_set(cgroup).unwrap_or(0);
            match self.stop(wake, starvation, victim, pod, cgroup).await {
                Stopped::ByApi | Stopped::Killed => {}
                Stopped::Refused => {
                    // Not retried until the ranking changes.
                    self.unacted = Some(victims);
                    return outcome;
                }
                Stopped::Failed => return outcome,
            }
            let back = match starvation.resource {
                Resource::Memory => self.wait_for_memory(cgroup, &pod.key(), before).await,
                // The kill returns once the pod has no task left.
                Resource::Pids => true,
                // Disk comes back only when the pod's files are removed
                // (kubelet's cleanup of the killed pod).
                Resource::EphemeralStorage | Resource::Inodes => {
                    self.wait_for_signal(starvation, victim.usage, &pod.key())
                        .await
                }
            };
            if !back {
                return Outcome::NotBack;
            }
            outcome = Outcome::Reclaimed;
        }
        outcome
    }

    /// The decision's one log line, and its count.
    fn announce(
        &self,
        wake: &Wake,
        starvation: &Starvation,
        victim: &Victim,
        pod: &PodSnapshot,
        candidates: &str,
    ) {
        let signal = starvation.threshold.signal;
        let qos = pod.qos_class();
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
            ?qos,
            grace_seconds = victim.grace_period.as_secs(),
            %candidates,
            trigger = wake.cause.as_str(),
            trigger_at_ns = wake.at_ns,
            decision_us = self.clock.since(wake.at_ns).as_micros() as u64,
            at_ns = self.clock.now_ns(),
            dry_run = self.options.dry_run,
            "eviction decided"
        );
        self.metrics
            .evictions
            .with_label_values(&[signal.as_str(), qos.as_str()])
            .inc();
    }

    /// Ends the victim: through the Eviction API for a soft eviction when
    /// `--eviction-action evict` asks for it, else (or when the API does not
    /// answer) by a local kill, reported to the API afterwards.
    async fn stop(
        &self,
        wake: &Wake,
        starvation: &Starvation,
        victim: &Victim,
        pod: &PodSnapshot,
        cgroup: &str,
    ) -> Stopped {
        let notice = self.notice(starvation, pod, cgroup);
        if let (Some(api), Some(notice)) = (&self.api, &notice)
            && api.action() == EvictionAction::Evict
            && !starvation.threshold.hard
        {
            match api.evict(notice.clone(), victim.grace_period).await {
                EvictOutcome::Evicted => {
                    info!(victim = %pod.key(), "evicted through the Kubernetes Eviction API");
                    api.report(EvictionNotice {
                        evicted_by_api: true,
                        ..notice.clone()
                    });
                    return Stopped::ByApi;
                }
                EvictOutcome::Refused(reason) => {
                    // A PodDisruptionBudget (or RBAC) said no.
                    warn!(victim = %pod.key(), %reason, "the Eviction API refused the soft eviction; the pod stays");
                    return Stopped::Refused;
                }
                EvictOutcome::Unanswered => {
                    warn!(victim = %pod.key(), "the Eviction API did not answer in --api-timeout; killing locally");
                }
            }
        }
        let kill_started_ns = self.clock.now_ns();
        match self.killer.kill_pod(cgroup, victim.grace_period).await {
            Ok(report) => {
                if let (Some(api), Some(notice)) = (&self.api, notice) {
                    api.report(notice);
                }
                let to_kill = first_signal_after(wake, kill_started_ns, &report);
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
                    at_ns = self.clock.now_ns(),
                    "pod killed"
                );
                Stopped::Killed
            }
            Err(e) => {
                self.metrics
                    .eviction_failures
                    .with_label_values(&[starvation.threshold.signal.as_str()])
                    .inc();
                warn!(victim = %pod.key(), error = %e, "eviction failed");
                Stopped::Failed
            }
        }
    }

    /// What the API is to be told about the eviction of `pod`, with each
    /// container's usage read now, before the kill takes it away. `None`
    /// without the API, or for a pod it has not shown evictd.
    fn notice(
        &self,
        starvation: &Starvation,
        pod: &PodSnapshot,
        cgroup: &str,
    ) -> Option<EvictionNotice> {
        let api = self.api.as_ref()?;
        let Some(known) = api.known(&pod.uid) else {
            info!(victim = %pod.key(), "pod unknown to the Kubernetes API: its eviction is not reported there");
            return None;
        };
        let signal = StarvedSignal {
            resource: starvation.resource,
            threshold: starvation.threshold_quantity,
            available: starvation.observation.available,
        };
        let working_sets = match signal.resource {
            Resource::Memory => self
                .node
                .container_working_sets(cgroup, &known.container_ids),
            _ => Vec::new(),
        };
        Some(EvictionNotice::new(&known, signal, &working_sets))
    }

    /// Waits, up to --reclaim-timeout, until the starved signal is past its
    /// threshold again or has gained half of what the victim used.
    async fn wait_for_signal(&mut self, starvation: &Starvation, usage: i64, pod: &str) -> bool {
        let started = tokio::time::Instant::now();
        let signal = starvation.threshold.signal;
        let before = starvation.observation.available;
        loop {
            let available = self.node.observe().ok().and_then(|observation| {
                observe_signals(&observation.stats)
                    .get(&signal)
                    .map(|o| o.available)
            });
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
            let remaining = match self.node.working_set(cgroup) {
                Ok(remaining) => remaining,
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
                    at_ns = self.clock.now_ns(),
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

/// From the wake-up to the first signal the victim got: SIGTERM as the kill
/// starts for a soft eviction, else the first SIGKILL.
fn first_signal_after(wake: &Wake, kill_started_ns: u64, report: &KillReport) -> Duration {
    let to_start = Duration::from_nanos(kill_started_ns.saturating_sub(wake.at_ns));
    match (report.sigterm_sent, report.first_sigkill_after) {
        (0, Some(after)) => to_start + after,
        _ => to_start,
    }
}
