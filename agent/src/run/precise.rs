//! The I/O shell of the zone ([`crate::scopes::zone`]): attaches and
//! detaches the precise memory hooks where the evictor's plan puts them,
//! and on cgroup v1 keeps an eventfd threshold at the zone's edge of each
//! engine memory scope, which wakes the engine when the node comes near a
//! line while the hooks are off. (On cgroup v2 the plan's read period,
//! part of the evictor's action, is the far trigger.)
use std::{collections::BTreeMap, sync::Arc};

use futures::future::select_all;
use tracing::{info, warn};

use crate::{
    act::io::KernelRecords,
    kernel::notify::{MemcgThresholds, NotifyError},
    node::cgroupfs::CgroupFs,
    report::metrics::Metrics,
    scopes::zone::{ArmReason, ZonePlan},
};

pub struct PreciseHooks {
    cgroupfs: CgroupFs,
    metrics: Arc<Metrics>,
    /// cgroup v1 eventfd thresholds at the zone's edge, by scope path.
    eventfds: BTreeMap<String, MemcgThresholds>,
    /// False once the far trigger failed: the hooks then stay attached.
    managed: bool,
}

impl PreciseHooks {
    /// The hooks are attached when this is made (as [`crate::kernel::triggers::arm`]
    /// leaves them).
    pub fn new(cgroupfs: CgroupFs, metrics: Arc<Metrics>) -> Self {
        metrics.precise_hooks_armed.set(1);
        Self {
            cgroupfs,
            metrics,
            eventfds: BTreeMap::new(),
            managed: true,
        }
    }

    /// Moves the hooks and the far trigger where `plan` puts them. Returns
    /// true when the caller should look again at once: the hooks were just
    /// attached (the node may have crossed a line between the engine's read
    /// and the attachment, with nothing charged since to make the programs
    /// look), or the plan left them off far away while usage is already
    /// above a zone edge just armed: the reading was stale, the eventfd
    /// would never signal a crossing already made, and the hooks would stay
    /// off while the node climbs on. The next reading is within the zone
    /// (a Far plan means usage was at most the edge), so this asks once.
    pub fn apply<K: KernelRecords>(&mut self, kernel: Option<&mut K>, plan: &ZonePlan) -> bool {
        if !self.managed {
            return false;
        }
        let far = plan.reason == ArmReason::Far;
        let edge_passed = self.arm_eventfds(&plan.eventfd_levels, far);
        if !self.managed {
            return self.set(kernel, true, "the far trigger failed");
        }
        let attached = self.set(kernel, plan.armed, plan.reason.as_str()) && plan.armed;
        attached || edge_passed
    }

    /// Attaches or detaches the hooks; true when that changed them.
    fn set<K: KernelRecords>(&self, kernel: Option<&mut K>, armed: bool, reason: &str) -> bool {
        let Some(kernel) = kernel else { return false };
        let started = std::time::Instant::now();
        match kernel.set_memory_hooks(armed) {
            Ok(false) => false,
            Ok(true) => {
                let took_us = started.elapsed().as_micros() as u64;
                let state = if armed { "armed" } else { "disarmed" };
                self.metrics.precise_hooks_armed.set(i64::from(armed));
                self.metrics
                    .precise_hooks_transitions
                    .with_label_values(&[state, reason])
                    .inc();
                info!(state, reason, took_us, "precise memory hooks");
                true
            }
            Err(e) => {
                warn!(error = %e, armed, reason, "cannot move the precise memory hooks; the resync still reads");
                false
            }
        }
    }

    /// Arms an eventfd at each level; with `check`, true when usage is
    /// already above one (read only then: near a line the answer is moot).
    fn arm_eventfds(&mut self, levels: &[(String, u64)], check: bool) -> bool {
        self.eventfds
            .retain(|path, _| levels.iter().any(|(armed, _)| armed == path));
        let mut passed = false;
        for (path, level) in levels {
            let armed = match self.eventfds.get_mut(path) {
                Some(thresholds) => thresholds.arm(&[*level]).map(|()| &*thresholds),
                None => MemcgThresholds::open(&self.cgroupfs.memory_dir(path)).and_then(
                    |mut thresholds| {
                        thresholds.arm(&[*level])?;
                        Ok(&*self.eventfds.entry(path.clone()).or_insert(thresholds))
                    },
                ),
            };
            let above = armed.and_then(|thresholds| {
                if check {
                    thresholds.passed(*level)
                } else {
                    Ok(false)
                }
            });
            match above {
                Ok(above) => passed |= above,
                Err(e) => {
                    self.fail(&e);
                    return false;
                }
            }
        }
        passed
    }

    /// The far trigger cannot be trusted: the hooks stay attached for good.
    fn fail(&mut self, error: &NotifyError) {
        warn!(error = %error, "memory threshold at the zone's edge failed: the precise memory hooks stay attached");
        self.eventfds.clear();
        self.managed = false;
    }

    /// Waits until usage crosses a zone edge, either way; CLOCK_MONOTONIC
    /// ns at wake-up. Pending while no edge is armed.
    pub async fn wait(&mut self) -> Result<u64, NotifyError> {
        if self.eventfds.is_empty() {
            return std::future::pending().await;
        }
        let waits = self
            .eventfds
            .values_mut()
            .map(|thresholds| Box::pin(thresholds.wait()));
        select_all(waits).await.0
    }

    /// After [`PreciseHooks::wait`] failed: attaches the hooks for good.
    pub fn give_up<K: KernelRecords>(&mut self, kernel: Option<&mut K>, error: &NotifyError) {
        self.fail(error);
        self.set(kernel, true, "the far trigger failed");
    }
}
