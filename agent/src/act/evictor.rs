//! The loop that protects the node, one wake-up at a time: one fresh
//! observation of the node -> the scope levels and kernel tripwires it
//! implies -> `Engine::observe` -> what earlier evictions gave back ->
//! if a resource is starved and nothing holds evictd back, the pods ->
//! `Engine::choose` -> evictions started (`eviction`). Evictions run
//! beside the loop (a soft one's grace period, an Eviction API call, a kill
//! that takes long), so no wait ever delays a decision; the loop wakes the
//! engine again when one ends. What to do next is an `Action`, as
//! kube-runtime's controller returns one.
//!
//! Everything it touches outside memory goes through the seams of `Io`,
//! so the loop runs in unit tests without root.
mod eviction;
mod hook_placement;
mod memory_high_response;
mod record;
mod safeguards;
mod spent;
mod storage_limits;
mod thrashing_response;

use std::{
    borrow::Cow,
    collections::BTreeMap,
    rc::Rc,
    sync::Arc,
    time::{Duration, SystemTime},
};

use tracing::{debug, info, warn};

pub use eviction::Ended;
pub use safeguards::EvictionBudget;
pub use spent::{REMEMBERED as REMEMBERED_EVICTIONS, SpentBudget};

use crate::{
    act::{
        io::{Io, NodeSource, PodKiller},
        pre_kill::PreKillHook,
        wake::{Clock, ThreadUsage, Wake},
    },
    decide::snapshot::PodSnapshot,
    decide::{
        engine::{Assessment, Choice, Engine, Starvation, VictimPolicy},
        memory_high::MemoryHighThresholds,
        rank::PidRanking,
        thrashing::ThrashingLimits,
        thresholds::{EvictionConfig, NodeCondition, Resource, Signal},
    },
    kernel::bpf::CgroupChange,
    metrics::Metrics,
    node::{inventory::InventoryError, runtime::link::NodeReclaim},
    report::decisions::Outcome,
    scopes::{
        monitor::Monitor,
        tripwires::{MemcgLevels, tripwires},
        zone::{ZoneOptions, ZonePlan},
    },
};

/// While a memory or PID signal is inside the zone where only a fresh read
/// can tell whether its threshold is met (usage past the point where the
/// working set could reach the threshold), or a soft threshold waits out
/// its grace period, the engine looks again this often. 20 ms: a hog
/// allocating 1 GiB/s moves 20 MiB in that time, well inside kubelet's
/// 100Mi default.
pub(crate) const CLOSE_WATCH_INTERVAL: Duration = Duration::from_millis(20);

/// How often a disk decision looks whether the runtime's thread has
/// finished its node-level reclaim (while it reads the pods' disk usage,
/// the thread says when to look again: `InventoryError::DiskUsagePending`).
const DISK_USAGE_WAIT: Duration = Duration::from_millis(100);
/// How often a disk decision held because the runtime is down looks again
/// (the runtime's thread reconnects 1 s doubling to 60 s apart).
const DISK_UNKNOWN_WAIT: Duration = Duration::from_secs(1);

/// Pods of the ranking a decision's log line explains.
const CANDIDATES_LOGGED: usize = 5;

/// Pods read one at a time for a memory decision before every pod is read
/// at once: beyond a few, one pass is cheaper than ranking after each.
const MAX_SINGLE_READS: usize = 16;

/// A decision's pods, its choice, which pods' usage was read exactly
/// (the others' is a bound), and where its time went.
pub(super) struct Ranking {
    pods: Vec<Arc<PodSnapshot>>,
    choice: Choice,
    exact: Vec<bool>,
    times: DecisionTimes,
}

/// Where the time from a wake-up to its decision went, phase by phase, for
/// the `eviction decided` line: a slow decision says what was slow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct DecisionTimes {
    /// From the trigger (the kernel record's timestamp) to the engine run:
    /// the wake-up and the reading of the kernel's records.
    woken_to_run: Duration,
    /// Reading the node's signals.
    observe: Duration,
    /// Listing the pods with the usage they rank by (for memory, each pod's
    /// bytes charged).
    list: Duration,
    /// Every ranking the decision made.
    rank: Duration,
    /// Reading the exact usage of the pods the decision turns on, and how
    /// many pods were read so.
    exact_read: Duration,
    exact_reads: usize,
    /// When the engine run began, and its thread's usage then: a slow
    /// decision says how much of its run was spent off the CPU, and why.
    run_started_ns: u64,
    run_usage: Option<ThreadUsage>,
}

/// What the loop does after an engine run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Nothing is close: wait for the kernel, a notification, the timer or
    /// the end of an eviction.
    AwaitChange,
    /// Look again after this long, whatever else happens.
    Requeue(Duration),
}

/// What one engine run leaves for the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Evaluation {
    pub action: Action,
    /// Where cgroup v1 eventfd thresholds on the node belong now (`--mode
    /// memcg-threshold`), from this run's observation; `None` when the node
    /// could not be read (the levels stay where they are).
    pub memcg_levels: Option<MemcgLevels>,
    /// Where the precise memory hooks and their far trigger belong now;
    /// `None` when they are not managed or the node could not be read.
    pub precise: Option<ZonePlan>,
    /// Where the PID hooks belong now, by the node's distance to its PID
    /// lines; `None` when they are not managed by distance or the node
    /// could not be read.
    pub pid_hooks: Option<ZonePlan>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct EvictorOptions {
    pub policy: VictimPolicy,
    pub pid_ranking: PidRanking,
    pub dry_run: bool,
    pub reclaim_timeout: Duration,
    /// Kernel programs watch the engine's scopes (event mode); in the other
    /// modes the timer and notifications are all, as in kubelet.
    pub kernel_triggers: bool,
    pub budget: EvictionBudget,
    /// Attach the precise memory hooks only near a threshold
    /// (`--precise-hooks zone` with a kernel memory trigger).
    pub zone: Option<ZoneOptions>,
    /// Attach the PID hooks only near a PID threshold (`--precise-hooks
    /// zone` with a kernel PID trigger).
    pub pid_zone: Option<ZoneOptions>,
    /// Evict a pod thrashing at its own memory limit
    /// (`--thrashing-eviction`); it is reported either way, by
    /// `thrashing_limits`.
    pub thrashing_eviction: bool,
    pub thrashing_limits: ThrashingLimits,
    /// KEP-5986's thresholds and grace (each threshold 0: off).
    pub memory_high_thresholds: MemoryHighThresholds,
}

pub(crate) struct Evictor<I: Io> {
    engine: Engine,
    config: EvictionConfig,
    node: I::Node,
    killer: I::Killer,
    /// The Kubernetes API (--node-name): where kills are reported. Shared
    /// with the evictions under way.
    api: Option<Rc<I::Api>>,
    monitor: Monitor<I::Bands>,
    metrics: Arc<Metrics>,
    clock: Clock,
    options: EvictorOptions,
    /// Conditions reported by the last run, to log changes once.
    conditions: Vec<NodeCondition>,
    /// A decision that killed nothing (dry run, no pod may go, a refused
    /// eviction): reported once, not again on every run while the pressure
    /// lasts.
    unacted: Option<Vec<String>>,
    evictions: eviction::Evictions,
    safeguards: safeguards::Safeguards,
    /// The budget on disk, for the next agent (`--state-dir`).
    spent_budget: Option<SpentBudget>,
    /// Shared with the evictions under way.
    pre_kill: Option<Rc<PreKillHook>>,
    zone: Option<hook_placement::Zone>,
    pid_zone: Option<hook_placement::Zone>,
    local_storage: storage_limits::LocalStorageChecks,
    thrashing: thrashing_response::ThrashingChecks,
    container_pressure: memory_high_response::PressureTold,
    /// Disk thresholds whose node-level reclaim is under way: each is
    /// decided again once it is done, met or not ([`Evictor::decide`]).
    reclaim_asked: BTreeMap<Signal, Starvation>,
    /// The current engine run's first phases (see [`DecisionTimes`]).
    run_times: DecisionTimes,
    /// `--decision-records`: where each threshold decision is kept.
    recorder: Option<record::Recorder>,
}

/// The parts of an [`Evictor`], for its constructor.
pub(crate) struct Parts<I: Io> {
    pub node: I::Node,
    pub killer: I::Killer,
    pub api: Option<I::Api>,
    pub monitor: Monitor<I::Bands>,
    /// Where the budget spent is kept across restarts; none in a dry run,
    /// which spends nothing.
    pub spent_budget: Option<SpentBudget>,
    /// What runs before a soft eviction's SIGTERM (`--pre-kill-hook`).
    pub pre_kill: Option<PreKillHook>,
}

impl<I: Io> Evictor<I> {
    pub(crate) fn new(
        config: EvictionConfig,
        parts: Parts<I>,
        metrics: Arc<Metrics>,
        clock: Clock,
        options: EvictorOptions,
    ) -> Self {
        let mut safeguards = safeguards::Safeguards::new(options.budget);
        if let Some(file) = &parts.spent_budget {
            let ago = file.load(SystemTime::now());
            safeguards.restore(&ago, clock.now_ns());
            if !ago.is_empty() {
                info!(spent = ago.len(), budget = %options.budget,
                    "the evictions the last agent started count in this one's budget");
            }
        }
        Self {
            engine: Engine::new(config.clone()).with_pid_ranking(options.pid_ranking),
            config,
            node: parts.node,
            killer: parts.killer,
            api: parts.api.map(Rc::new),
            monitor: parts.monitor,
            metrics,
            clock,
            options,
            conditions: Vec::new(),
            unacted: None,
            evictions: eviction::Evictions::default(),
            safeguards,
            spent_budget: parts.spent_budget,
            pre_kill: parts.pre_kill.map(Rc::new),
            zone: options.zone.map(hook_placement::Zone::new),
            pid_zone: options.pid_zone.map(hook_placement::Zone::new),
            local_storage: storage_limits::LocalStorageChecks::default(),
            thrashing: thrashing_response::ThrashingChecks::default(),
            container_pressure: memory_high_response::PressureTold::default(),
            reclaim_asked: BTreeMap::new(),
            run_times: DecisionTimes::default(),
            recorder: None,
        }
    }

    pub(crate) fn monitor(&mut self) -> &mut Monitor<I::Bands> {
        &mut self.monitor
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Cgroups may have been created or removed (records lost, or a resync
    /// without the lifecycle programs): the pods are listed again before
    /// the next decision.
    pub(crate) fn cgroups_changed(&mut self) {
        self.node.cgroups_changed();
    }

    /// A kernel record of a cgroup created or removed: the pods are listed
    /// again before the next decision if it may change them.
    pub(crate) fn cgroup_changed(&mut self, change: &CgroupChange) {
        match change.path() {
            (_, true) => self.node.cgroups_changed(),
            (path, false) => self.node.cgroup_changed(change.0.hierarchy_id, &path),
        }
    }

    /// The API side and the monitor back, for shutdown; evictions still
    /// under way are dropped (a soft one's SIGTERM has been sent; a pod a
    /// dropped kill froze is thawed as the kill is dropped).
    pub(crate) fn into_parts(self) -> (Option<I::Api>, Monitor<I::Bands>) {
        drop(self.evictions);
        let api = self.api.and_then(|api| Rc::try_unwrap(api).ok());
        (api, self.monitor)
    }

    /// Runs the engine on fresh numbers and starts the evictions it calls
    /// for. Never waits: evictions run beside the loop
    /// ([`Evictor::next_ended`]).
    pub(crate) fn evaluate(&mut self, wake: Wake) -> Evaluation {
        self.metrics
            .engine_runs
            .with_label_values(&[wake.cause.as_str()])
            .inc();
        let run_usage = ThreadUsage::now();
        let run_ns = self.clock.now_ns();
        let observation = match self.node.observe() {
            Ok(observation) => observation,
            Err(e) => {
                warn!(error = %e, "cannot read the node's signals");
                return Evaluation {
                    action: self.soon(),
                    memcg_levels: None,
                    precise: None,
                    pid_hooks: None,
                };
            }
        };
        self.run_times = DecisionTimes {
            woken_to_run: Duration::from_nanos(run_ns.saturating_sub(wake.at_ns)),
            observe: self.clock.since(run_ns),
            run_started_ns: run_ns,
            run_usage,
            ..DecisionTimes::default()
        };
        let assessment = self.engine.observe(self.clock.now(), &observation.stats);
        self.observed_for_record(&observation.stats);
        self.report_state(&assessment);
        let wires = tripwires(&self.config, &observation);
        let engine_raised = self.monitor.apply_engine(&wires.scopes);
        let reclaiming = self.check_reclaims(&assessment);
        // Before any threshold, as kubelet's synchronize takes them; a
        // round that evicted for local storage decides no threshold, and
        // the next one follows at once.
        let pod_limits = self.check_local_storage(&wake, assessment.layout.dedicated_imagefs());
        let action = if pod_limits.evicted {
            if assessment.starved.is_empty() {
                Action::AwaitChange
            } else {
                self.soon()
            }
        } else if assessment.starved.is_empty() && self.reclaim_asked.is_empty() {
            self.unacted = None;
            self.safeguards.release(&assessment, &self.metrics);
            if engine_raised || !assessment.thresholds_met.is_empty() {
                self.soon()
            } else {
                Action::AwaitChange
            }
        } else {
            self.decide(&wake, &assessment)
        };
        // After the decision: an eviction it started takes the hooks off.
        let precise = self.plan_precise(&wires.scopes);
        let pid_hooks = self.plan_pid_hooks(&wires.scopes);
        let read_after = [&precise, &pid_hooks]
            .into_iter()
            .filter_map(|plan| plan.as_ref()?.read_after)
            .min();
        let next = sooner(
            sooner(sooner(action, reclaiming), read_after),
            pod_limits.look_again,
        );
        // What keeps the engine running (a close watch costs a whole run
        // every 20 ms): per run, at debug.
        let spent = ThreadUsage::now()
            .zip(run_usage)
            .map(|(now, start)| now.since(&start));
        debug!(
            cause = wake.cause.as_str(),
            decided = ?action,
            reclaiming = ?reclaiming,
            read_after = ?read_after,
            next = ?next,
            engine_raised,
            starved = assessment.starved.len(),
            thresholds_met = assessment.thresholds_met.len(),
            evictions = self.evictions_running(),
            run_us = self.clock.since(run_ns).as_micros() as u64,
            on_cpu_us = spent.map(|spent| spent.cpu.as_micros() as u64),
            page_faults = spent.map(|spent| spent.page_faults),
            "engine run"
        );
        Evaluation {
            action: next,
            memcg_levels: Some(wires.memcg_levels),
            precise,
            pid_hooks,
        }
    }

    /// One decision: who goes for the first starved threshold that nothing
    /// holds back. A threshold whose resource is already coming back, or
    /// whose soft eviction waits out its grace period, or that a safeguard
    /// holds, leaves the decision to the next one (a hard PID threshold does
    /// not wait behind a soft memory eviction).
    ///
    /// A disk threshold first has the runtime reclaim for it (kubelet's
    /// `reclaimNodeLevelResources`), one signal's round at a time as
    /// kubelet reclaims for one threshold per round; the others wait for
    /// it. Once it is done, the node looked at again is held to every
    /// threshold with its minimum reclaim ([`Engine::after_reclaim`]): a
    /// pod is evicted for the reclaimed signal while any is met, even if
    /// that signal's own threshold is met no more, and nobody otherwise.
    fn decide(&mut self, wake: &Wake, assessment: &Assessment) -> Action {
        let now_ns = self.clock.now_ns();
        let mut waiting = Action::AwaitChange;
        let reclaimed_since: Vec<Starvation> = self
            .reclaim_asked
            .values()
            .filter(|asked| {
                !assessment
                    .starved
                    .iter()
                    .any(|starved| starved.threshold.signal == asked.threshold.signal)
            })
            .cloned()
            .collect();
        let candidates = assessment
            .starved
            .iter()
            .map(|starvation| (starvation, true))
            .chain(reclaimed_since.iter().map(|asked| (asked, false)));
        let mut reclaim_under_way = false;
        for (starvation, met_now) in candidates {
            let signal = starvation.threshold.signal;
            let resource = starvation.resource;
            // Killing more before a victim's resource is back would take
            // pods for nothing; its end, or the reclaim's poll, wakes the
            // engine.
            // A pod killed for its local-storage limit frees disk too.
            let disk = matches!(resource, Resource::EphemeralStorage | Resource::Inodes);
            if self.evictions.reclaiming(resource)
                || self.evictions.hard_running(resource)
                || (disk && self.evictions.pod_limit_running())
            {
                continue;
            }
            if !starvation.threshold.hard && self.evictions.any_running() {
                waiting = self.soon();
                continue;
            }
            if self.safeguards.held(signal, now_ns) {
                self.record_decision(wake, starvation, None, Outcome::HeldOutsidePods);
                waiting = self.soon();
                continue;
            }
            // Disk: the runtime's dead containers and unused images go
            // first, and the node is looked at again before anyone is
            // evicted. Its thread works meanwhile; other resources are
            // decided now.
            let starvation = if disk {
                if reclaim_under_way {
                    continue;
                }
                match self.node.reclaim(signal, self.options.dry_run) {
                    NodeReclaim::Pending => {
                        self.reclaim_asked.insert(signal, starvation.clone());
                        reclaim_under_way = true;
                        waiting = sooner(waiting, Some(DISK_USAGE_WAIT));
                        continue;
                    }
                    NodeReclaim::Done => match self.reclaim_asked.remove(&signal) {
                        Some(asked) => match self.engine.after_reclaim(&asked, assessment) {
                            Some(fresh) => Cow::Owned(fresh),
                            None => {
                                info!(%signal, "node-level reclaim brought every threshold back past its minimum reclaim: no pod is evicted");
                                continue;
                            }
                        },
                        None => Cow::Borrowed(starvation),
                    },
                    NodeReclaim::Unavailable => {
                        self.reclaim_asked.remove(&signal);
                        if !met_now {
                            continue;
                        }
                        Cow::Borrowed(starvation)
                    }
                }
            } else {
                Cow::Borrowed(starvation)
            };
            match self.decide_for(wake, assessment, &starvation) {
                Ok(action) => return action,
                Err(look_again) => waiting = sooner(waiting, look_again),
            }
        }
        waiting
    }

    /// Who goes for `starvation`; no decision, and when to look again,
    /// while the runtime's thread reads the pods' disk usage (the decision
    /// is made on it, not on none) or while the runtime cannot say what the
    /// pods use (held), and none (the end of an eviction wakes the engine)
    /// while every pod chosen is being evicted already; the next starved
    /// resource is decided meanwhile.
    fn decide_for(
        &mut self,
        wake: &Wake,
        assessment: &Assessment,
        starvation: &Starvation,
    ) -> Result<Action, Option<Duration>> {
        let ranking = match self.choose(assessment, starvation) {
            Ok(ranking) => ranking,
            Err(InventoryError::DiskUsagePending { wait }) => return Err(Some(wait)),
            Err(InventoryError::DiskUsageUnknown) => {
                self.safeguards.hold_disk_unknown(
                    starvation.threshold.signal,
                    self.clock.now_ns(),
                    &self.metrics,
                );
                self.record_decision(wake, starvation, None, Outcome::HeldDiskUsageUnknown);
                return Err(Some(DISK_UNKNOWN_WAIT));
            }
            Err(e) => {
                warn!(error = %e, "cannot list the node's pods");
                return Ok(self.soon());
            }
        };
        self.metrics
            .decision_latency
            .observe(self.clock.since(wake.at_ns).as_secs_f64());
        self.start_evictions(wake, starvation, &ranking).ok_or(None)
    }

    /// Ranks the pods for `starvation` and picks the victims, reading no
    /// more than the decision needs: a cheap listing first (for memory, the
    /// bytes charged, an upper bound of the working set), then the exact
    /// usage of the pods ranked up to the last victim, one at a time,
    /// ranking again after each. An exact working set is never above its
    /// bound, so a pod only moves down when read, and no pod left unread
    /// can belong before the victim. Pods are near ties when many look
    /// bigger than the biggest by their page cache alone; past
    /// [`MAX_SINGLE_READS`] reads every pod is read at once.
    ///
    /// Only running pods can give anything back (kubelet ranks its active
    /// pods; a killed pod's empty cgroup may linger), and a pod whose last
    /// kill failed waits out its back-off while the next one is taken, as
    /// kubelet's synchronize moves on to the next pod. A pod being evicted
    /// stays in the ranking: if it is the one to go, its eviction is
    /// waited for, not doubled nor passed over for the next pod.
    fn choose(
        &mut self,
        assessment: &Assessment,
        starvation: &Starvation,
    ) -> Result<Ranking, InventoryError> {
        let now_ns = self.clock.now_ns();
        let keep = |pod: &PodSnapshot, bounded: bool| {
            (bounded || pod.usage.pids > 0) && !self.safeguards.backing_off(pod, now_ns)
        };
        let bounded = starvation.resource == Resource::Memory;
        let mut times = self.run_times;
        let mut phase_ns = self.clock.now_ns();
        let mut pods: Vec<Arc<PodSnapshot>> = self
            .node
            .pods_for(starvation.resource)?
            .into_iter()
            .filter(|pod| keep(pod, bounded))
            .collect();
        times.list = self.clock.since(phase_ns);
        let mut exact = vec![!bounded; pods.len()];
        loop {
            phase_ns = self.clock.now_ns();
            let choice =
                self.engine
                    .choose_for(starvation, assessment.layout, &pods, self.options.policy);
            times.rank += self.clock.since(phase_ns);
            let decided = choice
                .victims
                .iter()
                .filter_map(|victim| choice.ranking.iter().position(|r| r.index == victim.index))
                .max()
                .map_or(choice.ranking.len(), |last| last + 1);
            let Some(inexact) = choice.ranking[..decided]
                .iter()
                .map(|ranked| ranked.index)
                .find(|&index| !exact[index])
            else {
                return Ok(Ranking {
                    pods,
                    choice,
                    exact,
                    times,
                });
            };
            phase_ns = self.clock.now_ns();
            if times.exact_reads == MAX_SINGLE_READS {
                let pods: Vec<Arc<PodSnapshot>> = self
                    .node
                    .pods()?
                    .into_iter()
                    .filter(|pod| keep(pod, false))
                    .map(Arc::new)
                    .collect();
                times.exact_read += self.clock.since(phase_ns);
                times.exact_reads += pods.len();
                phase_ns = self.clock.now_ns();
                let choice = self.engine.choose_for(
                    starvation,
                    assessment.layout,
                    &pods,
                    self.options.policy,
                );
                times.rank += self.clock.since(phase_ns);
                let exact = vec![true; pods.len()];
                return Ok(Ranking {
                    pods,
                    choice,
                    exact,
                    times,
                });
            }
            let refined = self.node.refine(&pods[inexact]);
            times.exact_read += self.clock.since(phase_ns);
            times.exact_reads += 1;
            match refined? {
                Some(pod) => {
                    pods[inexact] = Arc::new(pod);
                    exact[inexact] = true;
                }
                None => {
                    pods.remove(inexact);
                    exact.remove(inexact);
                }
            }
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

/// The earlier of two actions.
fn sooner(action: Action, other: Option<Duration>) -> Action {
    match (action, other) {
        (Action::Requeue(after), Some(other)) => Action::Requeue(after.min(other)),
        (Action::AwaitChange, Some(other)) => Action::Requeue(other),
        (action, None) => action,
    }
}

/// Thaws pods a previous agent froze for a kill it never finished (it was
/// killed itself): once, at startup.
pub(crate) fn thaw_abandoned_pods(node: &mut impl NodeSource, killer: &impl PodKiller) {
    let pods = match node.pods() {
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
    for cgroup in killer.thaw_abandoned(&cgroups) {
        warn!(
            cgroup,
            "thawed a pod left frozen by an agent stopped in the middle of its kill"
        );
    }
}

#[cfg(test)]
mod tests;
