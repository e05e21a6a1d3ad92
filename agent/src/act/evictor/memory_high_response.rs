//! KEP-5986's two stages ([`crate::decide::memory_high`]), taken at each
//! reading of the pods' counters (every 10 s, at a timer tick, never while
//! a kill runs), only while one of its thresholds is set.
//!
//! Stage 1 writes the container's memory.high itself, where the KEP has
//! kubelet ask the runtime (CRI `UpdateContainerResources`): the runtime
//! still holds the old value, and its next update of the container (an
//! in-place resize) writes it back. A pod then under pressure again starts
//! at stage 1 again. As the KEP does, stage 1 sets the pod's
//! `ContainerMemoryPressure` condition, cleared when the pressure ends.
//!
//! Stage 2 evicts one pod a reading, as kubelet evicts one a cycle, in the
//! KEP's order: BestEffort before Burstable, lower priority first, then
//! the highest ratio of a signal to its threshold. Guaranteed pods, critical
//! pods and evictd's own are never evicted for it.
use std::{cmp::Ordering, collections::BTreeSet};

use tracing::{info, warn};

use super::Evictor;
use crate::{
    act::{
        io::{EvictionApi as _, Io, NodeSource as _},
        wake::Wake,
    },
    decide::snapshot::{PodSnapshot, QosClass},
    decide::{memory_high::Step, reason::KillReason},
    node::inventory::ContainerPressurePod,
    report::kubernetes::{PodWarning, PressureCondition},
};

/// What the stages have told, by pod uid.
#[derive(Default)]
pub(super) struct PressureTold {
    /// Exempt pods said to be past the grace: once while their pressure
    /// lasts, not at every reading.
    exempt: BTreeSet<String>,
    /// Pods whose `ContainerMemoryPressure` condition the API was asked to
    /// set: cleared when their pressure ends.
    condition_set: BTreeSet<String>,
}

impl<I: Io> Evictor<I> {
    pub(super) fn answer_container_pressure(
        &mut self,
        wake: &Wake,
        found: Vec<ContainerPressurePod>,
    ) {
        let now_ns = self.clock.now_ns();
        self.container_pressure.exempt.retain(|uid| {
            found.iter().any(|found| {
                found.pod.uid == *uid && matches!(found.finding.step, Step::Evict { .. })
            })
        });
        if let Some(api) = self.api.as_ref() {
            // A pod gone from the API has no condition left to clear.
            self.container_pressure
                .condition_set
                .retain(|uid| api.known(uid).is_some());
        }
        let mut candidates = Vec::new();
        for ContainerPressurePod { pod, finding } in found {
            match finding.step {
                Step::Recovered => self.clear_pressure_condition(&pod),
                _ if self.evictions.evicting(&pod.uid)
                    || self.safeguards.backing_off(&pod, now_ns) => {}
                Step::Wait => {}
                Step::Relax(containers) => {
                    self.relax_memory_high(&pod, &containers, &finding.description, now_ns);
                }
                Step::Evict { worst_ratio } => {
                    let exempt = if pod.qos_class() == QosClass::Guaranteed {
                        Some("a Guaranteed pod")
                    } else if !pod.is_evictable() {
                        Some("a critical pod or evictd's own")
                    } else {
                        None
                    };
                    match exempt {
                        Some(exempt) => {
                            if self.container_pressure.exempt.insert(pod.uid.clone()) {
                                warn!(pod = %pod.key(), description = finding.description, exempt,
                                    "containers under memory pressure past the grace period, but the pod is exempt: not evicted");
                            }
                        }
                        None => candidates.push((pod, finding.description, worst_ratio)),
                    }
                }
            }
        }
        candidates.sort_by(|(a, _, a_ratio), (b, _, b_ratio)| {
            eviction_order(a, b).then(b_ratio.partial_cmp(a_ratio).unwrap_or(Ordering::Equal))
        });
        let mut candidates = candidates.into_iter();
        let Some((pod, description, _)) = candidates.next() else {
            return;
        };
        for (waiting, ..) in candidates {
            info!(pod = %waiting.key(), "containers under memory pressure past the grace period; one pod is evicted a reading, this one waits for the next");
        }
        let grace = self.options.memory_high_thresholds.grace;
        let message = format!(
            "The pod's containers stayed under memory pressure past the {}s grace period: {description}. ",
            grace.as_secs()
        );
        let usage = pod.usage.memory_working_set_bytes;
        self.evict_for_own_memory(
            wake,
            &pod,
            KillReason::ContainerMemoryPressure,
            message,
            usage,
        );
    }

    /// Stage 1 for `containers` of `pod`: each one's memory.high raised to
    /// its memory.max (only said in a dry run).
    fn relax_memory_high(
        &mut self,
        pod: &PodSnapshot,
        containers: &[String],
        description: &str,
        now_ns: u64,
    ) {
        let Some(pod_cgroup) = pod.cgroup.as_deref() else {
            return;
        };
        let mut relaxed = Vec::new();
        for container in containers {
            let path = format!("{}/{container}", pod_cgroup.trim_end_matches('/'));
            let outcome = if self.options.dry_run {
                info!(pod = %pod.key(), container, description, at_ns = now_ns,
                    "memory.high would be relaxed (KEP-5986 stage 1; dry run)");
                "dry-run"
            } else {
                match self.node.relax_memory_high(&path) {
                    Ok(memory_high) => {
                        info!(pod = %pod.key(), container, memory_high, description, at_ns = now_ns,
                            "memory.high relaxed to memory.max (KEP-5986 stage 1)");
                        self.tell_relaxed(pod, container, &memory_high, description);
                        relaxed.push(format!("{container} to {memory_high}"));
                        "relaxed"
                    }
                    Err(e) => {
                        warn!(pod = %pod.key(), container, error = %e,
                            "cannot relax memory.high (KEP-5986 stage 1); the pod is evicted if the pressure outlasts the grace period");
                        "failed"
                    }
                }
            };
            self.metrics
                .memory_high_relaxations
                .with_label_values(&[outcome])
                .inc();
        }
        if !relaxed.is_empty() {
            let message = format!(
                "Containers under memory pressure ({description}); evictd raised memory.high to memory.max: {}. The pod is evicted if the pressure persists.",
                relaxed.join(", ")
            );
            self.tell_pressure_condition(pod, true, message);
        }
    }

    /// The pod's pressure ended after stage 1: its condition, if set, goes
    /// back to `False`.
    fn clear_pressure_condition(&mut self, pod: &PodSnapshot) {
        if !self.container_pressure.condition_set.contains(&pod.uid) {
            return;
        }
        info!(pod = %pod.key(), "containers' memory pressure subsided (KEP-5986): ContainerMemoryPressure cleared");
        self.tell_pressure_condition(
            pod,
            false,
            "Every container is back under the memory pressure thresholds.".to_owned(),
        );
    }

    /// KEP-5986's pod condition, where the API knows the pod.
    fn tell_pressure_condition(
        &mut self,
        pod: &PodSnapshot,
        under_pressure: bool,
        message: String,
    ) {
        let Some(api) = self.api.as_ref() else {
            return;
        };
        if api.known(&pod.uid).is_none() {
            return;
        }
        if under_pressure {
            self.container_pressure
                .condition_set
                .insert(pod.uid.clone());
        } else {
            self.container_pressure.condition_set.remove(&pod.uid);
        }
        api.set_pressure_condition(PressureCondition {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            under_pressure,
            message,
        });
    }

    /// Stage 1's warning event on the pod (the KEP's reason), where the
    /// API knows the pod.
    fn tell_relaxed(
        &self,
        pod: &PodSnapshot,
        container: &str,
        memory_high: &str,
        description: &str,
    ) {
        let Some(api) = self.api.as_ref() else {
            return;
        };
        if api.known(&pod.uid).is_none() {
            return;
        }
        api.warn_pod(PodWarning {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            reason: "MemoryHighRelaxed",
            message: format!(
                "Container {container} was throttled at its memory.high ({description}); evictd raised its memory.high to its memory.max ({memory_high}). The pod is evicted if the pressure persists."
            ),
        });
    }
}

/// The KEP's order before the signal ratio: BestEffort before Burstable,
/// lower priority first.
fn eviction_order(a: &PodSnapshot, b: &PodSnapshot) -> Ordering {
    let class = |pod: &PodSnapshot| match pod.qos_class() {
        QosClass::BestEffort => 0,
        QosClass::Burstable => 1,
        QosClass::Guaranteed => 2,
    };
    class(a).cmp(&class(b)).then(a.priority.cmp(&b.priority))
}
