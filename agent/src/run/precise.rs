//! The I/O shell of the zone ([`crate::scopes::zone`]): attaches and
//! detaches the precise memory hooks where the evictor's plan puts them,
//! and on cgroup v1 keeps an eventfd threshold at the zone's edge of each
//! engine memory scope, which wakes the engine when the node comes near a
//! line while the hooks are off. (On cgroup v2 the plan's read period,
//! part of the evictor's action, is the far trigger.)
use std::{
    collections::{BTreeMap, btree_map::Entry},
    sync::{Arc, mpsc as std_mpsc},
    time::{Duration, Instant},
};

use futures::future::select_all;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::{
    act::{io::KernelRecords, timer::Pacer},
    kernel::{
        bpf::{Purpose, ScopeKind, monotonic_now_ns},
        notify::{MemcgThresholds, NotifyError, Registered, Registration},
    },
    logs,
    metrics::Metrics,
    node::{
        cgroupfs::{self, CgroupFs, KeptOpen},
        stats::machine_working_set,
    },
    scopes::zone::{self, ArmReason, ZoneEdge, ZonePlan},
};

pub(crate) struct PreciseHooks {
    cgroupfs: CgroupFs,
    metrics: Arc<Metrics>,
    /// cgroup v1 eventfd thresholds at the zone's edge, by scope path.
    eventfds: BTreeMap<String, EdgeWatch>,
    /// The edge each scope's registration under way will arm, by path.
    registering: BTreeMap<String, u64>,
    /// Writes the registrations; started with the first.
    registrar: Option<Registrar>,
    /// False once the far trigger failed: the hooks then stay attached.
    managed: bool,
    /// The last plan left the hooks off far from every line: the eventfds'
    /// backstop reads run ([`crate::scopes::zone::edge_check_after`]).
    far: bool,
    /// The last plan's approach rate, bytes per second.
    approach_rate: u64,
    /// How often the engine resyncs: each resync reads the usage against
    /// the edges too ([`PreciseHooks::apply`]), so a backstop read due
    /// later than that is left to it.
    resync_interval: Duration,
    /// Paces the backstop's reads: on a timerfd, one wake-up per read.
    clock: Pacer,
    /// /proc/vmstat, which the backstop reads on the root.
    files: KeptOpen,
}

/// A scope's eventfd at its zone's edge, and where the backstop read finds
/// that edge ([`ZoneEdge::band_level`]).
struct EdgeWatch {
    thresholds: MemcgThresholds,
    band_level: u64,
}

impl PreciseHooks {
    /// The hooks are attached when this is made (as [`crate::kernel::triggers::arm`]
    /// leaves them).
    pub(crate) fn new(
        cgroupfs: CgroupFs,
        metrics: Arc<Metrics>,
        resync_interval: Duration,
        clock: Pacer,
    ) -> Self {
        metrics.precise_hooks_armed.set(1);
        Self {
            cgroupfs,
            metrics,
            eventfds: BTreeMap::new(),
            registering: BTreeMap::new(),
            registrar: None,
            managed: true,
            far: false,
            approach_rate: 1,
            resync_interval,
            clock,
            files: KeptOpen::default(),
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
    ///
    /// The edges are registered only when the plan makes them the trigger
    /// (far, hooks off), and the hooks go only once they are: until then
    /// they stay as they are, and [`PreciseHooks::wait`] wakes the engine
    /// when the registration is done, to apply the plan again. A
    /// registration waits out an RCU grace period in the kernel, on the
    /// registrar's thread, never this one: 4–32 ms on a quiet machine,
    /// seconds on a busy virtual one, when no decision could be made
    /// (design note, the zone). Nor is an edge registered
    /// nearer: the zone's edge moves down each time the node shows a
    /// faster rate, which it does while climbing into the zone. Elsewhere
    /// the edges are only dropped for scopes gone; one left at a level
    /// since moved wakes the engine at worst once too often.
    pub(crate) fn apply<K: KernelRecords>(
        &mut self,
        kernel: Option<&mut K>,
        plan: &ZonePlan,
    ) -> bool {
        if !self.managed {
            return false;
        }
        let far = plan.reason == ArmReason::Far;
        self.far = far;
        self.approach_rate = plan.approach_rate;
        if !far {
            self.drop_eventfds_not_in(&plan.edges);
            return self.set(kernel, plan.armed, plan.reason.describe(ScopeKind::Memory))
                && plan.armed;
        }
        let edges = self.arm_eventfds(&plan.edges);
        if !self.managed {
            return self.set(kernel, true, "the far trigger failed");
        }
        match edges {
            Edges::Registering => false,
            Edges::Armed { passed } => {
                self.set(kernel, plan.armed, plan.reason.describe(ScopeKind::Memory));
                passed
            }
        }
    }

    /// Attaches or detaches the hooks; true when that changed them.
    fn set<K: KernelRecords>(&self, kernel: Option<&mut K>, armed: bool, reason: &str) -> bool {
        let Some(kernel) = kernel else { return false };
        let started = std::time::Instant::now();
        match kernel.set_hooks(Purpose::Memory, armed) {
            Ok(false) => false,
            Ok(true) => {
                let took_us = started.elapsed().as_micros() as u64;
                let state = if armed { "armed" } else { "disarmed" };
                self.metrics.precise_hooks_armed.set(i64::from(armed));
                self.metrics
                    .precise_hooks_transitions
                    .with_label_values(&[state, reason])
                    .inc();
                // at_ns: when the move was done, on the clock of the
                // kernel's records (the bench measures the zone's lead).
                info!(
                    state,
                    reason,
                    took_us,
                    at_ns = monotonic_now_ns(),
                    "precise memory hooks"
                );
                true
            }
            Err(e) => {
                warn!(error = %e, armed, reason, "cannot move the precise memory hooks; the resync still reads");
                false
            }
        }
    }

    fn drop_eventfds_not_in(&mut self, edges: &[ZoneEdge]) {
        let wanted = |path: &String| edges.iter().any(|edge| &edge.path == path);
        self.eventfds.retain(|path, _| wanted(path));
        self.registering.retain(|path, _| wanted(path));
    }

    /// Arms an eventfd at each edge, handing the registrar those not
    /// armed yet.
    fn arm_eventfds(&mut self, wanted: &[ZoneEdge]) -> Edges {
        self.drop_eventfds_not_in(wanted);
        let mut edges = Edges::Armed { passed: false };
        for edge in wanted {
            match self.arm_eventfd(edge) {
                Ok(Edges::Armed { passed }) => {
                    if let Edges::Armed { passed: any } = &mut edges {
                        *any |= passed;
                    }
                }
                Ok(Edges::Registering) => edges = Edges::Registering,
                Err(e) => {
                    self.fail(&e);
                    return Edges::Armed { passed: false };
                }
            }
        }
        edges
    }

    fn arm_eventfd(&mut self, edge: &ZoneEdge) -> Result<Edges, NotifyError> {
        let (path, level) = (edge.path.as_str(), edge.file_level);
        match self.eventfds.entry(path.to_owned()) {
            Entry::Occupied(mut watch) => watch.get_mut().band_level = edge.band_level,
            Entry::Vacant(vacant) => {
                vacant.insert(EdgeWatch {
                    thresholds: MemcgThresholds::open(&self.cgroupfs.memory_dir(path))?,
                    band_level: edge.band_level,
                });
            }
        }
        let watch = &self.eventfds[path];
        if watch.thresholds.armed_at(&[level]) {
            let passed =
                watch.thresholds.passed(level)? || self.band_value(path, watch)? >= edge.band_level;
            return Ok(Edges::Armed { passed });
        }
        if self.registering.get(path) != Some(&level) {
            let registration = watch.thresholds.registration(&[level])?;
            let registrar = match &self.registrar {
                Some(registrar) => registrar,
                None => self.registrar.insert(Registrar::start()?),
            };
            registrar.send(path, level, registration)?;
            self.registering.insert(path.to_owned(), level);
        }
        Ok(Edges::Registering)
    }

    /// Arms a registration the registrar wrote; true when it is the one
    /// the last plan asked for (the engine should apply it now).
    fn install(&mut self, done: Written) -> Result<bool, NotifyError> {
        if self.registering.get(&done.path) != Some(&done.level) {
            // Superseded, or its scope gone: dropping it unregisters it.
            return Ok(false);
        }
        self.registering.remove(&done.path);
        debug!(scope = %done.path, level = done.level, took_us = done.took_us, "zone's edge registered");
        let registered = done.result?;
        match self.eventfds.get_mut(&done.path) {
            Some(watch) => watch.thresholds.install(registered).map(|()| true),
            None => Ok(false),
        }
    }

    /// The far trigger cannot be trusted: the hooks stay attached for good.
    fn fail(&mut self, error: &NotifyError) {
        warn!(error = %error, "memory threshold at the zone's edge failed: the precise memory hooks stay attached");
        self.eventfds.clear();
        self.registering.clear();
        self.registrar = None;
        self.managed = false;
    }

    /// Waits until usage crosses a zone edge, either way; CLOCK_MONOTONIC
    /// ns at wake-up. Pending while no edge is armed. Far from every line
    /// the usage is also read before the node could reach an edge, in case
    /// the kernel's notification does not come.
    ///
    /// Also wakes once a registration the last plan asked for is written,
    /// so that the engine applies its plan again.
    pub(crate) async fn wait(&mut self) -> Result<u64, NotifyError> {
        loop {
            let armed = self
                .eventfds
                .values()
                .any(|watch| !watch.thresholds.levels().is_empty());
            let check_after = if self.far && armed {
                match self.edge_check_after()? {
                    Some(after) if after < self.resync_interval => Some(after),
                    Some(_) => None,
                    None => return Ok(monotonic_now_ns()),
                }
            } else {
                None
            };
            let written = async {
                match self.registrar.as_mut() {
                    Some(registrar) if !self.registering.is_empty() => {
                        registrar.written.recv().await
                    }
                    _ => std::future::pending().await,
                }
            };
            let signalled = async {
                if !armed {
                    return std::future::pending().await;
                }
                let waits = self
                    .eventfds
                    .values_mut()
                    .map(|watch| Box::pin(watch.thresholds.wait()));
                select_all(waits).await.0
            };
            let backstop = async {
                match check_after {
                    Some(after) => self.clock.sleep(after).await,
                    None => std::future::pending().await,
                }
            };
            let woke = tokio::select! {
                done = written => Woke::Written(done),
                woke = signalled => return woke,
                () = backstop => Woke::Backstop,
            };
            match woke {
                Woke::Written(Some(done)) => {
                    if self.install(done)? {
                        return Ok(monotonic_now_ns());
                    }
                }
                Woke::Written(None) => {
                    return Err(NotifyError::Registrar(
                        "the registrar's thread ended".to_owned(),
                    ));
                }
                Woke::Backstop => {}
            }
        }
    }

    /// When to read the scopes again; `None` when a zone edge is passed
    /// already and the eventfd has not said so: not yet (the kernel checks
    /// it every 128 page events per CPU), or never, on the root, where the
    /// page cache the usage file counts fell since the edge was set.
    fn edge_check_after(&self) -> Result<Option<Duration>, NotifyError> {
        let mut soonest = zone::MAX_EDGE_CHECK;
        for (path, watch) in &self.eventfds {
            if watch.thresholds.levels().is_empty() {
                continue;
            }
            let value = self.band_value(path, watch)?;
            let level = watch.band_level;
            match zone::edge_check_after(value, level, self.approach_rate) {
                Some(after) => soonest = soonest.min(after),
                None => {
                    info!(scope = %path, value = logs::bytes(value).logged(), level, "zone's edge passed, seen by the backstop read before the kernel's notification");
                    return Ok(None);
                }
            }
        }
        Ok(Some(soonest))
    }

    /// What the scope's lines compare now: the usage file of a cgroup, the
    /// machine's working set on the root (as the programs add it up).
    fn band_value(&self, path: &str, watch: &EdgeWatch) -> Result<u64, NotifyError> {
        if cgroupfs::is_root(path) {
            machine_working_set(&self.files).map_err(NotifyError::WorkingSet)
        } else {
            watch.thresholds.usage()
        }
    }

    /// After [`PreciseHooks::wait`] failed: attaches the hooks for good.
    pub(crate) fn give_up<K: KernelRecords>(
        &mut self,
        kernel: Option<&mut K>,
        error: &NotifyError,
    ) {
        self.fail(error);
        self.set(kernel, true, "the far trigger failed");
    }
}

/// What [`PreciseHooks::arm_eventfds`] left.
enum Edges {
    /// Every edge is armed; `passed`: usage is already at one.
    Armed { passed: bool },
    /// At least one is with the registrar.
    Registering,
}

enum Woke {
    Written(Option<Written>),
    Backstop,
}

/// A registration the registrar wrote, or failed to.
struct Written {
    path: String,
    level: u64,
    took_us: u64,
    result: Result<Registered, NotifyError>,
}

/// A thread that writes registrations one after another, so that the
/// kernel's wait for each falls on it rather than on the deciding thread.
/// It ends when the hooks drop it.
struct Registrar {
    requests: std_mpsc::Sender<(String, u64, Registration)>,
    written: mpsc::UnboundedReceiver<Written>,
}

impl Registrar {
    fn start() -> Result<Self, NotifyError> {
        let (requests, asked) = std_mpsc::channel::<(String, u64, Registration)>();
        let (done, written) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("evictd-zone-edge".into())
            .spawn(move || {
                for (path, level, registration) in asked {
                    let started = Instant::now();
                    let result = registration.write();
                    let took_us = started.elapsed().as_micros() as u64;
                    let written = Written {
                        path,
                        level,
                        took_us,
                        result,
                    };
                    if done.send(written).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| NotifyError::Registrar(e.to_string()))?;
        Ok(Self { requests, written })
    }

    fn send(&self, path: &str, level: u64, registration: Registration) -> Result<(), NotifyError> {
        self.requests
            .send((path.to_owned(), level, registration))
            .map_err(|_| NotifyError::Registrar("the registrar's thread ended".to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use tokio::sync::mpsc;

    use super::*;
    use crate::{node::cgroupfs::CgroupVersion, testing::fakes::FakeKernel};

    const MIB: u64 = 1 << 20;

    /// A v1 memory directory of plain files: arming an eventfd there writes
    /// its line into a file, so no kernel ever signals it, as when a
    /// notification is lost.
    fn deaf_cgroup(root: &Path) -> CgroupFs {
        let node = root.join("node");
        fs::create_dir_all(&node).unwrap();
        fs::write(
            node.join("memory.usage_in_bytes"),
            format!("{}\n", 100 * MIB),
        )
        .unwrap();
        CgroupFs::memory_only(CgroupVersion::V1, root)
    }

    /// Hooks on [`deaf_cgroup`], attached as at startup, and the kernel
    /// they move; the engine resyncs every `resync_interval`.
    fn deaf_hooks(root: &Path, resync_interval: Duration) -> (PreciseHooks, FakeKernel) {
        let hooks = PreciseHooks::new(
            deaf_cgroup(root),
            Metrics::new().unwrap(),
            resync_interval,
            Pacer::tokio(),
        );
        let (_records, receiver) = mpsc::unbounded_channel();
        (hooks, FakeKernel::new(receiver))
    }

    fn far_plan(edge: u64) -> ZonePlan {
        ZonePlan {
            armed: false,
            reason: ArmReason::Far,
            zone_width: 64 * MIB,
            distance: Some(edge + 64 * MIB - 100 * MIB),
            edges: vec![ZoneEdge {
                path: "/node".to_owned(),
                file_level: edge,
                band_level: edge,
            }],
            read_after: None,
            approach_rate: 4096 * MIB,
        }
    }

    /// Applies a far `plan`, which leaves the hooks as they are until the
    /// registrar has written its edge; then, woken by that, applies it
    /// again as the engine does. Returns the second answer.
    async fn apply_far(hooks: &mut PreciseHooks, kernel: &mut FakeKernel, plan: &ZonePlan) -> bool {
        let attached = *kernel.memory_hooks.borrow();
        assert!(!hooks.apply(Some(&mut *kernel), plan));
        assert_eq!(
            *kernel.memory_hooks.borrow(),
            attached,
            "moved before the edge was armed"
        );
        hooks.wait().await.unwrap();
        hooks.apply(Some(kernel), plan)
    }

    #[tokio::test(start_paused = true)]
    async fn far_away_a_climb_past_the_edge_wakes_the_engine_without_the_kernels_notification() {
        let dir = tempfile::tempdir().unwrap();
        let (mut hooks, mut kernel) = deaf_hooks(dir.path(), Duration::from_secs(3600));
        let edge = 1024 * MIB;
        assert!(!apply_far(&mut hooks, &mut kernel, &far_plan(edge)).await);
        assert!(!*kernel.memory_hooks.borrow(), "detached far away");

        let usage = dir.path().join("node/memory.usage_in_bytes");
        let climb = {
            let usage = usage.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                fs::write(&usage, format!("{}\n", edge + MIB)).unwrap();
            }
        };
        let started = tokio::time::Instant::now();
        let (woke, ()) = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(hooks.wait(), climb)
        })
        .await
        .expect("the climb past the edge woke nothing");
        woke.unwrap();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(3)
                && waited <= Duration::from_secs(3) + zone::MAX_EDGE_CHECK,
            "woke after {waited:?}"
        );
    }

    /// On the root the eventfd compares the usage file, which counts page
    /// cache beyond the working set the lines compare: when that cache
    /// goes (a file deleted) the usage can stay below the eventfd's level
    /// while the working set is in the zone. The backstop reads the
    /// working set.
    #[tokio::test(start_paused = true)]
    async fn on_the_root_a_working_set_past_the_edge_wakes_the_engine_whatever_the_usage_file_says()
    {
        let dir = tempfile::tempdir().unwrap();
        let (mut hooks, mut kernel) = deaf_hooks(dir.path(), Duration::from_secs(3600));
        fs::write(
            dir.path().join("memory.usage_in_bytes"),
            format!("{}\n", 100 * MIB),
        )
        .unwrap();
        // Far from the usage file's level; this machine's working set is
        // past the band's.
        let on_the_root = ZonePlan {
            edges: vec![ZoneEdge {
                path: "/".to_owned(),
                file_level: 1 << 50,
                band_level: 1,
            }],
            ..far_plan(1 << 50)
        };
        assert!(
            apply_far(&mut hooks, &mut kernel, &on_the_root).await,
            "the edge is passed on the working set: look again at once"
        );
        let woke = tokio::time::timeout(zone::MIN_READ_PERIOD, hooks.wait()).await;
        woke.expect("the backstop read did not wake the engine")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn near_a_line_only_the_eventfd_wakes_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let (mut hooks, mut kernel) = deaf_hooks(dir.path(), Duration::from_secs(3600));
        apply_far(&mut hooks, &mut kernel, &far_plan(1024 * MIB)).await;
        let near = ZonePlan {
            armed: true,
            reason: ArmReason::Near,
            ..far_plan(50 * MIB)
        };
        hooks.apply(Some(&mut kernel), &near);
        // Usage (100 MiB) is past the near plan's edge, and the hooks are
        // on: nothing for the backstop to do.
        let woke = tokio::time::timeout(Duration::from_secs(10), hooks.wait()).await;
        assert!(woke.is_err(), "woke near a line: {woke:?}");
    }

    /// The level the deaf cgroup's last registration wrote.
    fn registered_level(root: &Path) -> u64 {
        let line = fs::read_to_string(root.join("node/cgroup.event_control")).unwrap();
        line.split_whitespace().last().unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn an_edge_moved_while_the_hooks_are_attached_is_registered_once_the_plan_is_far() {
        let dir = tempfile::tempdir().unwrap();
        let (mut hooks, mut kernel) = deaf_hooks(dir.path(), Duration::from_secs(3600));
        apply_far(&mut hooks, &mut kernel, &far_plan(1024 * MIB)).await;
        assert_eq!(registered_level(dir.path()), 1024 * MIB);

        // A faster rate widened the zone as the node came near: the hooks
        // go on, and the edge waits where it was.
        let near = ZonePlan {
            armed: true,
            reason: ArmReason::Near,
            ..far_plan(896 * MIB)
        };
        assert!(hooks.apply(Some(&mut kernel), &near), "just attached");
        assert!(*kernel.memory_hooks.borrow());
        assert_eq!(registered_level(dir.path()), 1024 * MIB);

        assert!(!apply_far(&mut hooks, &mut kernel, &far_plan(896 * MIB)).await);
        assert!(!*kernel.memory_hooks.borrow(), "detached far away");
        assert_eq!(registered_level(dir.path()), 896 * MIB);
    }

    #[tokio::test]
    async fn a_line_gone_takes_its_edge_with_it_on_any_plan() {
        let dir = tempfile::tempdir().unwrap();
        let (mut hooks, mut kernel) = deaf_hooks(dir.path(), Duration::from_secs(3600));
        apply_far(&mut hooks, &mut kernel, &far_plan(1024 * MIB)).await;
        let no_line = ZonePlan {
            armed: false,
            reason: ArmReason::NoThreshold,
            edges: Vec::new(),
            ..far_plan(1024 * MIB)
        };
        hooks.apply(Some(&mut kernel), &no_line);
        assert!(hooks.eventfds.is_empty(), "an edge outlived its line");
    }

    #[tokio::test(start_paused = true)]
    async fn a_backstop_read_due_after_the_next_resync_is_left_to_the_resync() {
        let dir = tempfile::tempdir().unwrap();
        // The backstop would read after (1 GiB - 64 MiB - 100 MiB) / 4 GiB/s,
        // about 0.2 s; the resync, which reads the usage against the edge
        // itself, comes every 0.1 s.
        let (mut hooks, mut kernel) = deaf_hooks(dir.path(), Duration::from_millis(100));
        let edge = 1024 * MIB;
        assert!(!apply_far(&mut hooks, &mut kernel, &far_plan(edge)).await);
        let usage = dir.path().join("node/memory.usage_in_bytes");
        let climb = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            fs::write(&usage, format!("{}\n", edge + MIB)).unwrap();
        };
        let (woke, ()) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(10), hooks.wait()),
            climb
        );
        assert!(woke.is_err(), "the backstop read: {woke:?}");
        // What the resync's run does: the plan applied again reads the edge
        // passed and asks for another look at once.
        assert!(hooks.apply(Some(&mut kernel), &far_plan(edge)));
    }

    /// The kernel holds a registration up (here a FIFO nobody reads yet,
    /// as the kernel's RCU grace period does for seconds on a busy
    /// machine): the plan is applied at once and the hooks stay on until
    /// the edge is armed.
    #[tokio::test]
    async fn a_registration_the_kernel_holds_up_holds_up_no_engine_run() {
        let dir = tempfile::tempdir().unwrap();
        let (mut hooks, mut kernel) = deaf_hooks(dir.path(), Duration::from_secs(3600));
        let control = dir.path().join("node/cgroup.event_control");
        nix::unistd::mkfifo(&control, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let (go, went) = std_mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            // Opened in any case after a minute, so that an apply that
            // waited for the write ends and the test fails rather than hangs.
            let held_up = went.recv_timeout(Duration::from_secs(60)).is_err();
            (held_up, fs::read_to_string(&control).unwrap())
        });

        assert!(!hooks.apply(Some(&mut kernel), &far_plan(1024 * MIB)));
        assert!(
            *kernel.memory_hooks.borrow(),
            "detached before the edge was armed"
        );
        go.send(()).unwrap();
        let (held_up, line) = reader.join().unwrap();
        assert!(!held_up, "the apply waited for the registration");
        assert!(line.ends_with(&format!(" {}", 1024 * MIB)), "{line}");

        tokio::time::timeout(Duration::from_secs(60), hooks.wait())
            .await
            .expect("the written edge woke nothing")
            .unwrap();
        assert!(!hooks.apply(Some(&mut kernel), &far_plan(1024 * MIB)));
        assert!(
            !*kernel.memory_hooks.borrow(),
            "detached once the edge is armed"
        );
    }
}
