//! kubelet's local-storage limit evictions in the loop
//! (`localStorageEviction`): every [`LOCAL_STORAGE_INTERVAL`] the running
//! pods that set a limit are held to it on the runtime's reading of their
//! disk, before any threshold is decided, and a pod over one is killed
//! with kubelet's message and its one-second grace period, whether or not
//! the node is short of anything. As in kubelet, a round that evicts for
//! local storage decides no threshold.
use std::{collections::BTreeSet, time::Duration};

use tracing::{info, warn};

use super::{Evictor, eviction::Cause};
use crate::{
    act::{
        io::{Io, NodeSource as _},
        wake::Wake,
    },
    decide::snapshot::PodSnapshot,
    decide::{engine::Victim, reason::KillReason},
    logs,
    node::{
        inventory::InventoryError,
        runtime::local_storage::{LocalStorageEviction, LocalStorageViolation},
    },
};

/// kubelet's housekeeping interval: how often pods are held to their
/// local-storage limits, each time on a disk reading at most this old.
const LOCAL_STORAGE_INTERVAL: Duration = Duration::from_secs(10);

/// kubelet's `immediateEvictionGracePeriodSeconds`, what a local-storage
/// eviction gives the pod: its containers get SIGTERM, and a second.
pub(super) const IMMEDIATE_EVICTION_GRACE_PERIOD: Duration = Duration::from_secs(1);

/// What a local-storage check leaves for the round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct LocalStorageRound {
    /// When to look again: soon while the runtime reads the pods' disk, or
    /// when the eviction budget has room again.
    pub look_again: Option<Duration>,
    /// A pod was evicted for its local storage: the round decides no
    /// threshold (kubelet's synchronize returns there).
    pub evicted: bool,
}

#[derive(Default)]
pub(super) struct LocalStorageChecks {
    /// When the next check is due (CLOCK_MONOTONIC ns); the first run
    /// checks.
    due_ns: u64,
    /// Pods over a limit that were not killed (a dry run, or a pod that is
    /// never evicted): said once while they stay over it.
    told: BTreeSet<String>,
}

impl<I: Io> Evictor<I> {
    /// Kills the running pods over a local-storage limit, when a check is
    /// due.
    pub(super) fn check_local_storage(
        &mut self,
        wake: &Wake,
        dedicated_imagefs: bool,
    ) -> LocalStorageRound {
        let mut round = LocalStorageRound::default();
        let now_ns = self.clock.now_ns();
        if now_ns < self.local_storage.due_ns {
            return round;
        }
        let result = self.node.local_storage_violations(dedicated_imagefs);
        if let Err(InventoryError::DiskUsagePending { wait }) = result {
            round.look_again = Some(wait);
            return round;
        }
        self.local_storage.due_ns = now_ns + nanos(LOCAL_STORAGE_INTERVAL);
        let found = match result {
            Ok(found) => found,
            // No pod is judged on no reading; the runtime's thread says
            // that it is down.
            Err(InventoryError::DiskUsageUnknown) => return round,
            Err(e) => {
                warn!(error = %e, "cannot hold the pods to their local-storage limits");
                return round;
            }
        };
        self.local_storage
            .told
            .retain(|uid| found.iter().any(|over| over.pod.uid == *uid));
        for LocalStorageEviction { pod, violation } in found {
            if self.evictions.evicting(&pod.uid) || self.safeguards.backing_off(&pod, now_ns) {
                continue;
            }
            let acted = pod.is_evictable() && !self.options.dry_run;
            if !acted && !self.local_storage.told.insert(pod.uid.clone()) {
                continue;
            }
            if !pod.is_evictable() {
                warn!(pod = %pod.key(), eviction_message = violation.message(),
                    "over its local-storage limit, but a critical pod or evictd's own: not evicted");
                continue;
            }
            if acted && let Err(wait) = self.safeguards.room(now_ns, &self.metrics) {
                self.local_storage.due_ns = now_ns + nanos(wait);
                round.look_again = Some(wait);
                return round;
            }
            self.announce_pod_limit(wake, &pod, &violation);
            round.evicted = true;
            if !acted {
                continue;
            }
            let Some(cgroup) = pod.cgroup.clone() else {
                warn!(victim = %pod.key(), "pod has no cgroup; cannot kill it");
                continue;
            };
            let (_, used_bytes) = violation.limit_and_use();
            let victim = Victim {
                pod: pod.key(),
                index: 0,
                usage: i64::try_from(used_bytes).unwrap_or(i64::MAX),
                grace_period: IMMEDIATE_EVICTION_GRACE_PERIOD,
                reason: KillReason::PodLimit(violation.limit()),
            };
            let decision = [victim.pod.clone()];
            self.start(
                wake,
                Cause::PodLimit(violation),
                &victim,
                &pod,
                cgroup,
                &decision,
            );
        }
        round
    }

    /// The eviction's one log line, and its count under kubelet's signal.
    fn announce_pod_limit(
        &self,
        wake: &Wake,
        pod: &PodSnapshot,
        violation: &LocalStorageViolation,
    ) {
        let (limit, used_bytes) = violation.limit_and_use();
        let qos = pod.qos_class();
        let reason = KillReason::PodLimit(violation.limit());
        info!(
            signal = violation.signal(),
            reason = reason.as_str(),
            resource = "ephemeral-storage",
            victim = %pod.key(),
            limit = %limit,
            used_bytes = logs::bytes(used_bytes).logged(),
            eviction_message = violation.message(),
            ?qos,
            grace_seconds = IMMEDIATE_EVICTION_GRACE_PERIOD.as_secs(),
            trigger = wake.cause.as_str(),
            at_ns = self.clock.now_ns(),
            dry_run = self.options.dry_run,
            "eviction decided"
        );
        self.metrics
            .evictions
            .with_label_values(&[violation.signal(), qos.as_str(), reason.as_str()])
            .inc();
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
