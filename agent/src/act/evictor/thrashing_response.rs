//! Pods thrashing at their own memory limit ([`crate::decide::thrashing`]),
//! found at each reading of the pods' counters (every 10 s, at a timer
//! tick, never while a kill runs). Each is said once while it thrashes (a
//! warning; `evictd_pod_memory_thrashing` says it at every reading), and
//! with `--thrashing-eviction` evicted as a soft memory eviction is: its
//! own grace period (at most --eviction-max-pod-grace-period), the
//! Eviction API where `--eviction-action evict` asks for it, the pre-kill
//! hook, within the eviction budget; reason `thrashing`. Off, nothing but
//! the report changes: kubelet evicts for no such thing.
use std::collections::BTreeSet;

use tracing::{info, warn};

use super::{Evictor, eviction::Cause};
use crate::{
    act::{
        io::{Io, NodeSource as _},
        wake::Wake,
    },
    decide::snapshot::PodSnapshot,
    decide::{engine::Victim, reason::KillReason, thresholds::Resource},
    logs,
    node::inventory::ThrashingPod,
};

#[derive(Default)]
pub(super) struct ThrashingChecks {
    /// Pods found thrashing at the last reading and said so: said again
    /// only once they stopped and started again.
    told: BTreeSet<String>,
}

impl<I: Io> Evictor<I> {
    /// Reads the pods' memory stall and refault counters if they are due,
    /// and answers the pods found thrashing and those whose containers'
    /// pressure calls for a KEP-5986 stage.
    pub(crate) fn read_memory_stalls(&mut self, wake: &Wake) {
        let Some(found) = self.node.read_memory_stalls() else {
            return;
        };
        self.thrashing.told.retain(|uid| {
            found
                .thrashing
                .iter()
                .any(|thrashing| thrashing.pod.uid == *uid)
        });
        for thrashing in found.thrashing {
            self.answer_thrashing(wake, thrashing);
        }
        self.answer_container_pressure(wake, found.container_pressure);
    }

    fn answer_thrashing(&mut self, wake: &Wake, found: ThrashingPod) {
        let ThrashingPod { pod, thrashing } = found;
        let now_ns = self.clock.now_ns();
        if self.evictions.evicting(&pod.uid) || self.safeguards.backing_off(&pod, now_ns) {
            return;
        }
        let act = self.options.thrashing_eviction && pod.is_evictable() && !self.options.dry_run;
        if !self.thrashing.told.insert(pod.uid.clone()) && !act {
            return;
        }
        let message = thrashing.describe(self.options.thrashing_limits);
        warn!(
            pod = %pod.key(),
            usage_bytes = logs::bytes(thrashing.usage_bytes).logged(),
            limit_bytes = logs::bytes(thrashing.limit_bytes).logged(),
            refaulted_percent = thrashing.refaulted_percent,
            stalled_percent = thrashing.stalled_percent,
            window_ms = thrashing.window.as_millis() as u64,
            evicted = act,
            description = message,
            at_ns = now_ns,
            "pod thrashing at its memory limit"
        );
        if !self.options.thrashing_eviction {
            return;
        }
        if !pod.is_evictable() {
            warn!(pod = %pod.key(), "thrashing, but a critical pod or evictd's own: not evicted");
            return;
        }
        self.evict_for_own_memory(
            wake,
            &pod,
            KillReason::Thrashing,
            message,
            thrashing.usage_bytes,
        );
    }

    /// Evicts `pod` alone for its own memory (no node threshold met), as a
    /// soft memory eviction: its own grace period (at most
    /// --eviction-max-pod-grace-period), within the eviction budget, said
    /// to the API and the pod by `message`. In a dry run it is only logged
    /// and counted.
    pub(super) fn evict_for_own_memory(
        &mut self,
        wake: &Wake,
        pod: &PodSnapshot,
        reason: KillReason,
        message: String,
        usage_bytes: u64,
    ) {
        let now_ns = self.clock.now_ns();
        let act = !self.options.dry_run;
        if act && self.safeguards.room(now_ns, &self.metrics).is_err() {
            return;
        }
        let grace = self.engine.soft_grace_period(pod);
        let qos = pod.qos_class();
        info!(
            signal = reason.signal(),
            reason = reason.as_str(),
            resource = Resource::Memory.as_str(),
            victim = %pod.key(),
            usage_bytes = logs::bytes(usage_bytes).logged(),
            eviction_message = message,
            ?qos,
            grace_seconds = grace.as_secs(),
            trigger = wake.cause.as_str(),
            at_ns = now_ns,
            dry_run = self.options.dry_run,
            "eviction decided"
        );
        self.metrics
            .evictions
            .with_label_values(&[reason.signal(), qos.as_str(), reason.as_str()])
            .inc();
        if !act {
            return;
        }
        let Some(cgroup) = pod.cgroup.clone() else {
            warn!(victim = %pod.key(), "pod has no cgroup; cannot kill it");
            return;
        };
        let victim = Victim {
            pod: pod.key(),
            index: 0,
            usage: i64::try_from(usage_bytes).unwrap_or(i64::MAX),
            grace_period: grace,
            reason,
        };
        let decision = [victim.pod.clone()];
        self.start(
            wake,
            Cause::OwnMemory(reason, message),
            &victim,
            pod,
            cgroup,
            &decision,
        );
    }
}
