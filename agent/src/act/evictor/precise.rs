//! Where the precise memory hooks belong after an engine run
//! ([`crate::scopes::zone`]): the evictor keeps the node's fastest
//! allocation rate and whether the hooks are armed, and knows when a
//! victim's memory is being returned; the serve loop applies the plan.
use crate::{
    act::{evictor::Evictor, io::Io},
    decide::thresholds::Resource,
    scopes::{
        tripwires::EngineScope,
        zone::{self, AllocationRate, ZoneOptions, ZonePlan},
    },
};

/// The zone's state across engine runs.
#[derive(Debug, Clone)]
pub(super) struct Zone {
    options: ZoneOptions,
    armed: bool,
    rate: AllocationRate,
}

impl Zone {
    /// The kernel attached the hooks at startup.
    pub(super) fn new(options: ZoneOptions) -> Self {
        Self {
            options,
            armed: true,
            rate: AllocationRate::default(),
        }
    }
}

impl<I: Io> Evictor<I> {
    /// The plan for this run's readings, `None` when the hooks are not
    /// managed (`--precise-hooks always`, or no kernel memory trigger).
    pub(super) fn plan_precise(&mut self, scopes: &[EngineScope]) -> Option<ZonePlan> {
        let now_ns = self.clock.now_ns();
        // A hard memory kill under way, or its memory coming back: the
        // engine waits for it (and polls it) whatever the hooks would say.
        let reclaiming = self.evictions.hard_running(Resource::Memory)
            || self.evictions.reclaiming(Resource::Memory);
        let state = self.zone.as_mut()?;
        state.rate.observe(now_ns, scopes);
        let plan = zone::plan(
            &state.options,
            state.armed,
            scopes,
            state.rate.fastest(),
            reclaiming,
        );
        state.armed = plan.armed;
        Some(plan)
    }
}
