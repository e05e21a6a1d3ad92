//! The eviction decision, as kubelet's eviction manager makes it
//! (`synchronize` in pkg/kubelet/eviction/eviction_manager.go), split in
//! two so the agent decides whether anything is starved before it reads a
//! single pod: [`Engine::observe`] turns node statistics into thresholds
//! met, node conditions and the starved resource; [`Engine::choose`] ranks
//! pods and picks victims.
//!
//! Time is injected: every call takes `now`, a duration since an arbitrary
//! epoch that never goes backwards, so grace and transition periods are
//! tested without sleeping.
use std::{
    borrow::Borrow,
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use crate::{
    decide::layout::DiskLayout,
    decide::rank::{self, PidRanking, Ranked},
    decide::reason::KillReason,
    decide::snapshot::{NodeStats, PodSnapshot},
    decide::thresholds::{
        EvictionConfig, NodeCondition, Resource, Signal, Threshold, with_containerfs_thresholds,
    },
};

mod victims;

pub(crate) use victims::{Choice, Victim, VictimPolicy};

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub(crate) const DEFAULT_TERMINATION_GRACE_PERIOD: Duration = Duration::from_secs(30);

/// A signal's value at one instant, with the capacity its percentages are
/// taken of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observation {
    pub available: i64,
    pub capacity: i64,
}

/// Every observed signal. A signal whose input is absent is missing, and
/// its thresholds are never met (kubelet's `makeSignalObservations`).
pub(crate) fn observe_signals(node: &NodeStats) -> BTreeMap<Signal, Observation> {
    let int = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    // kubelet computes capacity - working set in unsigned arithmetic and
    // reads it back as signed, so a working set above capacity is a
    // negative availability, not a clamp to zero.
    let memory = |stats: &crate::decide::snapshot::MemoryStats| Observation {
        available: int(stats.capacity_bytes).wrapping_sub(int(stats.working_set_bytes)),
        capacity: int(stats.capacity_bytes),
    };
    let mut observations = BTreeMap::new();
    observations.insert(Signal::MemoryAvailable, memory(&node.memory));
    if let Some(allocatable) = &node.allocatable {
        observations.insert(Signal::AllocatableMemoryAvailable, memory(allocatable));
    }
    if let Some(pid) = &node.pid {
        observations.insert(
            Signal::PidAvailable,
            Observation {
                available: int(pid.max).wrapping_sub(int(pid.in_use)),
                capacity: int(pid.max),
            },
        );
    }
    let filesystems = [
        (
            &node.nodefs,
            Signal::NodeFsAvailable,
            Signal::NodeFsInodesFree,
        ),
        (
            &node.imagefs,
            Signal::ImageFsAvailable,
            Signal::ImageFsInodesFree,
        ),
        (
            &node.containerfs,
            Signal::ContainerFsAvailable,
            Signal::ContainerFsInodesFree,
        ),
    ];
    for (fs, bytes, inodes) in filesystems {
        if let Some(fs) = fs {
            observations.insert(
                bytes,
                Observation {
                    available: int(fs.available_bytes),
                    capacity: int(fs.capacity_bytes),
                },
            );
            observations.insert(
                inodes,
                Observation {
                    available: int(fs.inodes_free),
                    capacity: int(fs.inodes),
                },
            );
        }
    }
    observations
}

/// What one observation of the node means, before any pod is looked at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Assessment {
    pub now: Duration,
    pub observations: BTreeMap<Signal, Observation>,
    /// Thresholds met now, or met before and not yet back past their
    /// minimum reclaim, regardless of grace periods; in configuration order.
    pub thresholds_met: Vec<Threshold>,
    /// Conditions reported now, transition period included.
    pub node_conditions: Vec<NodeCondition>,
    /// What to reclaim now, the first of [`Assessment::starved`]; `None`
    /// while nothing is past its grace period.
    pub starvation: Option<Starvation>,
    /// Every threshold past its grace period, in the order kubelet reclaims
    /// for them: what to turn to when the first is already being reclaimed.
    pub starved: Vec<Starvation>,
    /// Where images and writable layers live, which decides what disk
    /// usage ranks pods.
    pub layout: DiskLayout,
}

impl Assessment {
    /// The signals of [`Assessment::thresholds_met`], each once.
    pub(crate) fn signals_met(&self) -> BTreeSet<Signal> {
        self.thresholds_met.iter().map(|t| t.signal).collect()
    }
}

/// The threshold an eviction reclaims for and how far the node is from
/// safe.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Starvation {
    pub threshold: Threshold,
    pub resource: Resource,
    pub observation: Observation,
    /// The threshold's value against the signal's capacity.
    pub threshold_quantity: i64,
    pub min_reclaim_quantity: i64,
}

impl Starvation {
    /// How much must come back for the signal to reach threshold + minimum
    /// reclaim.
    pub(crate) fn deficit(&self) -> i64 {
        self.threshold_quantity
            .saturating_add(self.min_reclaim_quantity)
            .saturating_sub(self.observation.available)
    }
}

/// A threshold met at the end of a round: the engine state a decision
/// depends on besides the node it observed (a soft threshold's grace, a
/// threshold held until its minimum reclaim is back).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MetThreshold {
    pub signal: Signal,
    pub hard: bool,
    pub met_for_seconds: f64,
    pub past_grace: bool,
}

/// kubelet's eviction manager state between two observations.
#[derive(Debug, Clone)]
pub(crate) struct Engine {
    config: EvictionConfig,
    /// The configuration's thresholds with the containerfs ones kubelet
    /// derives for `layout` ([`with_containerfs_thresholds`]), made when
    /// the layout is first seen and again if it changes.
    thresholds: Vec<Threshold>,
    layout: Option<DiskLayout>,
    /// Indices into `thresholds` met last time and past their grace
    /// period: these stay met until minimum reclaim is recovered.
    met_past_grace: BTreeSet<usize>,
    first_observed: BTreeMap<usize, Duration>,
    condition_last_observed: BTreeMap<NodeCondition, Duration>,
    pid_ranking: PidRanking,
}

impl Engine {
    pub(crate) fn new(config: EvictionConfig) -> Self {
        Self {
            thresholds: config.thresholds.clone(),
            layout: None,
            config,
            met_past_grace: BTreeSet::new(),
            first_observed: BTreeMap::new(),
            condition_last_observed: BTreeMap::new(),
            pid_ranking: PidRanking::Kubelet,
        }
    }

    /// Ranks PID pressure's pods as `pid_ranking` says (kubelet's order
    /// unless told otherwise).
    pub(crate) fn with_pid_ranking(self, pid_ranking: PidRanking) -> Self {
        Self {
            pid_ranking,
            ..self
        }
    }

    /// The thresholds met at `now` (this round's observation made), each
    /// with how long it has been met and whether it is past its grace
    /// period: what the next round starts from, and what a replay must
    /// start from to decide as this round did ([`Engine::resume`]).
    pub(crate) fn thresholds_met_state(&self, now: Duration) -> Vec<MetThreshold> {
        self.first_observed
            .iter()
            .map(|(&index, &first)| {
                let threshold = &self.thresholds[index];
                MetThreshold {
                    signal: threshold.signal,
                    hard: threshold.hard,
                    met_for_seconds: now.saturating_sub(first).as_secs_f64(),
                    past_grace: self.met_past_grace.contains(&index),
                }
            })
            .collect()
    }

    /// An engine that has seen `met` at `now` on a node of `layout`, as
    /// [`Engine::thresholds_met_state`] gave it: its next observation at
    /// `now` decides as the recorded one did. Entries naming no threshold
    /// of the configuration are left out.
    pub(crate) fn resume(
        mut self,
        now: Duration,
        layout: DiskLayout,
        met: &[MetThreshold],
    ) -> Self {
        self.thresholds = with_containerfs_thresholds(&self.config.thresholds, layout);
        self.layout = Some(layout);
        for entry in met {
            let Some(index) = self
                .thresholds
                .iter()
                .position(|t| t.signal == entry.signal && t.hard == entry.hard)
            else {
                continue;
            };
            let mut met_for =
                Duration::try_from_secs_f64(entry.met_for_seconds).unwrap_or_default();
            // Seconds as a float may come back a nanosecond short of a
            // grace period the record says was over.
            if entry.past_grace {
                met_for = met_for.max(self.thresholds[index].grace_period);
            }
            self.first_observed
                .insert(index, now.saturating_sub(met_for));
            if entry.past_grace {
                self.met_past_grace.insert(index);
            }
        }
        self
    }

    /// One round of kubelet's `synchronize`, up to the starved resource.
    /// kubelet also skips thresholds whose statistics did not change since
    /// the last round (`thresholdsUpdatedStats`); evictd reads fresh
    /// statistics for every round, so there is nothing to skip.
    pub(crate) fn observe(&mut self, now: Duration, node: &NodeStats) -> Assessment {
        let layout = node.disk_layout();
        if self.layout != Some(layout) {
            self.thresholds = with_containerfs_thresholds(&self.config.thresholds, layout);
            self.layout = Some(layout);
        }
        let observations = observe_signals(node);
        let thresholds = &self.thresholds;
        let met = |index: &usize, with_min_reclaim: bool| {
            is_met(&thresholds[*index], &observations, with_min_reclaim)
        };
        // Met now, plus met last round (past grace) and still short of
        // threshold + minimum reclaim (`thresholdsNotYetResolved`).
        let mut active: BTreeSet<usize> = (0..thresholds.len())
            .filter(|index| met(index, false))
            .collect();
        active.extend(self.met_past_grace.iter().filter(|index| met(index, true)));

        self.first_observed = active
            .iter()
            .map(|&index| (index, *self.first_observed.get(&index).unwrap_or(&now)))
            .collect();

        // Conditions follow thresholds met regardless of grace, and stay
        // while last seen less than the transition period ago.
        for &index in &active {
            let condition = thresholds[index].signal.node_condition();
            self.condition_last_observed.insert(condition, now);
        }
        let period = self.config.pressure_transition_period;
        let node_conditions = self
            .condition_last_observed
            .iter()
            .filter(|&(_, &last)| now.saturating_sub(last) < period)
            .map(|(&condition, _)| condition)
            .collect();

        self.met_past_grace = self
            .first_observed
            .iter()
            .filter(|&(&index, &first)| now.saturating_sub(first) >= thresholds[index].grace_period)
            .map(|(&index, _)| index)
            .collect();

        let starved: Vec<Starvation> = self
            .reclaim_order()
            .into_iter()
            .filter_map(|index| {
                let threshold = &thresholds[index];
                let observation = observations.get(&threshold.signal)?;
                Some(Starvation {
                    threshold: threshold.clone(),
                    resource: threshold.signal.resource(),
                    observation: *observation,
                    threshold_quantity: threshold.value.resolve(observation.capacity),
                    min_reclaim_quantity: threshold.min_reclaim.resolve(observation.capacity),
                })
            })
            .collect();
        Assessment {
            now,
            thresholds_met: active.iter().map(|&i| thresholds[i].clone()).collect(),
            node_conditions,
            starvation: starved.first().cloned(),
            starved,
            layout,
            observations,
        }
    }

    /// kubelet's verdict after node-level reclaim for `asked`
    /// (`reclaimNodeLevelResources`): on the fresh `assessment`, every
    /// threshold is held to its value plus minimum reclaim, whatever its
    /// grace period (`thresholdsMet(thresholds, observations, true)`). None
    /// met: the reclaim was enough, nobody is evicted. Any met, the one
    /// asked for or another: a pod is evicted for `asked`, ranked as its
    /// signal ranks, against the signal as observed now.
    pub(crate) fn after_reclaim(
        &self,
        asked: &Starvation,
        assessment: &Assessment,
    ) -> Option<Starvation> {
        let observations = &assessment.observations;
        self.thresholds
            .iter()
            .any(|threshold| is_met(threshold, observations, true))
            .then(|| {
                let observation = observations
                    .get(&asked.threshold.signal)
                    .copied()
                    .unwrap_or(asked.observation);
                Starvation {
                    observation,
                    threshold_quantity: asked.threshold.value.resolve(observation.capacity),
                    min_reclaim_quantity: asked.threshold.min_reclaim.resolve(observation.capacity),
                    ..asked.clone()
                }
            })
    }

    /// The thresholds past their grace period, the one to reclaim for first
    /// first, as kubelet's `byEvictionPriority` then
    /// `getReclaimableThreshold`: memory signals before the rest. kubelet's
    /// order among the rest comes from map iteration, so it is arbitrary;
    /// evictd takes hard thresholds before soft ones (the node is further
    /// gone), then configuration order.
    fn reclaim_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = self.met_past_grace.iter().copied().collect();
        order.sort_by_key(|&index| {
            let threshold = &self.thresholds[index];
            (
                threshold.signal.resource() != Resource::Memory,
                !threshold.hard,
                index,
            )
        });
        order
    }

    /// Ranks `pods` for the starved resource and picks the victims.
    /// Nothing starved: an empty ranking and no victim.
    pub(crate) fn choose(
        &self,
        assessment: &Assessment,
        pods: &[PodSnapshot],
        policy: VictimPolicy,
    ) -> Choice {
        match &assessment.starvation {
            Some(starvation) => self.choose_for(starvation, assessment.layout, pods, policy),
            None => Choice::default(),
        }
    }

    /// Ranks `pods` for `starvation` and picks the victims.
    pub(crate) fn choose_for<P: Borrow<PodSnapshot>>(
        &self,
        starvation: &Starvation,
        layout: DiskLayout,
        pods: &[P],
        policy: VictimPolicy,
    ) -> Choice {
        let ranking: Vec<Ranked> =
            rank::rank(pods, starvation.threshold.signal, layout, self.pid_ranking);
        let deficit = starvation.deficit();
        let chosen = victims::select(&ranking, deficit, policy);
        let victims = chosen
            .into_iter()
            .map(|position| {
                let ranked = &ranking[position];
                Victim {
                    pod: pods[ranked.index].borrow().key(),
                    index: ranked.index,
                    usage: ranked.usage,
                    grace_period: self
                        .grace_period(&starvation.threshold, pods[ranked.index].borrow()),
                    reason: KillReason::for_threshold(
                        starvation.threshold.signal,
                        &ranking,
                        position,
                    ),
                }
            })
            .collect();
        Choice {
            ranking,
            victims,
            deficit: Some(deficit),
        }
    }

    /// Hard thresholds kill at once; soft ones give the pod its own grace
    /// period, at most --eviction-max-pod-grace-period.
    fn grace_period(&self, threshold: &Threshold, pod: &PodSnapshot) -> Duration {
        if threshold.hard {
            return Duration::ZERO;
        }
        self.soft_grace_period(pod)
    }

    /// A soft eviction's grace period: the pod's own, at most
    /// --eviction-max-pod-grace-period.
    pub(crate) fn soft_grace_period(&self, pod: &PodSnapshot) -> Duration {
        let own = pod
            .termination_grace_period_seconds
            .map_or(DEFAULT_TERMINATION_GRACE_PERIOD, |seconds| {
                Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
            });
        own.min(self.config.max_pod_grace_period)
    }
}

/// kubelet's `thresholdsMet`: available below the threshold, or below
/// threshold + minimum reclaim when `with_min_reclaim`. An unobserved
/// signal meets nothing.
fn is_met(
    threshold: &Threshold,
    observations: &BTreeMap<Signal, Observation>,
    with_min_reclaim: bool,
) -> bool {
    let Some(observed) = observations.get(&threshold.signal) else {
        return false;
    };
    let mut quantity = threshold.value.resolve(observed.capacity);
    if with_min_reclaim {
        quantity = quantity.saturating_add(threshold.min_reclaim.resolve(observed.capacity));
    }
    observed.available < quantity
}

#[cfg(test)]
mod tests;
