//! Evictions: a decision announced once and started as a future that runs
//! beside the loop (the Eviction API where `--eviction-action evict` asks
//! for it, else the local kill, with a soft eviction's grace period); its
//! end reported; then the victim's resource watched until it is back.
use std::{
    cell::Cell,
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    rc::Rc,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::{
    StreamExt as _,
    future::{AbortHandle, abortable},
    stream::FuturesUnordered,
};
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{Action, CANDIDATES_LOGGED, DecisionTimes, Evictor, Ranking};
use crate::{
    act::{
        io::{EvictionApi, Io, NodeSource, PodKiller},
        kill::{KillError, KillReport, Sandbox, describe_holdouts},
        pre_kill::{HookOutcome, PreKillCall, PreKillHook},
        wake::{ThreadUsage, Wake},
    },
    decide::snapshot::PodSnapshot,
    decide::{
        engine::{Assessment, Choice, Starvation, Victim},
        reason::KillReason,
        thresholds::{Resource, Signal},
    },
    logs,
    metrics::Metrics,
    node::runtime::local_storage::LocalStorageViolation,
    report::{
        decisions::Outcome,
        kubernetes::{EvictOutcome, EvictionAction, EvictionNotice, StarvedSignal},
    },
};

/// How long a soft eviction waits for the container runtime to say which
/// cgroups hold the pod's sandbox before it goes by the API's containers
/// instead: CRI answers a listing in milliseconds, and a runtime that is
/// stuck (or whose thread is busy) must not hold the SIGTERM back longer.
const SANDBOX_LOOKUP: Duration = Duration::from_secs(1);

/// How often a killed pod's memory (or its tasks) is looked at again until
/// it is back: every 5 ms at first, then every tenth of the time it has
/// taken so far, at most every half second. Each look is a whole engine
/// run, the node's signals read afresh (on a v2 root, memory.stat flushes
/// every cgroup's counters), so a fixed 5 ms poll of a victim whose memory
/// took seconds to return kept a CPU busy that the dying process needed
/// (7.2 guest: 534 runs and 19 s of the agent's CPU in one kill). This
/// way a decision that waits for the memory waits at most a tenth longer.
pub(super) fn memory_poll_interval(elapsed: Duration) -> Duration {
    (elapsed / 10).clamp(MEMORY_POLL_FIRST, MEMORY_POLL_LONGEST)
}
const MEMORY_POLL_FIRST: Duration = Duration::from_millis(5);
const MEMORY_POLL_LONGEST: Duration = Duration::from_millis(500);

/// How often the node's disk signals are looked at again after a kill
/// until they are back.
const DISK_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// A pod's memory counts as back once its working set is below this share
/// of what it was, or below [`RECLAIM_FLOOR_BYTES`].
const RECLAIM_REMAINING_SHARE: f64 = 0.05;
const RECLAIM_FLOOR_BYTES: u64 = 1 << 20;

/// How an eviction ended.
#[derive(Debug)]
pub enum Ended {
    /// The Eviction API took the pod; kubelet stops it with its grace.
    ByApi,
    Killed(KillReport),
    /// The Eviction API refused (a PodDisruptionBudget): the pod stays.
    Refused(String),
    Failed(KillError),
    /// A hard eviction of the same pod took over.
    Preempted,
}

type Running = Pin<Box<dyn Future<Output = (u64, Ended)>>>;

/// What an eviction answers.
#[derive(Debug, Clone)]
pub(super) enum Cause {
    /// A threshold met: the starved resource is watched until it is back.
    Threshold(Starvation),
    /// The pod outgrew one of its own local-storage limits: no threshold
    /// need be met, the kill is immediate, and nothing is watched after
    /// (its disk comes back when kubelet removes the pod).
    PodLimit(LocalStorageViolation),
    /// The pod thrashed at its own memory limit (`--thrashing-eviction`)
    /// or its containers stayed under memory pressure (KEP-5986's stage
    /// 2), said by this message: a soft eviction of the pod alone, nothing
    /// watched after (the node was not short).
    OwnMemory(KillReason, String),
}

impl Cause {
    fn hard(&self) -> bool {
        match self {
            Self::Threshold(starvation) => starvation.threshold.hard,
            Self::PodLimit(_) => true,
            Self::OwnMemory(..) => false,
        }
    }

    /// The `signal` label of the eviction metrics, kubelet's.
    fn label(&self) -> &'static str {
        match self {
            Self::Threshold(starvation) => starvation.threshold.signal.as_str(),
            Self::PodLimit(violation) => violation.signal(),
            Self::OwnMemory(reason, _) => reason.signal(),
        }
    }

    /// Whether this is a threshold eviction for `resource`, hard or soft
    /// as `hard` says.
    fn reclaims(&self, resource: Resource, hard: bool) -> bool {
        matches!(self, Self::Threshold(starvation)
            if starvation.resource == resource && starvation.threshold.hard == hard)
    }
}

/// An eviction under way.
struct InFlight {
    victim: Victim,
    uid: String,
    cgroup: String,
    cause: Cause,
    abort: AbortHandle,
    notice: Option<EvictionNotice>,
    /// The decision's victims, to hold it once refused.
    decision: Vec<String>,
    wake: Wake,
    started_ns: u64,
    /// How long the pre-kill hook ran before the kill began (zero without
    /// one), so that the time to the first signal counts it.
    hook_took: Rc<Cell<Duration>>,
    /// The victim's working set at the decision, for what coming back
    /// means.
    working_set_before: u64,
}

/// A killed pod's resource on its way back.
struct Reclaim {
    pod: String,
    cgroup: String,
    resource: Resource,
    signal: Signal,
    working_set_before: u64,
    victim_usage: i64,
    available_before: i64,
    threshold_quantity: i64,
    started_ns: u64,
    /// Whether the node's gain is checked against what the victim held:
    /// for the resource it was evicted for, not for the processes every
    /// killed pod also gives back.
    gain_checked: bool,
}

/// The evictions under way and the resources coming back.
#[derive(Default)]
pub(super) struct Evictions {
    running: FuturesUnordered<Running>,
    in_flight: BTreeMap<u64, InFlight>,
    reclaims: Vec<Reclaim>,
    next_id: u64,
}

impl Evictions {
    pub(super) fn hard_running(&self, resource: Resource) -> bool {
        self.in_flight
            .values()
            .any(|e| e.cause.reclaims(resource, true))
    }

    /// Whether any eviction is under way, for any resource. A soft
    /// decision waits for it, as kubelet evicts one pod and waits for its
    /// cleanup before it decides again: the pod may give back what the
    /// soft threshold lacks (a fork bomb killed for memory frees its
    /// processes too; deciding meanwhile took the pod beside it).
    pub(super) fn any_running(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Whether a pod is being killed for its local-storage limit: a disk
    /// threshold is decided again once that kill ends, as kubelet decides
    /// no threshold in a round that evicted for local storage.
    pub(super) fn pod_limit_running(&self) -> bool {
        self.in_flight
            .values()
            .any(|e| matches!(e.cause, Cause::PodLimit(_)))
    }

    /// Whether an eviction of pod `uid` is under way.
    pub(super) fn evicting(&self, uid: &str) -> bool {
        self.in_flight.values().any(|e| e.uid == uid)
    }

    /// Whether pod `uid` is being evicted already, for any reason, so that
    /// a decision (`hard` or not) must not start another kill of it: a fork
    /// bomb killed for memory still has its processes, and `pid.available`
    /// would pick it again (a second kill, report and budget). Only a hard
    /// decision may take over a soft eviction waiting out its grace period.
    pub(super) fn being_evicted(&self, uid: &str, hard: bool) -> bool {
        self.in_flight
            .values()
            .any(|e| e.uid == uid && (e.cause.hard() || !hard))
    }

    pub(super) fn reclaiming(&self, resource: Resource) -> bool {
        self.reclaims.iter().any(|r| r.resource == resource)
    }
}

impl<I: Io> Evictor<I> {
    /// Evictions under way.
    pub(crate) fn evictions_running(&self) -> usize {
        self.evictions.in_flight.len()
    }

    /// The next eviction to end; pending while none is under way.
    pub(crate) async fn next_ended(&mut self) -> (u64, Ended) {
        match self.evictions.running.next().await {
            Some(ended) => ended,
            None => std::future::pending().await,
        }
    }

    /// Logs, counts and reports how eviction `id` ended; a killed pod's
    /// resource is watched until it is back. The loop runs the engine again
    /// right after.
    pub(crate) fn end(&mut self, id: u64, ended: Ended) {
        let Some(eviction) = self.evictions.in_flight.remove(&id) else {
            return;
        };
        let pod = &eviction.victim.pod;
        match ended {
            Ended::Preempted => return,
            Ended::Refused(reason) => {
                // Not retried until the ranking changes.
                warn!(victim = %pod, %reason, "the Eviction API refused the soft eviction; the pod stays");
                self.unacted = Some(eviction.decision);
                return;
            }
            Ended::Failed(e) => {
                self.metrics
                    .eviction_failures
                    .with_label_values(&[eviction.cause.label(), eviction.victim.reason.as_str()])
                    .inc();
                let until = self.safeguards.failed(&eviction.uid, self.clock.now_ns());
                warn!(victim = %pod, reason = eviction.victim.reason.as_str(), error = %e, backoff_ms = until.as_millis() as u64,
                    "eviction failed; the next candidate is taken and this pod is left alone for the back-off");
                return;
            }
            Ended::ByApi => {
                info!(victim = %pod, reason = eviction.victim.reason.as_str(), "evicted through the Kubernetes Eviction API");
                if let (Some(api), Some(notice)) = (&self.api, eviction.notice.clone()) {
                    api.report(EvictionNotice {
                        evicted_by_api: true,
                        ..notice
                    });
                }
            }
            Ended::Killed(report) => {
                if let (Some(api), Some(notice)) = (&self.api, eviction.notice.clone()) {
                    api.report(notice);
                }
                let kill_started_ns = eviction.started_ns
                    + u64::try_from(eviction.hook_took.get().as_nanos()).unwrap_or(u64::MAX);
                let to_kill = first_signal_after(&eviction.wake, kill_started_ns, &report);
                self.metrics.trigger_to_kill.observe(to_kill.as_secs_f64());
                self.safeguards.succeeded(&eviction.uid);
                info!(
                    victim = %pod,
                    reason = eviction.victim.reason.as_str(),
                    trigger_to_kill_us = to_kill.as_micros() as u64,
                    sigterm = report.sigterm_sent,
                    sigkill = report.sigkill_sent,
                    frozen = report.frozen,
                    released = report.mrelease_ok,
                    rounds = report.rounds,
                    frozen_after_us = report.frozen_after.map(|d| d.as_micros() as u64),
                    freeze_holdouts = (!report.freeze_holdouts.is_empty())
                        .then(|| describe_holdouts(&report.freeze_holdouts)),
                    sigkill_after_us = report.first_sigkill_after.map(|d| d.as_micros() as u64),
                    thawed_after_us = report.thawed_after.map(|d| d.as_micros() as u64),
                    released_after_us = report.released_after.map(|d| d.as_micros() as u64),
                    empty_after_us = report.empty_after.as_micros() as u64,
                    kill_started_ns = report.started_at_ns,
                    at_ns = self.clock.now_ns(),
                    "pod killed"
                );
            }
        }
        let Cause::Threshold(starvation) = eviction.cause else {
            return;
        };
        let started_ns = self.clock.now_ns();
        // Every killed pod gives back its processes, charged to the node
        // until they are reaped: PID pressure met meanwhile waits for them
        // rather than take another pod (a fork bomb killed for memory,
        // whose 150 exited children the node still counted, cost a pod
        // beside it its life).
        if starvation.resource != Resource::Pids {
            self.evictions.reclaims.push(Reclaim {
                pod: eviction.victim.pod.clone(),
                cgroup: eviction.cgroup.clone(),
                resource: Resource::Pids,
                signal: Signal::PidAvailable,
                working_set_before: 0,
                victim_usage: 0,
                available_before: 0,
                threshold_quantity: 0,
                started_ns,
                gain_checked: false,
            });
        }
        self.evictions.reclaims.push(Reclaim {
            pod: eviction.victim.pod,
            cgroup: eviction.cgroup,
            resource: starvation.resource,
            signal: starvation.threshold.signal,
            working_set_before: eviction.working_set_before,
            victim_usage: eviction.victim.usage,
            available_before: starvation.observation.available,
            threshold_quantity: starvation.threshold_quantity,
            started_ns,
            gain_checked: true,
        });
    }

    /// Announces the decision's victims and starts their evictions, within
    /// the eviction budget. Returns what the loop does next; `None` when
    /// every victim is being evicted already (its end wakes the engine,
    /// which decides on this resource again then).
    pub(super) fn start_evictions(
        &mut self,
        wake: &Wake,
        starvation: &Starvation,
        ranking: &Ranking,
    ) -> Option<Action> {
        let Ranking {
            pods,
            choice,
            exact,
            times,
        } = ranking;
        let hard = starvation.threshold.hard;
        let fresh: Vec<&Victim> = choice
            .victims
            .iter()
            .filter(|victim| !self.evictions.being_evicted(&pods[victim.index].uid, hard))
            .collect();
        if fresh.is_empty() && !choice.victims.is_empty() {
            return None;
        }
        let candidates = explain(choice, pods, exact);
        let victims: Vec<String> = choice.victims.iter().map(|v| v.pod.clone()).collect();
        if self.unacted.as_ref() == Some(&victims) {
            return Some(self.soon());
        }
        if choice.victims.is_empty() {
            warn!(%candidates, "threshold met but no pod may be evicted (all critical, running evictd, backing off, or none running)");
            self.unacted = Some(victims);
            self.record_decision(wake, starvation, Some(ranking), Outcome::NotActed);
            return Some(self.soon());
        }
        // A hard eviction taking over a pod's soft one is no new eviction:
        // the budget was spent on the pod already.
        let (taking_over, new): (Vec<&Victim>, Vec<&Victim>) = fresh
            .into_iter()
            .partition(|victim| self.evictions.evicting(&pods[victim.index].uid));
        let now_ns = self.clock.now_ns();
        let room = if self.options.dry_run || new.is_empty() {
            new.len()
        } else {
            match self.safeguards.room(now_ns, &self.metrics) {
                Ok(room) => room,
                Err(wait) if taking_over.is_empty() => {
                    self.record_decision(wake, starvation, Some(ranking), Outcome::HeldBudget);
                    return Some(Action::Requeue(wait));
                }
                Err(_) => 0,
            }
        };
        if self.options.dry_run {
            self.unacted = Some(victims.clone());
        }
        let mut started = false;
        for victim in taking_over.into_iter().chain(new.into_iter().take(room)) {
            let pod = &pods[victim.index];
            self.announce(wake, starvation, victim, pod, &candidates, times);
            if self.options.dry_run {
                continue;
            }
            let Some(cgroup) = pod.cgroup.clone() else {
                warn!(victim = %pod.key(), "pod has no cgroup; cannot kill it");
                continue;
            };
            let cause = Cause::Threshold(starvation.clone());
            self.start(wake, cause, victim, pod, cgroup, &victims);
            started = true;
        }
        // After the kills started: the record waits for them, not they for it.
        if self.options.dry_run {
            self.record_decision(wake, starvation, Some(ranking), Outcome::DryRun);
        } else if started {
            self.record_decision(wake, starvation, Some(ranking), Outcome::Evicted);
        }
        Some(if started {
            // The end of an eviction wakes the engine.
            Action::AwaitChange
        } else {
            self.soon()
        })
    }

    /// The decision's one log line, and its count.
    fn announce(
        &self,
        wake: &Wake,
        starvation: &Starvation,
        victim: &Victim,
        pod: &PodSnapshot,
        candidates: &str,
        times: &DecisionTimes,
    ) {
        let signal = starvation.threshold.signal;
        let us = |phase: Duration| phase.as_micros() as u64;
        let run = self.clock.since(times.run_started_ns);
        let run_spent = times
            .run_usage
            .zip(ThreadUsage::now())
            .map(|(start, end)| end.since(&start));
        let qos = pod.qos_class();
        let bytes = starvation.resource.in_bytes();
        info!(
            %signal,
            observed = logs::amount(starvation.observation.available, bytes).logged(),
            threshold = logs::amount(starvation.threshold_quantity, bytes).logged(),
            min_reclaim = logs::amount(starvation.min_reclaim_quantity, bytes).logged(),
            deficit = logs::amount(starvation.deficit(), bytes).logged(),
            hard = starvation.threshold.hard,
            resource = %starvation.resource,
            victim = %victim.pod,
            reason = victim.reason.as_str(),
            victim_usage = logs::amount(victim.usage, bytes).logged(),
            ?qos,
            grace_seconds = victim.grace_period.as_secs(),
            %candidates,
            trigger = wake.cause.as_str(),
            trigger_at_ns = wake.at_ns,
            decision_us = self.clock.since(wake.at_ns).as_micros() as u64,
            woken_to_run_us = us(times.woken_to_run),
            observe_us = us(times.observe),
            list_us = us(times.list),
            rank_us = us(times.rank),
            exact_read_us = us(times.exact_read),
            exact_reads = times.exact_reads,
            run_on_cpu_us = run_spent.map(|spent| us(spent.cpu)),
            run_off_cpu_us = run_spent.map(|spent| us(run.saturating_sub(spent.cpu))),
            run_preempted = run_spent.map(|spent| spent.involuntary_switches),
            run_blocked = run_spent.map(|spent| spent.voluntary_switches),
            run_page_faults = run_spent.map(|spent| spent.page_faults),
            at_ns = self.clock.now_ns(),
            dry_run = self.options.dry_run,
            "eviction decided"
        );
        self.metrics
            .evictions
            .with_label_values(&[signal.as_str(), qos.as_str(), victim.reason.as_str()])
            .inc();
    }

    /// Starts the eviction of `victim`: through the Eviction API for a soft
    /// eviction when `--eviction-action evict` asks for it (falling back to
    /// the local kill when the API does not answer), else the local kill. A
    /// hard eviction of a pod whose soft eviction is under way takes over.
    pub(super) fn start(
        &mut self,
        wake: &Wake,
        cause: Cause,
        victim: &Victim,
        pod: &PodSnapshot,
        cgroup: String,
        decision: &[String],
    ) {
        let hard = cause.hard();
        let running: Vec<u64> = self
            .evictions
            .in_flight
            .iter()
            .filter(|(_, e)| e.uid == pod.uid && !e.cause.hard())
            .map(|(id, _)| *id)
            .collect();
        let takes_over = !running.is_empty();
        for id in running {
            if let Some(soft) = self.evictions.in_flight.get(&id) {
                info!(victim = %pod.key(), "a hard threshold takes over the soft eviction under way");
                soft.abort.abort();
            }
        }
        let notice = self
            .notice(&cause, pod, &cgroup)
            .map(|notice| notice.with_kill_reason(victim.reason));
        let api = self
            .api
            .clone()
            .filter(|api| api.action() == EvictionAction::Evict && !hard && notice.is_some());
        let killer = self.killer.clone();
        let grace = victim.grace_period;
        let pre_kill = self.pre_kill_for(victim, pod);
        let hook_took = Rc::new(Cell::new(Duration::ZERO));
        let hook_time = Rc::clone(&hook_took);
        let kill_cgroup = cgroup.clone();
        let api_notice = notice.clone();
        // Only a soft eviction spares the sandbox its SIGTERM.
        let sandbox_lookup = (!grace.is_zero()).then(|| self.node.sandbox_of(&pod.uid));
        let fallback = self.api_sandbox(&pod.uid);
        let eviction = async move {
            let grace = match pre_kill {
                Some(pre_kill) => {
                    let took = pre_kill.run(grace).await;
                    hook_time.set(took);
                    grace.saturating_sub(took)
                }
                None => grace,
            };
            if let (Some(api), Some(notice)) = (api, api_notice) {
                match api.evict(notice, grace).await {
                    EvictOutcome::Evicted => return Ended::ByApi,
                    EvictOutcome::Refused(reason) => return Ended::Refused(reason),
                    EvictOutcome::Forbidden(reason) => {
                        error!(
                            cgroup = kill_cgroup,
                            %reason,
                            "the Kubernetes API forbids evictd's Evictions: --eviction-action evict cannot work as deployed (deploy/admission.yaml's evictd-no-eviction-api refuses them; rbac.yaml grants no pods/eviction); killing locally, as with --eviction-action status"
                        );
                    }
                    EvictOutcome::Unanswered => {
                        warn!(
                            cgroup = kill_cgroup,
                            "the Eviction API did not answer in --api-timeout; killing locally"
                        );
                    }
                }
            }
            let sandbox = match sandbox_lookup {
                Some(lookup) => match tokio::time::timeout(SANDBOX_LOOKUP, lookup).await {
                    Ok(Some(ids)) => Sandbox::Named(ids),
                    _ => fallback,
                },
                None => Sandbox::Unknown,
            };
            match killer.kill_pod(&kill_cgroup, grace, &sandbox).await {
                Ok(report) => Ended::Killed(report),
                Err(e) => Ended::Failed(e),
            }
        };
        let (eviction, abort) = abortable(eviction);
        let id = self.evictions.next_id;
        self.evictions.next_id += 1;
        self.evictions.running.push(Box::pin(async move {
            (id, eviction.await.unwrap_or(Ended::Preempted))
        }));
        // One pod, one eviction: the one taken over spent the budget.
        if !takes_over {
            let now_ns = self.clock.now_ns();
            self.safeguards.spend(now_ns);
            if let Some(file) = &self.spent_budget {
                file.save(self.safeguards.spent_ago(now_ns), SystemTime::now());
            }
        }
        self.evictions.in_flight.insert(
            id,
            InFlight {
                victim: victim.clone(),
                uid: pod.uid.clone(),
                working_set_before: self.node.working_set(&cgroup).unwrap_or(0),
                cgroup,
                cause,
                abort,
                notice,
                decision: decision.to_vec(),
                wake: *wake,
                started_ns: self.clock.now_ns(),
                hook_took,
            },
        );
    }

    /// The pre-kill hook's run before the eviction of `victim`, if one is
    /// set and the eviction is soft. A hard eviction runs none, neither
    /// before its kill nor beside it: its threshold says the node is out of
    /// memory or PIDs now, which a process or a connection started then
    /// would take from the kill, and the pod is gone before a hook could
    /// look at it (its log line, event and metric say why it went).
    fn pre_kill_for(&self, victim: &Victim, pod: &PodSnapshot) -> Option<PreKillRun> {
        let hook = self.pre_kill.clone()?;
        if victim.grace_period.is_zero() {
            self.metrics
                .pre_kill_hooks
                .with_label_values(&["skipped"])
                .inc();
            return None;
        }
        Some(PreKillRun {
            hook,
            pod: (pod.namespace.clone(), pod.name.clone(), pod.uid.clone()),
            victim: victim.pod.clone(),
            reason: victim.reason,
            metrics: Arc::clone(&self.metrics),
        })
    }

    /// The pod's sandbox as far as the Kubernetes API can tell without a
    /// runtime: whatever holds none of the containers it lists.
    fn api_sandbox(&self, uid: &str) -> Sandbox {
        let known = self.api.as_ref().and_then(|api| api.known(uid));
        match known {
            Some(known) if !known.container_ids.is_empty() => {
                Sandbox::NotContaining(known.container_ids.into_iter().map(|(_, id)| id).collect())
            }
            _ => Sandbox::Unknown,
        }
    }

    /// What the API is to be told about the eviction of `pod`, with each
    /// container's usage read now, before the kill takes it away. `None`
    /// without the API, or for a pod it has not shown evictd.
    fn notice(&self, cause: &Cause, pod: &PodSnapshot, cgroup: &str) -> Option<EvictionNotice> {
        let api = self.api.as_ref()?;
        let Some(known) = api.known(&pod.uid) else {
            info!(victim = %pod.key(), "pod unknown to the Kubernetes API: its eviction is not reported there");
            return None;
        };
        let starvation = match cause {
            Cause::Threshold(starvation) => starvation,
            Cause::PodLimit(violation) => {
                return Some(EvictionNotice::own_limit(
                    &known,
                    Resource::EphemeralStorage,
                    violation.message(),
                ));
            }
            Cause::OwnMemory(_, message) => {
                return Some(EvictionNotice::own_limit(
                    &known,
                    Resource::Memory,
                    message.clone(),
                ));
            }
        };
        let signal = StarvedSignal {
            resource: starvation.resource,
            threshold: starvation.threshold_quantity,
            available: starvation.observation.available,
        };
        let usages = match signal.resource {
            Resource::Memory => self
                .node
                .container_working_sets(cgroup, &known.container_ids),
            Resource::EphemeralStorage => self.node.container_ephemeral_storage(&pod.uid),
            _ => Vec::new(),
        };
        Some(EvictionNotice::new(&known, signal, &usages))
    }

    /// Looks at every resource on its way back after a kill; one that is
    /// back, or past --reclaim-timeout, is done with, and what the node got
    /// back is checked against what the victim held. Returns how soon to
    /// look again while something is still coming back.
    pub(super) fn check_reclaims(&mut self, assessment: &Assessment) -> Option<Duration> {
        let reclaims = std::mem::take(&mut self.evictions.reclaims);
        let mut next = None;
        for reclaim in reclaims {
            let elapsed = self.clock.since(reclaim.started_ns);
            let available = assessment
                .observations
                .get(&reclaim.signal)
                .map(|o| o.available);
            let back = match reclaim.resource {
                Resource::Memory => {
                    let target = ((reclaim.working_set_before as f64 * RECLAIM_REMAINING_SHARE)
                        as u64)
                        .max(RECLAIM_FLOOR_BYTES);
                    match self.node.working_set(&reclaim.cgroup) {
                        Ok(remaining) if remaining <= target => {
                            info!(
                                victim = reclaim.pod,
                                freed_bytes = logs::bytes(
                                    reclaim.working_set_before.saturating_sub(remaining)
                                )
                                .logged(),
                                after_us = elapsed.as_micros() as u64,
                                at_ns = self.clock.now_ns(),
                                "memory back"
                            );
                            true
                        }
                        Ok(_) => false,
                        Err(e) => {
                            warn!(victim = reclaim.pod, error = %e, "cannot read the victim's memory");
                            false
                        }
                    }
                }
                // The kill returned once the pod listed no process, but a
                // task that exited is charged (to the pod and the node)
                // until it is reaped: the node's gain is looked at after.
                Resource::Pids => match self.node.tasks(&reclaim.cgroup) {
                    Ok(tasks) => tasks == 0,
                    Err(e) => {
                        warn!(victim = reclaim.pod, error = %e, "cannot read the victim's tasks");
                        true
                    }
                },
                // Disk comes back only when the pod's files are removed
                // (kubelet's cleanup of the killed pod).
                Resource::EphemeralStorage | Resource::Inodes => {
                    let back = available.is_some_and(|available| {
                        available >= reclaim.threshold_quantity
                            || available.saturating_sub(reclaim.available_before)
                                >= reclaim.victim_usage / 2
                    });
                    if back {
                        info!(victim = reclaim.pod, signal = %reclaim.signal,
                            available = logs::maybe_amount(available, reclaim.resource.in_bytes()).logged(),
                            after_us = elapsed.as_micros() as u64, "resource back");
                    }
                    back
                }
            };
            if back {
                if reclaim.gain_checked {
                    self.check_gain(&reclaim, available);
                }
                continue;
            }
            if elapsed >= self.options.reclaim_timeout {
                warn!(victim = reclaim.pod, signal = %reclaim.signal, timeout = ?self.options.reclaim_timeout,
                    "resource not back before --reclaim-timeout (memory charged to files, or disk freed only when the pod is cleaned up)");
                continue;
            }
            let poll = match reclaim.resource {
                Resource::Memory | Resource::Pids => memory_poll_interval(elapsed),
                Resource::EphemeralStorage | Resource::Inodes => DISK_POLL_INTERVAL,
            };
            next = Some(next.map_or(poll, |next: Duration| next.min(poll)));
            self.evictions.reclaims.push(reclaim);
        }
        next
    }

    /// A kill whose victim's memory or processes came back, yet the node's
    /// signal did not gain about as much, means the pressure is outside the
    /// pods: evicting more would drain them for nothing.
    fn check_gain(&mut self, reclaim: &Reclaim, available: Option<i64>) {
        if !matches!(reclaim.resource, Resource::Memory | Resource::Pids) {
            return;
        }
        let Some(available) = available else {
            return;
        };
        let gained = available.saturating_sub(reclaim.available_before);
        if gained >= reclaim.victim_usage / 2 {
            return;
        }
        let until =
            self.safeguards
                .hold_outside(reclaim.signal, self.clock.now_ns(), &self.metrics);
        let bytes = reclaim.resource.in_bytes();
        error!(
            signal = %reclaim.signal,
            victim = reclaim.pod,
            victim_usage = logs::amount(reclaim.victim_usage, bytes).logged(),
            gained = logs::amount(gained, bytes).logged(),
            hold_s = until.as_secs(),
            "the node did not get back what the evicted pod held: the pressure is outside the pods \
             (a host process, kernel memory, host tmpfs?); no more evictions for this signal \
             during the hold, watching"
        );
    }
}

/// One run of the pre-kill hook, moved into its eviction.
struct PreKillRun {
    hook: Rc<PreKillHook>,
    /// Namespace, name and uid.
    pod: (String, String, String),
    /// `namespace/name`, for the log.
    victim: String,
    reason: KillReason,
    metrics: Arc<Metrics>,
}

impl PreKillRun {
    /// Runs the hook within its bound (of the pod's `grace`), logs and
    /// counts how it ended, and returns how long it took: the SIGTERM gets
    /// what is left of the grace, so the SIGKILL comes when it would
    /// without a hook.
    async fn run(self, grace: Duration) -> Duration {
        let bound = self.hook.bound(grace);
        let started = Instant::now();
        let (namespace, name, uid) = &self.pod;
        let call = PreKillCall::new(
            (namespace, name, uid),
            self.reason,
            SystemTime::now(),
            bound,
        );
        let outcome = self.hook.run(&call, bound).await;
        let took = started.elapsed();
        let took_ms = took.as_millis() as u64;
        match &outcome {
            HookOutcome::Done => {
                info!(
                    victim = self.victim,
                    reason = call.reason,
                    took_ms,
                    "pre-kill hook done"
                );
            }
            HookOutcome::Failed(e) => {
                warn!(victim = self.victim, reason = call.reason, error = %e, took_ms,
                    "pre-kill hook failed; the eviction goes on");
            }
            HookOutcome::TimedOut => {
                warn!(victim = self.victim, reason = call.reason, bound_ms = bound.as_millis() as u64,
                    hook = %self.hook.target, "pre-kill hook still running at its deadline: killed; the eviction goes on");
            }
        }
        self.metrics
            .pre_kill_hooks
            .with_label_values(&[outcome.as_str()])
            .inc();
        took
    }
}

/// The head of the ranking, one pod per line-part: where each stands and
/// why. A pod whose memory was not read exactly (it ranks after every
/// victim) shows its bytes charged, an upper bound of its working set.
fn explain(choice: &Choice, pods: &[Arc<PodSnapshot>], exact: &[bool]) -> String {
    let mut text: Vec<String> = choice
        .ranking
        .iter()
        .take(CANDIDATES_LOGGED)
        .enumerate()
        .map(|(place, ranked)| {
            let bound = if exact[ranked.index] {
                ""
            } else {
                " (bytes charged: at most this working set)"
            };
            let pod = pods[ranked.index].key();
            format!("{}. {pod}: {}{bound}", place + 1, ranked.reason())
        })
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
