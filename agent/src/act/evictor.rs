//! The loop that protects the node, one wake-up at a time: one fresh
//! observation of the node -> the scope levels and kernel tripwires it
//! implies -> [`Engine::observe`] -> if a resource is starved, the pods ->
//! [`Engine::choose`] -> one eviction carried out ([`eviction`]) -> wait
//! until the resource is back -> observe again. What to do next is an
//! [`Action`], as kube-runtime's controller returns one.
//!
//! Everything it touches outside memory goes through the seams of
//! [`Io`], so the loop runs in unit tests without root.
mod eviction;

use std::{sync::Arc, time::Duration};

use tracing::{Instrument as _, info, info_span, warn};

use crate::{
    act::{
        io::{Io, NodeSource, PodKiller},
        wake::{Clock, Wake},
    },
    decide::{
        engine::{Assessment, Engine, VictimPolicy},
        thresholds::{EvictionConfig, NodeCondition},
    },
    node::snapshot::PodSnapshot,
    report::metrics::Metrics,
    scopes::{monitor::Monitor, tripwires::tripwires},
};

/// While a memory or PID signal is inside the zone where only a fresh read
/// can tell whether its threshold is met (usage past the point where the
/// working set could reach the threshold), or a soft threshold waits out
/// its grace period, the engine looks again this often. 20 ms: a hog
/// allocating 1 GiB/s moves 20 MiB in that time, well inside kubelet's
/// 100Mi default.
pub const CLOSE_WATCH_INTERVAL: Duration = Duration::from_millis(20);

/// Bound on decide-kill-verify rounds for one wake-up, so a node where
/// kills do not help cannot keep the loop from serving events.
pub const MAX_ROUNDS_PER_WAKE: usize = 16;

/// What the loop does after an engine run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing is close: wait for the kernel, a notification or the timer.
    AwaitChange,
    /// Look again after this long, whatever else happens.
    Requeue(Duration),
}

/// What one engine run leaves for the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    pub action: Action,
    /// Where cgroup v1 eventfd thresholds on the node belong now (`--mode
    /// memcg-threshold`), from the last observation; `None` when the node
    /// could not be read (the levels stay where they are).
    pub memcg_levels: Option<Vec<u64>>,
}

#[derive(Debug, Clone, Copy)]
pub struct EvictorOptions {
    pub policy: VictimPolicy,
    pub dry_run: bool,
    pub reclaim_timeout: Duration,
    /// Kernel programs watch the engine's scopes (event mode); in the other
    /// modes the timer and notifications are all, as in kubelet.
    pub kernel_triggers: bool,
}

pub struct Evictor<I: Io> {
    engine: Engine,
    config: EvictionConfig,
    node: I::Node,
    killer: I::Killer,
    /// The Kubernetes API (--node-name): where kills are reported.
    api: Option<I::Api>,
    monitor: Monitor<I::Bands>,
    metrics: Arc<Metrics>,
    clock: Clock,
    options: EvictorOptions,
    /// Conditions reported by the last round, to log changes once.
    conditions: Vec<NodeCondition>,
    /// A decision that killed nothing (dry run, no pod may go, a refused
    /// eviction): reported once, not again on every run while the pressure
    /// lasts.
    unacted: Option<Vec<String>>,
}

/// The parts of an [`Evictor`], for its constructor.
pub struct Parts<I: Io> {
    pub node: I::Node,
    pub killer: I::Killer,
    pub api: Option<I::Api>,
    pub monitor: Monitor<I::Bands>,
}

impl<I: Io> Evictor<I> {
    pub fn new(
        config: EvictionConfig,
        parts: Parts<I>,
        metrics: Arc<Metrics>,
        clock: Clock,
        options: EvictorOptions,
    ) -> Self {
        Self {
            engine: Engine::new(config.clone()),
            config,
            node: parts.node,
            killer: parts.killer,
            api: parts.api,
            monitor: parts.monitor,
            metrics,
            clock,
            options,
            conditions: Vec::new(),
            unacted: None,
        }
    }

    pub fn monitor(&mut self) -> &mut Monitor<I::Bands> {
        &mut self.monitor
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The API side and the monitor back, for shutdown.
    pub fn into_parts(self) -> (Option<I::Api>, Monitor<I::Bands>) {
        (self.api, self.monitor)
    }

    /// Thaws pods a previous agent froze for a kill it never finished (it
    /// was killed itself): once, at startup.
    pub fn thaw_abandoned_pods(&mut self) {
        let pods = match self.node.pods() {
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
    /// reclaim (one victim per round unless --evict-set), at most
    /// [`MAX_ROUNDS_PER_WAKE`] rounds.
    pub async fn evaluate(&mut self, wake: Wake) -> Evaluation {
        let mut memcg_levels = None;
        for round in 0..MAX_ROUNDS_PER_WAKE {
            self.metrics
                .engine_runs
                .with_label_values(&[wake.cause.as_str()])
                .inc();
            let observation = match self.node.observe() {
                Ok(observation) => observation,
                Err(e) => {
                    warn!(error = %e, "cannot read the node's signals");
                    return Evaluation {
                        action: Action::AwaitChange,
                        memcg_levels,
                    };
                }
            };
            let assessment = self.engine.observe(self.clock.now(), &observation.stats);
            self.report_state(&assessment);
            let wires = tripwires(&self.config, &observation);
            memcg_levels = Some(wires.memcg_levels);
            let engine_raised = self.monitor.apply_engine(&wires.scopes);
            let Some(starvation) = assessment.starvation.as_ref() else {
                self.unacted = None;
                let close = engine_raised || !assessment.thresholds_met.is_empty();
                let action = if close {
                    self.soon()
                } else {
                    Action::AwaitChange
                };
                return Evaluation {
                    action,
                    memcg_levels,
                };
            };
            let pods = match self.node.pods() {
                Ok(pods) => pods,
                Err(e) => {
                    warn!(error = %e, "cannot list the node's pods");
                    return Evaluation {
                        action: self.soon(),
                        memcg_levels,
                    };
                }
            };
            // Only running pods can give anything back (kubelet ranks its
            // active pods); a killed pod's empty cgroup may linger.
            let pods: Vec<PodSnapshot> =
                pods.into_iter().filter(|pod| pod.usage.pids > 0).collect();
            let choice = self.engine.choose(&assessment, &pods, self.options.policy);
            // Later rounds of the same wake-up include the previous kills.
            if round == 0 {
                self.metrics
                    .decision_latency
                    .observe(self.clock.since(wake.at_ns).as_secs_f64());
            }
            let span = info_span!("eviction",
                signal = %starvation.threshold.signal, trigger = wake.cause.as_str());
            let outcome = self
                .execute(&wake, starvation, &choice, &pods)
                .instrument(span)
                .await;
            let action = match outcome {
                // Decide again at once, on fresh numbers.
                eviction::Outcome::Reclaimed => continue,
                eviction::Outcome::Unacted => self.soon(),
                // Killing more before this one's resource is back would
                // take pods for nothing: wait for the next trigger.
                eviction::Outcome::NotBack => Action::AwaitChange,
            };
            return Evaluation {
                action,
                memcg_levels,
            };
        }
        warn!(
            rounds = MAX_ROUNDS_PER_WAKE,
            "still under pressure after the maximum evictions for one trigger"
        );
        Evaluation {
            action: self.soon(),
            memcg_levels,
        }
    }

    /// Look again soon, unless the timer is the only trigger (poll mode).
    fn soon(&self) -> Action {
        if self.options.kernel_triggers {
            Action::Requeue(CLOSE_WATCH_INTERVAL)
        } else {
            Action::AwaitChange
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
}

#[cfg(test)]
mod tests;
