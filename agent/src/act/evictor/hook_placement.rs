//! Where the precise memory hooks and the PID hooks belong after an engine
//! run ([`crate::scopes::zone`]): the evictor keeps the node's fastest
//! allocation (and fork) rate and whether the hooks are armed, and knows
//! when a victim's memory is being returned or its tasks killed; the serve
//! loop applies the plans.
use crate::{
    act::{evictor::Evictor, io::Io},
    decide::thresholds::Resource,
    scopes::{
        tripwires::EngineScope,
        zone::{self, GrowthRate, ZoneOptions, ZonePlan},
    },
};

/// The zone's state across engine runs.
#[derive(Debug, Clone)]
pub(super) struct Zone {
    options: ZoneOptions,
    armed: bool,
    rate: GrowthRate,
}

impl Zone {
    /// The hooks start attached (the kernel attached the memory hooks at
    /// startup; the PID hooks go where the first plan puts them).
    pub(super) fn new(options: ZoneOptions) -> Self {
        Self {
            options,
            armed: true,
            rate: GrowthRate::default(),
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
        Some(self.zone.as_mut()?.plan(now_ns, scopes, reclaiming))
    }

    /// The PID hooks' plan for this run's readings, `None` when they are
    /// not managed by distance (`--precise-hooks always`, or no kernel PID
    /// trigger): then a PID line keeps them attached.
    pub(super) fn plan_pid_hooks(&mut self, scopes: &[EngineScope]) -> Option<ZonePlan> {
        let now_ns = self.clock.now_ns();
        let killing = self.evictions.hard_running(Resource::Pids)
            || self.evictions.reclaiming(Resource::Pids);
        Some(self.pid_zone.as_mut()?.plan(now_ns, scopes, killing))
    }
}

impl Zone {
    fn plan(&mut self, now_ns: u64, scopes: &[EngineScope], reclaiming: bool) -> ZonePlan {
        self.rate.observe(now_ns, self.options.kind, scopes);
        let plan = zone::plan(
            &self.options,
            self.armed,
            scopes,
            self.rate.fastest(),
            reclaiming,
        );
        self.armed = plan.armed;
        plan
    }
}
