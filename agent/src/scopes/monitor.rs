//! The watched scopes and the loop that serves them: kernel events in, fresh
//! cgroupfs reads, logs and metrics out. The same scopes are checked on a
//! timer: as a resync behind the kernel programs (to repair a dropped record
//! or a level left stale by a race), or as the whole trigger where a resource
//! has no kernel program (polling).
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use evictd_common::NODE_PIDS_SCOPE_ID;
use tracing::{debug, info, warn};

use crate::{
    kernel::bpf::{
        BpfError, CgroupChange, Crossing, DecodeError, EventStream, KernelCounters, KernelEvent,
        Probes, Purpose, Received, Resource,
    },
    node::cgroupfs::{self, CgroupError, CgroupFs},
    report::metrics::Metrics,
    scopes::levels::Levels,
    scopes::spec::{Target, WatchSpec},
};

#[derive(Debug, Clone, Copy)]
pub struct MonitorOptions {
    pub memory_hysteresis: u64,
    pub pids_hysteresis: u64,
}

/// A fresh reading of a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Bytes charged, or tasks: what the thresholds compare.
    pub value: u64,
    /// kubelet's working set, for memory scopes.
    pub working_set: Option<u64>,
}

#[derive(Debug)]
struct Watched {
    resource: Resource,
    /// Cgroup path relative to the hierarchy root; `None` for node tasks.
    path: Option<String>,
    levels: Levels,
    /// Thresholds crossed, as of the last fresh read.
    level: usize,
    /// Whether a kernel band watches this scope (else it is polled).
    kernel: bool,
    /// Installed for the eviction engine (its crossings wake the engine)
    /// rather than by a --watch flag.
    engine: bool,
}

/// Where a crossing was noticed.
#[derive(Debug, Clone, Copy)]
struct Origin {
    /// `kernel` (ring buffer), `resync` (timer behind the kernel), `poll`.
    source: &'static str,
    /// The value the kernel compared, when it was the kernel.
    kernel_value: Option<u64>,
    /// Kernel timestamp to userspace read, when it was the kernel.
    latency: Option<Duration>,
}

impl Origin {
    const RESYNC: Self = Self {
        source: "resync",
        kernel_value: None,
        latency: None,
    };
    const POLL: Self = Self {
        source: "poll",
        kernel_value: None,
        latency: None,
    };
}

impl Watched {
    fn label(&self) -> &str {
        self.path.as_deref().unwrap_or("node")
    }
}

pub struct Monitor {
    cgroupfs: CgroupFs,
    specs: Vec<WatchSpec>,
    probes: Option<Probes>,
    watched: BTreeMap<(Resource, u64), Watched>,
    metrics: Arc<Metrics>,
    options: MonitorOptions,
    hierarchies: cgroupfs::HierarchyIds,
    counters: KernelCounters,
}

impl Monitor {
    pub fn new(
        cgroupfs: CgroupFs,
        specs: Vec<WatchSpec>,
        probes: Option<Probes>,
        metrics: Arc<Metrics>,
        options: MonitorOptions,
    ) -> Self {
        Self {
            hierarchies: cgroupfs::hierarchy_ids(&cgroupfs),
            cgroupfs,
            specs,
            probes,
            watched: BTreeMap::new(),
            metrics,
            options,
            counters: KernelCounters::default(),
        }
    }

    /// Whether the kernel pushes crossings of `resource`.
    pub fn kernel_watches(&self, resource: Resource) -> bool {
        let purpose = match resource {
            Resource::Memory => Purpose::Memory,
            Resource::Pids => Purpose::Pids,
        };
        self.probes.as_ref().is_some_and(|p| p.covers(purpose))
    }

    /// Installs every scope the specs name that exists now. Scopes created
    /// later are installed when the kernel reports their mkdir, or, without
    /// the lifecycle programs, found by `check_all`.
    pub fn install_all(&mut self) {
        for spec in self.specs.clone() {
            match &spec.target {
                Target::NodeTasks => self.install(&spec, None, false),
                Target::Exact => {}
                Target::Cgroups(pattern) => {
                    let paths = self.existing(&spec);
                    if paths.is_empty() {
                        info!(scope = %pattern, resource = spec.resource.as_str(),
                            "no such cgroup yet; it will be watched once created");
                    }
                    for path in paths {
                        self.install(&spec, Some(path), false);
                    }
                }
            }
        }
    }

    /// Existing cgroups a spec matches.
    fn existing(&self, spec: &WatchSpec) -> Vec<String> {
        let Target::Cgroups(pattern) = &spec.target else {
            return Vec::new();
        };
        let root = match spec.resource {
            Resource::Memory => Some(&self.cgroupfs.memory_root),
            Resource::Pids => self.cgroupfs.pids_root.as_ref(),
        };
        match root {
            Some(root) => pattern.expand(root),
            None => {
                warn!(scope = %pattern, "no pids controller mounted; scope not watched");
                Vec::new()
            }
        }
    }

    /// Installs matching cgroups created since the last look; used when no
    /// kernel program reports cgroup creation.
    fn install_new(&mut self) {
        for spec in self.specs.clone() {
            for path in self.existing(&spec) {
                let known = self.watched.iter().any(|((resource, _), w)| {
                    *resource == spec.resource && w.path.as_deref() == Some(path.as_str())
                });
                if !known {
                    self.install(&spec, Some(path), false);
                }
            }
        }
    }

    fn install(&mut self, spec: &WatchSpec, path: Option<String>, engine: bool) {
        let label = path.clone().unwrap_or_else(|| "node".into());
        let resource = spec.resource;
        let levels = spec.levels(self.hysteresis(resource));
        let resolved = match &path {
            None => Ok(NODE_PIDS_SCOPE_ID),
            Some(path) => self
                .cgroup_dir(resource, path)
                .and_then(|dir| CgroupFs::cgroup_id(&dir)),
        };
        // A cgroup removed before it could be watched (a pod that came and
        // went between its mkdir record and now) is routine.
        let id = match resolved {
            Ok(id) => id,
            Err(CgroupError::Gone(_)) => {
                debug!(scope = label, "cgroup gone before it could be watched");
                return;
            }
            Err(e) => {
                warn!(scope = label, error = %e, "cannot watch scope");
                return;
            }
        };
        let reading = match self.read(resource, path.as_deref()) {
            Ok(reading) => reading,
            Err(CgroupError::Gone(_)) => {
                debug!(scope = label, "cgroup gone before it could be read");
                return;
            }
            Err(e) => {
                warn!(scope = label, error = %e, "cannot read scope; not watched");
                return;
            }
        };
        let level = levels.next_level(0, reading.value);
        let kernel = self.kernel_watches(resource);
        if kernel
            && let Some(probes) = self.probes.as_mut()
            && let Err(e) = probes.set_band(resource, id, levels.band(level, reading.value))
        {
            warn!(scope = label, error = %e, "cannot install scope in the kernel");
            return;
        }
        info!(
            scope = label,
            resource = resource.as_str(),
            cgroup_id = id,
            thresholds = ?levels.thresholds(),
            value = reading.value,
            level,
            trigger = if kernel { "bpf" } else { "poll" },
            "watching scope"
        );
        let watched = Watched {
            resource,
            path,
            levels,
            level,
            kernel,
            engine,
        };
        if let Some(replaced) = self.watched.get(&(resource, id))
            && replaced.engine != engine
        {
            warn!(
                scope = label,
                "the eviction engine and a --watch flag name the same scope; the latest install wins"
            );
        }
        self.update_gauges(&watched, reading);
        if level > 0 {
            self.report(&watched, 0, reading, Origin::RESYNC);
        }
        self.watched.insert((resource, id), watched);
    }

    fn hysteresis(&self, resource: Resource) -> u64 {
        match resource {
            Resource::Memory => self.options.memory_hysteresis,
            Resource::Pids => self.options.pids_hysteresis,
        }
    }

    /// Watches a scope for the eviction engine: `thresholds` are the values
    /// (bytes charged, or tasks) at which one of its signals may cross, and
    /// a crossing of any of them wakes the engine. Called again whenever the
    /// thresholds move (capacity changed); empty thresholds remove the scope.
    /// `path` is `None` for every task on the node.
    pub fn watch_for_engine(
        &mut self,
        resource: Resource,
        path: Option<&str>,
        thresholds: Vec<u64>,
    ) {
        let existing = self
            .watched
            .iter()
            .find(|((r, _), w)| *r == resource && w.engine && w.path.as_deref() == path)
            .map(|(key, w)| (*key, w.levels.clone()));
        let levels = Levels::new(thresholds.clone(), self.hysteresis(resource));
        match existing {
            Some((_, current)) if current == levels => {}
            Some((key, _)) if thresholds.is_empty() => self.remove(key.0, key.1),
            Some((key, _)) => {
                if let Some(watched) = self.watched.get_mut(&key) {
                    watched.levels = levels;
                }
                match self.read(resource, path) {
                    Ok(reading) => {
                        self.settle(key, reading, Origin::RESYNC);
                    }
                    Err(e) => warn!(scope = path, error = %e, "cannot read engine scope"),
                }
            }
            None if thresholds.is_empty() => {}
            None => {
                let target = match path {
                    None => Target::NodeTasks,
                    Some(_) => Target::Exact,
                };
                let spec = WatchSpec {
                    resource,
                    target,
                    thresholds,
                };
                self.install(&spec, path.map(str::to_owned), true);
            }
        }
    }

    /// Counts and logs a record that did not decode.
    pub fn decode_error(&self, error: &DecodeError) {
        self.metrics.decode_errors.inc();
        warn!(%error, "undecodable ring-buffer record");
    }

    /// Whether any engine scope is past one of its thresholds (as of its
    /// last fresh read).
    pub fn engine_scope_raised(&self) -> bool {
        self.watched.values().any(|w| w.engine && w.level > 0)
    }

    fn cgroup_dir(
        &self,
        resource: Resource,
        path: &str,
    ) -> Result<std::path::PathBuf, CgroupError> {
        match resource {
            Resource::Memory => Ok(self.cgroupfs.memory_dir(path)),
            Resource::Pids => self.cgroupfs.pids_dir(path),
        }
    }

    fn read(&self, resource: Resource, path: Option<&str>) -> Result<Reading, CgroupError> {
        match (resource, path) {
            (Resource::Memory, Some(path)) => {
                let memory = self.cgroupfs.read_memory(path)?;
                Ok(Reading {
                    value: memory.usage_bytes,
                    working_set: Some(memory.working_set_bytes()),
                })
            }
            (Resource::Pids, Some(path)) => Ok(Reading {
                value: self.cgroupfs.read_pids(path)?,
                working_set: None,
            }),
            (_, None) => Ok(Reading {
                value: cgroupfs::node_tasks()?,
                working_set: None,
            }),
        }
    }

    fn remove(&mut self, resource: Resource, id: u64) {
        let Some(watched) = self.watched.remove(&(resource, id)) else {
            return;
        };
        if let Some(probes) = self.probes.as_mut()
            && let Err(e) = probes.remove_scope(resource, id)
        {
            warn!(scope = watched.label(), error = %e, "cannot remove scope from the kernel");
        }
        let labels = [watched.label(), resource.as_str()];
        // A series that was never set is not an error worth reporting.
        let _ = self.metrics.scope_value.remove_label_values(&labels);
        let _ = self.metrics.scope_level.remove_label_values(&labels);
        let _ = self
            .metrics
            .scope_working_set
            .remove_label_values(&[watched.label()]);
        info!(
            scope = watched.label(),
            resource = resource.as_str(),
            "scope removed"
        );
    }

    /// Handles one ring-buffer record. Returns whether it was a crossing of
    /// a scope the eviction engine watches, which must wake the engine.
    pub fn handle(&mut self, received: Received) -> bool {
        let event = received.event;
        self.metrics.events.with_label_values(&[event.kind()]).inc();
        self.metrics
            .event_latency
            .observe(received.latency().as_secs_f64());
        match event {
            KernelEvent::Crossing(crossing) => {
                return self.on_crossing(crossing, received.latency());
            }
            KernelEvent::OomVictim(victim) => {
                self.metrics.oom_kills.inc();
                let comm = String::from_utf8_lossy(
                    victim.comm.split(|b| *b == 0).next().unwrap_or_default(),
                )
                .into_owned();
                let scope = self
                    .watched
                    .get(&(Resource::Memory, victim.memory_cgroup_id))
                    .map(|w| w.label().to_owned());
                warn!(
                    pid = victim.pid,
                    comm,
                    memory_cgroup_id = victim.memory_cgroup_id,
                    scope,
                    rss_bytes = victim.rss_bytes,
                    latency_us = received.latency().as_micros() as u64,
                    "kernel OOM killer chose a victim"
                );
            }
            KernelEvent::CgroupCreated(change) => self.on_mkdir(change),
            KernelEvent::CgroupRemoved(change) => self.on_rmdir(change),
        }
        false
    }

    fn on_crossing(&mut self, crossing: Crossing, latency: Duration) -> bool {
        let key = (crossing.resource, crossing.raw.scope_id);
        let Some(watched) = self.watched.get(&key) else {
            debug!(?crossing, "crossing for a scope no longer watched");
            return false;
        };
        let engine = watched.engine;
        let reading = match self.read(watched.resource, watched.path.as_deref()) {
            Ok(reading) => reading,
            Err(CgroupError::Gone(_)) => {
                debug!(
                    scope = watched.label(),
                    "scope vanished before it could be re-read"
                );
                return engine;
            }
            Err(e) => {
                warn!(scope = watched.label(), error = %e, "cannot re-read scope after a crossing");
                return engine;
            }
        };
        let label = watched.label().to_owned();
        let origin = Origin {
            source: "kernel",
            kernel_value: Some(crossing.raw.value),
            latency: Some(latency),
        };
        if !self.settle(key, reading, origin) {
            debug!(
                scope = label,
                value = reading.value,
                "band left but the level holds (value moved back, or a repeat); re-armed"
            );
        }
        engine
    }

    /// Moves a scope to the level `reading` puts it at, reports a change,
    /// and re-arms its kernel band. Returns whether the level changed.
    fn settle(&mut self, key: (Resource, u64), reading: Reading, origin: Origin) -> bool {
        let Some(watched) = self.watched.get(&key) else {
            return false;
        };
        let next = watched.levels.next_level(watched.level, reading.value);
        let changed = next != watched.level;
        if changed {
            self.report(watched, next, reading, origin);
        }
        let band = watched.levels.band(next, reading.value);
        let label = watched.label().to_owned();
        let kernel = watched.kernel;
        if let Some(watched) = self.watched.get_mut(&key) {
            watched.level = next;
            self.update_gauges_of(key, reading);
        }
        if kernel && let Some(probes) = self.probes.as_mut() {
            let current = probes.band(key.0, key.1);
            let rearm = match current {
                Ok(Some(current)) => {
                    (current.rise_at, current.fall_below) != (band.rise_at, band.fall_below)
                }
                Ok(None) | Err(_) => true,
            };
            if rearm && let Err(e) = probes.set_band(key.0, key.1, band) {
                warn!(scope = label, error = %e, "cannot re-arm scope in the kernel");
            }
        }
        changed
    }

    fn on_mkdir(&mut self, change: CgroupChange) {
        let (path, cut) = change.path();
        debug!(
            path,
            hierarchy = change.0.hierarchy_id,
            cgroup_id = change.0.cgroup_id,
            "cgroup created"
        );
        if cut {
            warn!(
                path,
                "cgroup path too long for the event; not matched against watches"
            );
            return;
        }
        let matching: Vec<WatchSpec> = self
            .specs
            .iter()
            .filter(|spec| {
                let in_hierarchy = match spec.resource {
                    Resource::Memory => self.hierarchies.memory == Some(change.0.hierarchy_id),
                    Resource::Pids => self.hierarchies.pids == Some(change.0.hierarchy_id),
                };
                in_hierarchy
                    && matches!(&spec.target, Target::Cgroups(pattern) if pattern.matches(&path))
            })
            .cloned()
            .collect();
        for spec in matching {
            self.install(&spec, Some(path.clone()), false);
        }
    }

    fn on_rmdir(&mut self, change: CgroupChange) {
        let id = change.0.cgroup_id;
        debug!(path = change.path().0, cgroup_id = id, "cgroup removed");
        for resource in [Resource::Memory, Resource::Pids] {
            let in_hierarchy = match resource {
                Resource::Memory => self.hierarchies.memory == Some(change.0.hierarchy_id),
                Resource::Pids => self.hierarchies.pids == Some(change.0.hierarchy_id),
            };
            if in_hierarchy {
                self.remove(resource, id);
            }
        }
    }

    /// Re-reads every scope from cgroupfs and repairs levels that disagree
    /// with it. For kernel-watched resources this catches a record the ring
    /// buffer dropped; for the others it is the polling trigger.
    pub fn check_all(&mut self) {
        let lost = self.refresh_counters();
        self.resync(lost);
    }

    /// Checks whether the kernel dropped records since the last look (the
    /// ring buffer was full: the agent was busy, or stopped) and if so
    /// resyncs at once rather than at the next timer tick: a lost crossing
    /// may be the pressure itself. One map read per batch of records.
    /// Returns whether it resynced.
    pub fn recover_lost_records(&mut self) -> bool {
        let Some(probes) = &self.probes else {
            return false;
        };
        let total = match probes.ringbuf_drops() {
            Ok(total) => total,
            Err(e) => {
                warn!(error = %e, "cannot read kernel counters");
                return false;
            }
        };
        let drops = total.saturating_sub(self.counters.ringbuf_drops);
        if drops == 0 {
            return false;
        }
        self.report_drops(drops);
        self.counters.ringbuf_drops = total;
        self.resync(true);
        true
    }

    /// Re-reads every watched scope. `lost_records`: the kernel dropped
    /// records, maybe the mkdir of a cgroup a watch names, so the watched
    /// patterns are expanded again too.
    fn resync(&mut self, lost_records: bool) {
        let lifecycle_events = self
            .probes
            .as_ref()
            .is_some_and(|p| p.covers(Purpose::CgroupLifecycle));
        if !lifecycle_events || lost_records {
            self.install_new();
        }
        let keys: Vec<_> = self.watched.keys().copied().collect();
        for key in keys {
            let Some(watched) = self.watched.get(&key) else {
                continue;
            };
            let reading = match self.read(watched.resource, watched.path.as_deref()) {
                Ok(reading) => reading,
                Err(CgroupError::Gone(_)) => {
                    debug!(scope = watched.label(), "scope vanished");
                    self.remove(key.0, key.1);
                    continue;
                }
                Err(e) => {
                    warn!(scope = watched.label(), error = %e, "cannot read scope");
                    continue;
                }
            };
            let origin = if watched.kernel {
                Origin::RESYNC
            } else {
                Origin::POLL
            };
            self.settle(key, reading, origin);
        }
    }

    /// Brings the kernel's counters into the metrics. Returns whether
    /// records were dropped since the last look.
    fn refresh_counters(&mut self) -> bool {
        let Some(probes) = &self.probes else {
            return false;
        };
        let counters = match probes.counters() {
            Ok(counters) => counters,
            Err(e) => {
                warn!(error = %e, "cannot read kernel counters");
                return false;
            }
        };
        let drops = counters
            .ringbuf_drops
            .saturating_sub(self.counters.ringbuf_drops);
        self.report_drops(drops);
        self.metrics.kernel_memory_checks.inc_by(
            counters
                .memory_checks
                .saturating_sub(self.counters.memory_checks),
        );
        self.metrics.kernel_read_errors.inc_by(
            counters
                .read_errors
                .saturating_sub(self.counters.read_errors),
        );
        self.counters = counters;
        for stats in probes.program_stats() {
            self.metrics
                .program_runs
                .with_label_values(&[stats.program])
                .set(stats.runs as i64);
            self.metrics
                .program_run_time
                .with_label_values(&[stats.program])
                .set(stats.run_time.as_nanos() as i64);
        }
        drops > 0
    }

    /// Logs and counts `drops` records lost since the last look.
    fn report_drops(&self, drops: u64) {
        if drops == 0 {
            return;
        }
        warn!(
            drops,
            "ring buffer was full and dropped records; resyncing from cgroupfs"
        );
        self.metrics.ringbuf_drops.inc_by(drops);
    }

    fn update_gauges_of(&self, key: (Resource, u64), reading: Reading) {
        if let Some(watched) = self.watched.get(&key) {
            self.update_gauges(watched, reading);
        }
    }

    fn update_gauges(&self, watched: &Watched, reading: Reading) {
        let labels = [watched.label(), watched.resource.as_str()];
        self.metrics
            .scope_value
            .with_label_values(&labels)
            .set(reading.value as i64);
        self.metrics
            .scope_level
            .with_label_values(&labels)
            .set(watched.level as i64);
        if let Some(working_set) = reading.working_set {
            self.metrics
                .scope_working_set
                .with_label_values(&[watched.label()])
                .set(working_set as i64);
        }
    }

    /// Logs and counts a move of `watched` from its level to `new`.
    fn report(&self, watched: &Watched, new: usize, reading: Reading, origin: Origin) {
        let old = watched.level;
        let direction = if new > old { "above" } else { "below" };
        self.metrics
            .crossings
            .with_label_values(&[watched.resource.as_str(), direction, origin.source])
            .inc();
        info!(
            scope = watched.label(),
            resource = watched.resource.as_str(),
            direction,
            threshold = watched.levels.crossed(old, new),
            level = new,
            previous_level = old,
            kernel_value = origin.kernel_value,
            value = reading.value,
            working_set = reading.working_set,
            latency_us = origin.latency.map(|l| l.as_micros() as u64),
            source = origin.source,
            "threshold crossed"
        );
    }

    /// Gives the probes back (dropping them detaches every program).
    pub fn into_probes(self) -> Option<Probes> {
        self.probes
    }
}

/// The next batch of ring-buffer records; never resolves without a stream.
pub async fn next_batch(
    events: Option<&mut EventStream>,
    batch: &mut Vec<Result<Received, DecodeError>>,
) -> Result<(), BpfError> {
    match events {
        Some(events) => events.next_batch(batch).await,
        None => std::future::pending().await,
    }
}
