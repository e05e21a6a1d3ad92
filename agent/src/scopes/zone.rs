//! When the precise memory hooks should run ("the zone"): a pure function
//! of the engine's memory tripwires, the fastest allocation rate the node
//! has shown, and whether a victim's memory is being returned. The PID
//! hooks (`task_fork`, `task_free`: every fork and exit on the node, 0.5 to
//! 1 µs a call) have a zone of their own, in tasks: [`ZoneOptions::pids`].
//!
//! The memory hooks fire on every charge on the node (`lru-insertion`,
//! once per folio), or several times per page on every charge and uncharge
//! (`memcg-stat`, `page-alloc`), so attached they tax every workload's page
//! faults (and frees) whether or not the node is anywhere near a threshold. They are attached only while some engine memory scope
//! is within the *zone* below its lowest line: `max(ZONE_MIN, fastest rate
//! × lead)`, the distance the node can cover while the agent notices the
//! far trigger and attaches them. Farther away a rare trigger stands in:
//! cgroup v1 eventfd thresholds at the zone's edge (kernel-pushed, checked
//! by the kernel every 128 page events per CPU), or on cgroup v2 an
//! adaptive read whose period is the distance to the zone's edge over the
//! fastest rate the node could allocate at. They are detached again only
//! past twice the zone (hysteresis), and while a hard memory eviction's
//! victim is being killed and its memory returned: then the engine polls
//! anyway, and the hooks would tax the very return it waits for.
use std::{collections::BTreeMap, time::Duration};

use crate::{kernel::bpf::ScopeKind, scopes::tripwires::EngineScope};

/// The zone is never narrower than this: the eventfd thresholds are checked
/// every 128 page events per CPU (512 KiB), the agent's reaction takes a
/// few milliseconds, and a workload that starts allocating fast from idle
/// has shown no rate yet. 64 MiB is 64 ms at 1 GiB/s.
pub(crate) const ZONE_MIN_BYTES: u64 = 64 << 20;

/// How long the node is assumed to keep allocating at its fastest between
/// entering the zone and the hooks being attached (the far trigger's wake-up,
/// one engine run, the attach), with a wide margin over what was measured
/// (docs/design.md).
pub(crate) const ARM_LEAD: Duration = Duration::from_millis(50);

/// The allocation rate the adaptive read (cgroup v2) assumes until the node
/// has shown a faster one: faster than two cores fault in fresh anonymous
/// memory on this machine (1.3 GiB/s each).
pub(crate) const FLOOR_RATE_BYTES_PER_SEC: u64 = 4 << 30;

/// The adaptive read's shortest period: a node at the zone's edge is armed,
/// so a shorter one would only read more often as it approaches.
pub(crate) const MIN_READ_PERIOD: Duration = Duration::from_millis(5);

/// The longest the v1 far trigger's eventfds are trusted alone: see
/// [`edge_check_after`].
pub(crate) const MAX_EDGE_CHECK: Duration = Duration::from_secs(1);

/// The shortest interval a rate is measured over: over a few milliseconds
/// the page counter's per-CPU batching (and a huge page charged at once)
/// would read as tens of GiB/s.
pub(crate) const RATE_WINDOW: Duration = Duration::from_millis(100);

/// The PID zone is never narrower than this many tasks: what a fork storm
/// at [`PID_FLOOR_RATE`] makes in [`ARM_LEAD`], so that the PID hooks are
/// on before a storm that started from idle, with no rate shown yet, can
/// reach a line.
pub(crate) const PID_ZONE_MIN_TASKS: u64 = 1024;

/// The fork rate the PID zone's read assumes until the node has shown a
/// faster one: about five times the fastest this machine's two cores fork
/// and reap (a C loop: 4,000 a second on one).
pub(crate) const PID_FLOOR_RATE: u64 = 20_000;

/// What stands in for the precise hooks far from every threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FarTrigger {
    /// cgroup v1 usage thresholds on an eventfd, at the zone's edge.
    MemcgEventfd,
    /// cgroup v2 has no usage thresholds: the engine reads the node again
    /// after distance ÷ rate, at most every `max_period`.
    AdaptiveRead { max_period: Duration },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZoneOptions {
    /// The scopes whose lines the zone is measured from: bytes for memory,
    /// tasks for PIDs.
    pub kind: ScopeKind,
    pub far: FarTrigger,
    /// The narrowest zone, in the kind's unit.
    pub min_width: u64,
    pub lead: Duration,
    pub floor_rate: u64,
    /// Whether the hooks go while a victim's memory comes back: a hook
    /// that runs on every free (`memcg-stat`, `page-alloc`) would tax the
    /// return the engine waits for. One that runs on charges only
    /// (`lru-insertion`) costs that return nothing, and moving it would
    /// patch every CPU's text while the pod freezes and its reapers wake,
    /// so it stays where it is until the run that finds the memory back.
    pub off_while_reclaiming: bool,
}

impl ZoneOptions {
    /// The precise memory hooks' zone.
    pub(crate) fn new(far: FarTrigger, off_while_reclaiming: bool) -> Self {
        Self {
            kind: ScopeKind::Memory,
            far,
            min_width: ZONE_MIN_BYTES,
            lead: ARM_LEAD,
            floor_rate: FLOOR_RATE_BYTES_PER_SEC,
            off_while_reclaiming,
        }
    }

    /// The PID hooks' zone, in tasks. No kernel notifies a task count
    /// nearing a level (`pids.events` counts only forks refused at
    /// `pids.max`), so far away the engine reads the count again after
    /// distance ÷ rate, at most every `max_period`, on either cgroup
    /// version; the hooks stay where they are while a PID victim is being
    /// killed (the exits it makes are what the engine waits for).
    pub(crate) fn pids(max_period: Duration) -> Self {
        Self {
            kind: ScopeKind::Pids,
            far: FarTrigger::AdaptiveRead { max_period },
            min_width: PID_ZONE_MIN_TASKS,
            lead: ARM_LEAD,
            floor_rate: PID_FLOOR_RATE,
            off_while_reclaiming: false,
        }
    }
}

/// Why the hooks are where the plan puts them: the `reason` of the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArmReason {
    /// An engine memory scope is within the zone (or within twice it, having
    /// been in it).
    Near,
    /// Every engine memory scope is farther than the zone.
    Far,
    /// A hard memory eviction is under way or its memory is coming back.
    Reclaim,
    /// No memory threshold needs the hooks.
    NoThreshold,
}

impl ArmReason {
    /// The reason, for the hooks of `kind`'s zone.
    pub(crate) fn describe(self, kind: ScopeKind) -> &'static str {
        match (kind, self) {
            (ScopeKind::Memory, Self::Near) => "near a memory threshold",
            (ScopeKind::Memory, Self::Far) => "far from every memory threshold",
            (ScopeKind::Memory, Self::Reclaim) => "a victim's memory is being returned",
            (ScopeKind::Memory, Self::NoThreshold) => "no memory threshold",
            (ScopeKind::Pids, Self::Near) => "near a PID threshold",
            (ScopeKind::Pids, Self::Far) => "far from every PID threshold",
            (ScopeKind::Pids, Self::Reclaim) => "a PID victim is being killed",
            (ScopeKind::Pids, Self::NoThreshold) => "no PID threshold",
        }
    }
}

/// Where the hooks and the far trigger belong after one engine run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZonePlan {
    pub armed: bool,
    pub reason: ArmReason,
    /// Bytes, or tasks.
    pub zone_width: u64,
    /// The smallest distance of an engine memory scope to its lowest line
    /// (0 past one); `None` when no scope has a line.
    pub distance: Option<u64>,
    /// cgroup v1: the zone's edge of each engine memory scope.
    pub edges: Vec<ZoneEdge>,
    /// cgroup v2: read the node again after this long.
    pub read_after: Option<Duration>,
    /// The fastest the node may approach a line, bytes per second: the
    /// fastest rate it has shown, at least the floor rate.
    pub approach_rate: u64,
}

/// The zone's edge of one scope, where a cgroup v1 eventfd waits far from
/// every line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZoneEdge {
    pub path: String,
    /// The edge as the scope's usage file shows it, which the eventfd
    /// compares.
    pub file_level: u64,
    /// The edge as the scope's band value ([`EngineScope::reading`]), what
    /// its lines compare: the backstop read compares this. On the root the
    /// two differ by the page cache the usage file counts, which moves
    /// while the eventfd waits (a file deleted takes its pages out of the
    /// usage, not out of the working set), so the file level alone can lie
    /// above a working set already in the zone.
    pub band_level: u64,
}

/// The fastest the node's engine scopes of one kind have grown between
/// two engine runs, per second (bytes, or tasks). Only ever grows: a node
/// that once allocated (or forked) that fast can again, and a wider zone
/// only costs hooks attached sooner.
#[derive(Debug, Clone, Default)]
pub(crate) struct GrowthRate {
    /// By scope path; the node's tasks, which have none, under "".
    last: BTreeMap<String, (u64, u64)>,
    fastest: u64,
}

impl GrowthRate {
    /// Takes the readings of `kind` of one engine run at `now_ns`.
    pub(crate) fn observe(&mut self, now_ns: u64, kind: ScopeKind, scopes: &[EngineScope]) {
        for scope in zone_scopes(kind, scopes) {
            let path = scope.path.as_deref().unwrap_or_default();
            let value = scope.reading.value;
            if let Some(&(at_ns, before)) = self.last.get(path) {
                let elapsed = now_ns.saturating_sub(at_ns);
                if u128::from(elapsed) < RATE_WINDOW.as_nanos() {
                    continue;
                }
                if value > before {
                    let rate = u128::from(value - before) * 1_000_000_000 / u128::from(elapsed);
                    self.fastest = self.fastest.max(u64::try_from(rate).unwrap_or(u64::MAX));
                }
            }
            self.last.insert(path.to_owned(), (now_ns, value));
        }
    }

    /// Bytes (or tasks) per second.
    pub(crate) fn fastest(&self) -> u64 {
        self.fastest
    }
}

fn zone_scopes(kind: ScopeKind, scopes: &[EngineScope]) -> impl Iterator<Item = &EngineScope> {
    scopes
        .iter()
        .filter(move |scope| scope.kind == kind && !scope.thresholds.is_empty())
}

/// The zone's width for a node that has grown `fastest` bytes (or tasks)
/// a second.
pub(crate) fn zone_width(options: &ZoneOptions, fastest: u64) -> u64 {
    let lead = u128::from(fastest) * options.lead.as_nanos() / 1_000_000_000;
    options
        .min_width
        .max(u64::try_from(lead).unwrap_or(u64::MAX))
}

/// Where the hooks belong. `armed` is where they are now (for the
/// hysteresis); `reclaiming` whether a hard memory eviction is under way
/// or its victim's memory coming back.
pub(crate) fn plan(
    options: &ZoneOptions,
    armed: bool,
    scopes: &[EngineScope],
    fastest: u64,
    reclaiming: bool,
) -> ZonePlan {
    let zone = zone_width(options, fastest);
    let lowest_line = |scope: &EngineScope| scope.thresholds.iter().copied().min();
    let distance = zone_scopes(options.kind, scopes)
        .filter_map(|scope| Some(lowest_line(scope)?.saturating_sub(scope.reading.value)))
        .min();
    let edges = match options.far {
        FarTrigger::MemcgEventfd => zone_scopes(options.kind, scopes)
            .filter_map(|scope| {
                let band_level = lowest_line(scope)?.saturating_sub(zone);
                Some(ZoneEdge {
                    path: scope.path.clone()?,
                    // The eventfd compares the usage file, which on the
                    // hierarchy's root is not the page counter.
                    file_level: scope.as_file_value(band_level),
                    band_level,
                })
            })
            .collect(),
        FarTrigger::AdaptiveRead { .. } => Vec::new(),
    };
    let (armed, reason) = match distance {
        _ if reclaiming && options.off_while_reclaiming => (false, ArmReason::Reclaim),
        _ if reclaiming => (armed, ArmReason::Reclaim),
        None => (false, ArmReason::NoThreshold),
        Some(distance) if distance < zone => (true, ArmReason::Near),
        Some(distance) if armed && distance < zone.saturating_mul(2) => (true, ArmReason::Near),
        Some(_) => (false, ArmReason::Far),
    };
    let approach_rate = fastest.max(options.floor_rate).max(1);
    let read_after = match (options.far, distance) {
        (FarTrigger::AdaptiveRead { max_period }, Some(distance)) if !armed && !reclaiming => {
            let period = time_to_cover(distance.saturating_sub(zone), approach_rate);
            Some(period.clamp(MIN_READ_PERIOD, max_period.max(MIN_READ_PERIOD)))
        }
        _ => None,
    };
    ZonePlan {
        armed,
        reason,
        zone_width: zone,
        distance,
        edges,
        read_after,
        approach_rate,
    }
}

/// The v1 far trigger's backstop: when to read `usage` again so that a
/// node approaching `level` at `rate` is read before it passes it even if
/// the kernel's eventfd notification never comes; `None` once past it.
/// Needed: 3 of about 300 event-mode bench runs with 100 or 250 pods
/// ended in a kernel OOM kill, the hooks off and no wake-up from the
/// zone's edge before the next resync (why is not known).
pub(crate) fn edge_check_after(usage: u64, level: u64, rate: u64) -> Option<Duration> {
    (usage <= level)
        .then(|| time_to_cover(level - usage, rate.max(1)).clamp(MIN_READ_PERIOD, MAX_EDGE_CHECK))
}

fn time_to_cover(bytes: u64, rate: u64) -> Duration {
    let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(rate);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::scopes::registry::Reading;

    const MIB: u64 = 1 << 20;

    fn scope(path: &str, value: u64, lines: &[u64]) -> EngineScope {
        EngineScope {
            kind: ScopeKind::Memory,
            path: Some(path.into()),
            thresholds: lines.to_vec(),
            reading: Reading {
                value,
                working_set: Some(value),
            },
            file_value: value,
        }
    }

    fn v1() -> ZoneOptions {
        ZoneOptions::new(FarTrigger::MemcgEventfd, true)
    }

    fn v2() -> ZoneOptions {
        ZoneOptions::new(
            FarTrigger::AdaptiveRead {
                max_period: Duration::from_secs(1),
            },
            true,
        )
    }

    #[test]
    fn far_from_every_line_the_hooks_go_and_the_eventfd_waits_at_the_zones_edge() {
        let scopes = [
            scope("/node", 100 * MIB, &[900 * MIB]),
            scope("/node/kubepods", 80 * MIB, &[850 * MIB, 800 * MIB]),
        ];
        let plan = plan(&v1(), true, &scopes, 0, false);
        assert!(!plan.armed);
        assert_eq!(plan.reason, ArmReason::Far);
        assert_eq!(plan.zone_width, ZONE_MIN_BYTES);
        assert_eq!(plan.distance, Some(720 * MIB));
        let edge = |path: &str, level| ZoneEdge {
            path: path.to_owned(),
            file_level: level,
            band_level: level,
        };
        assert_eq!(
            plan.edges,
            [edge("/node", 836 * MIB), edge("/node/kubepods", 736 * MIB)]
        );
        assert_eq!(plan.read_after, None);
    }

    #[test]
    fn on_the_root_the_eventfd_waits_on_the_usage_file_and_the_backstop_on_the_working_set() {
        // The root's usage file holds 300 MiB of page cache beyond the
        // working set its band compares.
        let root = EngineScope {
            file_value: 400 * MIB,
            ..scope("/", 100 * MIB, &[900 * MIB])
        };
        let plan = plan(&v1(), true, &[root], 0, false);
        assert_eq!(
            plan.edges,
            [ZoneEdge {
                path: "/".to_owned(),
                file_level: 1136 * MIB,
                band_level: 836 * MIB,
            }]
        );
    }

    #[test]
    fn inside_the_zone_the_hooks_come_and_leave_only_past_twice_it() {
        let at = |value| [scope("/node", value, &[900 * MIB])];
        let zone = ZONE_MIN_BYTES;
        // Entering: armed once closer than the zone.
        assert!(!plan(&v1(), false, &at(900 * MIB - zone), 0, false).armed);
        assert!(plan(&v1(), false, &at(900 * MIB - zone + 1), 0, false).armed);
        // Leaving: armed until twice the zone away.
        assert!(plan(&v1(), true, &at(900 * MIB - 2 * zone + 1), 0, false).armed);
        assert!(!plan(&v1(), true, &at(900 * MIB - 2 * zone), 0, false).armed);
        // Past the line: armed (the close watch reads; the hooks see the fall).
        let past = plan(&v1(), false, &at(950 * MIB), 0, false);
        assert_eq!((past.armed, past.distance), (true, Some(0)));
    }

    #[test]
    fn while_a_victims_memory_comes_back_the_hooks_are_off_even_past_the_line() {
        let scopes = [scope("/node", 950 * MIB, &[900 * MIB])];
        let plan = plan(&v2(), true, &scopes, 0, true);
        assert_eq!((plan.armed, plan.reason), (false, ArmReason::Reclaim));
        assert_eq!(plan.read_after, None, "the reclaim's own poll reads");
    }

    #[test]
    fn hooks_that_run_on_charges_only_stay_where_they_are_while_the_memory_comes_back() {
        let charges_only = ZoneOptions {
            off_while_reclaiming: false,
            ..v1()
        };
        let past = [scope("/node", 950 * MIB, &[900 * MIB])];
        let plan_past = plan(&charges_only, true, &past, 0, true);
        assert_eq!(
            (plan_past.armed, plan_past.reason),
            (true, ArmReason::Reclaim)
        );
        // Already far and off when the memory came back: not attached for it.
        let far = [scope("/node", 100 * MIB, &[900 * MIB])];
        let plan_far = plan(&charges_only, false, &far, 0, true);
        assert_eq!(
            (plan_far.armed, plan_far.reason),
            (false, ArmReason::Reclaim)
        );
        // Once it is back, the engine's next run places them as ever.
        let plan_after = plan(&charges_only, true, &far, 0, false);
        assert_eq!(
            (plan_after.armed, plan_after.reason),
            (false, ArmReason::Far)
        );
    }

    #[test]
    fn the_zone_widens_with_the_fastest_rate_the_node_has_shown() {
        assert_eq!(zone_width(&v1(), 512 * MIB), ZONE_MIN_BYTES);
        // 4 GiB/s × 50 ms.
        assert_eq!(zone_width(&v1(), 4096 * MIB), 4096 * MIB / 20);
        let mut rate = GrowthRate::default();
        rate.observe(
            0,
            ScopeKind::Memory,
            &[scope("/node", 100 * MIB, &[900 * MIB])],
        );
        rate.observe(
            100_000_000,
            ScopeKind::Memory,
            &[scope("/node", 300 * MIB, &[900 * MIB])],
        );
        // A fall says nothing about how fast it can grow.
        rate.observe(
            200_000_000,
            ScopeKind::Memory,
            &[scope("/node", 100 * MIB, &[900 * MIB])],
        );
        assert_eq!(rate.fastest(), 2000 * MIB);
        // Nor does a step within the window (batching, a huge page): it
        // counts over the window from the last anchor.
        rate.observe(
            210_000_000,
            ScopeKind::Memory,
            &[scope("/node", 150 * MIB, &[900 * MIB])],
        );
        assert_eq!(rate.fastest(), 2000 * MIB);
        // 300 MiB in the 200 ms since the anchor: slower than seen before.
        rate.observe(
            400_000_000,
            ScopeKind::Memory,
            &[scope("/node", 400 * MIB, &[900 * MIB])],
        );
        assert_eq!(rate.fastest(), 2000 * MIB);
        rate.observe(
            500_000_000,
            ScopeKind::Memory,
            &[scope("/node", 700 * MIB, &[900 * MIB])],
        );
        assert_eq!(rate.fastest(), 3000 * MIB);
        let plan = plan(
            &v1(),
            false,
            &[scope("/node", 700 * MIB, &[900 * MIB])],
            rate.fastest(),
            false,
        );
        assert_eq!(plan.zone_width, 150 * MIB);
        assert!(!plan.armed);
    }

    #[test]
    fn on_v2_the_read_period_is_the_distance_to_the_zone_over_the_fastest_rate() {
        let scopes = [scope("/node", 100 * MIB, &[900 * MIB])];
        // (800 − 64 MiB) at the 4 GiB/s floor: about 180 ms.
        let plan = plan(&v2(), false, &scopes, 0, false);
        let expected = (736 * MIB) as f64 / (4096 * MIB) as f64;
        let period = plan.read_after.unwrap().as_secs_f64();
        assert!((period - expected).abs() < 1e-6, "{period}");
        let near = [scope("/node", 899 * MIB, &[900 * MIB])];
        assert_eq!(super::plan(&v2(), false, &near, 0, false).read_after, None);
        let idle = [scope("/node", 0, &[u64::MAX])];
        assert_eq!(
            super::plan(&v2(), false, &idle, 0, false).read_after,
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn on_v1_the_usage_is_read_again_before_the_node_could_reach_the_edge() {
        let rate = plan(
            &v1(),
            false,
            &[scope("/node", 100 * MIB, &[900 * MIB])],
            0,
            false,
        )
        .approach_rate;
        assert_eq!(rate, FLOOR_RATE_BYTES_PER_SEC, "no faster rate shown yet");
        // 410 MiB at 4 GiB/s: about 100 ms.
        let after = edge_check_after(100 * MIB, 510 * MIB, rate).unwrap();
        assert!((after.as_secs_f64() - 0.1).abs() < 1e-3, "{after:?}");
        assert_eq!(
            edge_check_after(0, 64 << 30, rate),
            Some(MAX_EDGE_CHECK),
            "the resync reads anyway"
        );
        assert_eq!(
            edge_check_after(510 * MIB - 1, 510 * MIB, rate),
            Some(MIN_READ_PERIOD)
        );
        assert_eq!(
            edge_check_after(510 * MIB, 510 * MIB, rate),
            Some(MIN_READ_PERIOD)
        );
        assert_eq!(
            edge_check_after(510 * MIB + 1, 510 * MIB, rate),
            None,
            "passed"
        );
    }

    fn node_tasks(tasks: u64, line: u64) -> EngineScope {
        EngineScope {
            kind: ScopeKind::Pids,
            path: None,
            thresholds: vec![line],
            reading: Reading {
                value: tasks,
                working_set: None,
            },
            file_value: tasks,
        }
    }

    #[test]
    fn the_pid_zone_is_counted_in_tasks_and_read_again_at_the_fastest_fork_rate() {
        let options = ZoneOptions::pids(Duration::from_secs(1));
        let line = 22_024;
        // 21,024 tasks from the line: far, and read again after the
        // (21,024 − 1,024) tasks a storm at 20,000 forks/s makes in 1 s.
        let far = plan(&options, true, &[node_tasks(1000, line)], 0, false);
        assert_eq!((far.armed, far.reason), (false, ArmReason::Far));
        assert_eq!(far.zone_width, PID_ZONE_MIN_TASKS);
        assert_eq!(far.read_after, Some(Duration::from_secs(1)));
        let halfway = plan(&options, false, &[node_tasks(11_000, line)], 0, false);
        assert_eq!(halfway.read_after, Some(Duration::from_millis(500)));
        let near = plan(&options, false, &[node_tasks(21_001, line)], 0, false);
        assert_eq!((near.armed, near.read_after), (true, None));
        // The memory scopes' lines are not the PID zone's.
        let memory = plan(&options, true, &[scope("/node", 0, &[MIB])], 0, false);
        assert_eq!(memory.reason, ArmReason::NoThreshold);
        // A storm shown at 100,000 forks/s widens it to what it makes in
        // the lead.
        let mut rate = GrowthRate::default();
        rate.observe(0, ScopeKind::Pids, &[node_tasks(1000, line)]);
        rate.observe(100_000_000, ScopeKind::Pids, &[node_tasks(11_000, line)]);
        assert_eq!(rate.fastest(), 100_000);
        let storm = plan(
            &options,
            false,
            &[node_tasks(11_000, line)],
            rate.fastest(),
            false,
        );
        assert_eq!(storm.zone_width, 5_000);
        // While a PID victim is killed they stay where they are.
        let killing = plan(&options, true, &[node_tasks(1000, line)], 0, true);
        assert_eq!((killing.armed, killing.reason), (true, ArmReason::Reclaim));
    }

    #[test]
    fn without_a_memory_line_nothing_needs_the_hooks() {
        let scopes = [scope("/node", 100 * MIB, &[])];
        let plan = plan(&v1(), true, &scopes, 0, false);
        assert_eq!((plan.armed, plan.reason), (false, ArmReason::NoThreshold));
        assert!(plan.edges.is_empty());
    }

    proptest! {
        /// Whatever the rate and the readings, a node that allocates no
        /// faster than it has shown cannot get from outside the zone to a
        /// line within the lead: the hooks are attached before it arrives,
        /// and the v2 read comes before it enters the zone.
        #[test]
        fn no_line_is_reached_within_the_lead_while_disarmed(
            value in 0..4096 * MIB,
            line in 0..4096 * MIB,
            fastest in 0..8192 * MIB,
            armed: bool,
        ) {
            let scopes = [scope("/node", value, &[line])];
            let options = v2();
            let plan = plan(&options, armed, &scopes, fastest, false);
            if !plan.armed {
                let reach = u128::from(fastest) * options.lead.as_nanos() / 1_000_000_000;
                prop_assert!(u128::from(line - value.min(line)) > reach);
                let rate = fastest.max(options.floor_rate);
                let period = plan.read_after.unwrap();
                let covered = u128::from(rate) * period.as_nanos() / 1_000_000_000;
                let to_edge = u128::from((line - value).saturating_sub(plan.zone_width));
                prop_assert!(covered <= to_edge.max(u128::from(rate) * MIN_READ_PERIOD.as_nanos() / 1_000_000_000));
            }
        }
    }
}
