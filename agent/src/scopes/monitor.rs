//! The shell around the scope [`Registry`]: reads the `--watch` scopes from
//! cgroupfs, installs the cgroups their patterns match as they come and go,
//! arms each scope's band in the kernel through a [`BandTable`], and logs
//! and counts every crossing. Engine scopes are read by the engine's own
//! observation of the node and handed in as
//! [`Tripwires`](super::tripwires::Tripwires); the monitor never reads them
//! itself.
//!
//! Flag scopes are re-read on a timer: as a resync behind the kernel
//! programs (to repair a dropped record or a level left stale by a race),
//! or as the whole trigger where a resource has no kernel program.
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use evictd_common::{Band, NODE_PIDS_SCOPE_ID};
use tracing::{debug, info, warn};

use crate::{
    kernel::bpf::{BpfError, CgroupChange, Crossing, ScopeKind, ScopeMaps},
    logs,
    metrics::Metrics,
    node::cgroupfs::{self, CgroupError, CgroupFs, HierarchyIds},
    scopes::{
        levels::Levels,
        registry::{Owner, Reading, Registry, Scope, ScopeKey, Settled},
        spec::{Target, WatchSpec},
        tripwires::EngineScope,
    },
};

/// Where the kernel holds each scope's band: the BPF scope maps, or a fake
/// in tests.
pub(crate) trait BandTable {
    /// The band as the kernel holds it now.
    fn band(&self, key: ScopeKey) -> Result<Option<Band>, BpfError>;
    fn set_band(&mut self, key: ScopeKey, band: Band) -> Result<(), BpfError>;
    /// Stops watching `key`; a scope that was not watched is fine.
    fn remove(&mut self, key: ScopeKey) -> Result<(), BpfError>;
}

impl BandTable for ScopeMaps {
    fn band(&self, key: ScopeKey) -> Result<Option<Band>, BpfError> {
        ScopeMaps::band(self, key.kind, key.id)
    }

    fn set_band(&mut self, key: ScopeKey, band: Band) -> Result<(), BpfError> {
        ScopeMaps::set_band(self, key.kind, key.id, band)
    }

    fn remove(&mut self, key: ScopeKey) -> Result<(), BpfError> {
        self.remove_scope(key.kind, key.id)
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct MonitorOptions {
    pub memory_hysteresis: u64,
    pub pids_hysteresis: u64,
}

/// What the kernel pushes, which decides what the monitor reads itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KernelCoverage {
    pub memory: bool,
    pub pids: bool,
    /// cgroup mkdir/rmdir records, which install the cgroups a pattern
    /// matches as they come; without them every resync looks for new ones.
    pub cgroup_lifecycle: bool,
}

impl KernelCoverage {
    fn watches(&self, kind: ScopeKind) -> bool {
        match kind {
            ScopeKind::Memory => self.memory,
            ScopeKind::Pids => self.pids,
        }
    }
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

    fn of_timer(kernel: bool) -> Self {
        if kernel { Self::RESYNC } else { Self::POLL }
    }
}

pub(crate) struct Monitor<B> {
    cgroupfs: CgroupFs,
    specs: Vec<WatchSpec>,
    bands: Option<B>,
    coverage: KernelCoverage,
    registry: Registry,
    metrics: Arc<Metrics>,
    options: MonitorOptions,
    hierarchies: HierarchyIds,
    /// Kernel crossings of engine scopes, settled by the engine's next
    /// observation of the node.
    pending: BTreeMap<ScopeKey, Origin>,
}

impl<B: BandTable> Monitor<B> {
    /// `bands` is `None` when no kernel program watches any scope; then
    /// `coverage` must be all false.
    pub(crate) fn new(
        cgroupfs: CgroupFs,
        specs: Vec<WatchSpec>,
        bands: Option<B>,
        coverage: KernelCoverage,
        metrics: Arc<Metrics>,
        options: MonitorOptions,
    ) -> Self {
        Self {
            hierarchies: cgroupfs::hierarchy_ids(&cgroupfs),
            cgroupfs,
            specs,
            bands,
            coverage,
            registry: Registry::default(),
            metrics,
            options,
            pending: BTreeMap::new(),
        }
    }

    /// Whether kernel records tell of every cgroup created or removed.
    pub(crate) fn sees_cgroup_lifecycle(&self) -> bool {
        self.bands.is_some() && self.coverage.cgroup_lifecycle
    }

    /// Whether the kernel pushes crossings of `kind`.
    pub(crate) fn kernel_watches(&self, kind: ScopeKind) -> bool {
        self.bands.is_some() && self.coverage.watches(kind)
    }

    /// Installs every scope the specs name that exists now. Scopes created
    /// later are installed when the kernel reports their mkdir, or, without
    /// the lifecycle programs, found by [`Monitor::resync`].
    pub(crate) fn install_all(&mut self) {
        for spec in self.specs.clone() {
            match &spec.target {
                Target::NodeTasks => self.install_flag(&spec, None),
                Target::Cgroups(pattern) => {
                    let paths = self.existing(&spec);
                    if paths.is_empty() {
                        info!(scope = %pattern, resource = spec.kind.as_str(),
                            "no such cgroup yet; it will be watched once created");
                    }
                    for path in paths {
                        self.install_flag(&spec, Some(path));
                    }
                }
            }
        }
    }

    /// Handles a kernel crossing record. Returns whether it was a crossing
    /// of an engine scope, which must wake the engine (whose observation
    /// settles it); a flag scope is re-read and settled here.
    pub(crate) fn on_crossing(&mut self, crossing: &Crossing, latency: Duration) -> bool {
        let key = ScopeKey {
            kind: crossing.kind,
            id: crossing.raw.scope_id,
        };
        let Some(scope) = self.registry.get(key) else {
            debug!(?crossing, "crossing for a scope no longer watched");
            return false;
        };
        let origin = Origin {
            source: "kernel",
            kernel_value: Some(crossing.raw.value),
            latency: Some(latency),
        };
        if scope.owner == Owner::Engine {
            self.pending.insert(key, origin);
            return true;
        }
        let path = scope.path.clone();
        match self.read(key.kind, path.as_deref()) {
            Ok(reading) => {
                if !self.settle(key, reading, origin) {
                    debug!(
                        scope = path.as_deref().unwrap_or("node"),
                        value = logs::amount(reading.value, key.kind.in_bytes()).logged(),
                        "band left but the level holds (value moved back, or a repeat); re-armed"
                    );
                }
            }
            Err(CgroupError::Gone(_)) => {
                debug!(scope = path, "scope vanished before it could be re-read");
            }
            Err(e) => warn!(scope = path, error = %e, "cannot re-read scope after a crossing"),
        }
        false
    }

    /// Settles every engine scope with the reading the engine's observation
    /// took, installing, moving or removing each as `scopes` says (a scope
    /// with no threshold, or no longer named, is removed). Returns whether
    /// an engine scope is past one of its thresholds.
    pub(crate) fn apply_engine(&mut self, scopes: &[EngineScope]) -> bool {
        for stale in self.registry.keys_of(Owner::Engine) {
            let named = self.registry.get(stale).is_some_and(|scope| {
                scopes.iter().any(|wanted| {
                    wanted.kind == stale.kind
                        && wanted.path == scope.path
                        && !wanted.thresholds.is_empty()
                })
            });
            if !named {
                self.remove(stale);
            }
        }
        // Without programs (poll mode), the timer is the only trigger.
        if self.bands.is_none() {
            return false;
        }
        for wanted in scopes.iter().filter(|s| !s.thresholds.is_empty()) {
            let levels = Levels::new(wanted.thresholds.clone(), self.hysteresis(wanted.kind));
            match self
                .registry
                .find(wanted.kind, wanted.path.as_deref(), Owner::Engine)
            {
                Some(key) => {
                    let origin = self.pending.remove(&key).unwrap_or(Origin::RESYNC);
                    let unchanged = self.registry.get(key).is_some_and(|s| s.levels == levels);
                    let settled = if unchanged {
                        self.registry.settle(key, wanted.reading)
                    } else {
                        self.registry.set_levels(key, levels, wanted.reading)
                    };
                    if let Some(settled) = settled {
                        self.apply(key, settled, wanted.reading, origin);
                    }
                }
                None => self.install(
                    wanted.kind,
                    wanted.path.clone(),
                    levels,
                    Owner::Engine,
                    wanted.reading,
                ),
            }
        }
        self.pending.clear();
        self.registry.engine_raised()
    }

    /// A cgroup was created: installs it for every pattern it matches.
    pub(crate) fn on_mkdir(&mut self, change: &CgroupChange) {
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
                self.in_hierarchy(spec.kind, change.0.hierarchy_id)
                    && matches!(&spec.target, Target::Cgroups(pattern) if pattern.matches(&path))
            })
            .cloned()
            .collect();
        for spec in matching {
            self.install_flag(&spec, Some(path.clone()));
        }
    }

    /// A cgroup was removed: so is its scope.
    pub(crate) fn on_rmdir(&mut self, change: &CgroupChange) {
        let id = change.0.cgroup_id;
        debug!(path = change.path().0, cgroup_id = id, "cgroup removed");
        for kind in [ScopeKind::Memory, ScopeKind::Pids] {
            if self.in_hierarchy(kind, change.0.hierarchy_id) {
                self.remove(ScopeKey { kind, id });
            }
        }
    }

    /// Re-reads every flag scope from cgroupfs and repairs levels that
    /// disagree with it (the engine's own observation settles its scopes).
    /// `lost_records`: the kernel dropped records, maybe the mkdir of a
    /// cgroup a pattern names, so the patterns are expanded again too.
    pub(crate) fn resync(&mut self, lost_records: bool) {
        if !self.sees_cgroup_lifecycle() || lost_records {
            self.install_new();
        }
        for key in self.registry.keys_of(Owner::Flag) {
            let Some(scope) = self.registry.get(key) else {
                continue;
            };
            let origin = Origin::of_timer(scope.kernel);
            let path = scope.path.clone();
            match self.read(key.kind, path.as_deref()) {
                Ok(reading) => {
                    self.settle(key, reading, origin);
                }
                Err(CgroupError::Gone(_)) => {
                    debug!(scope = path, "scope vanished");
                    self.remove(key);
                }
                Err(e) => warn!(scope = path, error = %e, "cannot read scope"),
            }
        }
    }

    /// The label of the memory scope `id`, if watched (to name the scope of
    /// a kernel OOM victim).
    pub(crate) fn memory_scope_label(&self, id: u64) -> Option<&str> {
        self.registry
            .get(ScopeKey {
                kind: ScopeKind::Memory,
                id,
            })
            .map(Scope::label)
    }

    /// Whether a kernel band watches a scope of `kind` now: without one, the
    /// programs of `kind` have nothing to compare.
    pub(crate) fn kernel_watches_a_scope(&self, kind: ScopeKind) -> bool {
        self.bands.is_some() && self.registry.kernel_watches_any(kind)
    }

    /// Whether a kernel band watches a `--watch-*` scope of `kind` now,
    /// which reports its crossings at any distance.
    pub(crate) fn kernel_watches_a_flag_scope(&self, kind: ScopeKind) -> bool {
        self.bands.is_some() && self.registry.kernel_watches_any_of(kind, Owner::Flag)
    }

    /// The band table, for tests to read what the kernel holds.
    #[cfg(test)]
    pub(crate) fn bands(&self) -> Option<&B> {
        self.bands.as_ref()
    }

    /// Gives the band table back (dropping the scope maps frees them).
    pub(crate) fn into_bands(self) -> Option<B> {
        self.bands
    }

    fn hysteresis(&self, kind: ScopeKind) -> u64 {
        match kind {
            ScopeKind::Memory => self.options.memory_hysteresis,
            ScopeKind::Pids => self.options.pids_hysteresis,
        }
    }

    fn in_hierarchy(&self, kind: ScopeKind, hierarchy_id: u32) -> bool {
        let id = match kind {
            ScopeKind::Memory => self.hierarchies.memory,
            ScopeKind::Pids => self.hierarchies.pids,
        };
        id == Some(hierarchy_id)
    }

    /// Existing cgroups a spec matches.
    fn existing(&self, spec: &WatchSpec) -> Vec<String> {
        let Target::Cgroups(pattern) = &spec.target else {
            return Vec::new();
        };
        let root = match spec.kind {
            ScopeKind::Memory => Some(&self.cgroupfs.memory_root),
            ScopeKind::Pids => self.cgroupfs.pids_root.as_ref(),
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
                if !self.registry.watches(spec.kind, &path) {
                    self.install_flag(&spec, Some(path));
                }
            }
        }
    }

    fn install_flag(&mut self, spec: &WatchSpec, path: Option<String>) {
        let label = path.as_deref().unwrap_or("node");
        let reading = match self.read(spec.kind, path.as_deref()) {
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
        let levels = spec.levels(self.hysteresis(spec.kind));
        self.install(spec.kind, path, levels, Owner::Flag, reading);
    }

    fn install(
        &mut self,
        kind: ScopeKind,
        path: Option<String>,
        levels: Levels,
        owner: Owner,
        reading: Reading,
    ) {
        let label = path.clone().unwrap_or_else(|| "node".into());
        let resolved = match &path {
            None => Ok(NODE_PIDS_SCOPE_ID),
            Some(path) => self
                .cgroup_dir(kind, path)
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
        let key = ScopeKey { kind, id };
        let kernel = self.kernel_watches(kind);
        let thresholds = levels.thresholds().to_vec();
        let (settled, replaced) = self
            .registry
            .install(key, path, levels, kernel, owner, reading);
        if replaced.is_some() {
            warn!(
                scope = label,
                "the eviction engine and a --watch flag name the same scope; the latest install wins"
            );
        }
        let level = self.registry.get(key).map_or(0, |scope| scope.level);
        let mut kernel = kernel;
        if let (Some(band), Some(bands)) = (settled.band, self.bands.as_mut())
            && let Err(e) = bands.set_band(key, band)
        {
            // A full scope map (4096 scopes) must not leave a scope unwatched.
            warn!(scope = label, error = %e,
                "cannot install scope in the kernel; it is polled every resync instead");
            self.registry.poll_instead(key);
            kernel = false;
        }
        info!(
            scope = label,
            resource = kind.as_str(),
            cgroup_id = id,
            thresholds = logs::amounts(&thresholds, kind.in_bytes()).logged(),
            value = logs::amount(reading.value, kind.in_bytes()).logged(),
            level,
            trigger = if kernel { "bpf" } else { "poll" },
            "watching scope"
        );
        self.report(key, settled, reading, Origin::RESYNC);
    }

    fn remove(&mut self, key: ScopeKey) {
        let Some(scope) = self.registry.remove(key) else {
            return;
        };
        if let Some(bands) = self.bands.as_mut()
            && let Err(e) = bands.remove(key)
        {
            warn!(scope = scope.label(), error = %e, "cannot remove scope from the kernel");
        }
        let labels = [scope.label(), key.kind.as_str()];
        // A series that was never set is not an error worth reporting.
        let _ = self.metrics.scope_value.remove_label_values(&labels);
        let _ = self.metrics.scope_level.remove_label_values(&labels);
        let _ = self
            .metrics
            .scope_working_set
            .remove_label_values(&[scope.label()]);
        info!(
            scope = scope.label(),
            resource = key.kind.as_str(),
            "scope removed"
        );
    }

    /// Settles `reading`, reports a change and re-arms the kernel band.
    /// Returns whether the level changed.
    fn settle(&mut self, key: ScopeKey, reading: Reading, origin: Origin) -> bool {
        match self.registry.settle(key, reading) {
            Some(settled) => self.apply(key, settled, reading, origin),
            None => false,
        }
    }

    /// Carries out what settling changed: the report, the gauges, the band.
    fn apply(&mut self, key: ScopeKey, settled: Settled, reading: Reading, origin: Origin) -> bool {
        self.report(key, settled, reading, origin);
        if let (Some(band), Some(bands)) = (settled.band, self.bands.as_mut()) {
            // After a crossing the kernel disarmed the band itself; otherwise
            // it may already hold this one.
            let held = bands.band(key).ok().flatten();
            let same = held.is_some_and(|held| {
                (held.rise_at, held.fall_below) == (band.rise_at, band.fall_below)
            });
            if !same && let Err(e) = bands.set_band(key, band) {
                let label = self.registry.get(key).map_or("?", Scope::label);
                warn!(scope = label, error = %e, "cannot re-arm scope in the kernel");
            }
        }
        settled.change.is_some()
    }

    fn cgroup_dir(&self, kind: ScopeKind, path: &str) -> Result<std::path::PathBuf, CgroupError> {
        match kind {
            ScopeKind::Memory => Ok(self.cgroupfs.memory_dir(path)),
            ScopeKind::Pids => self.cgroupfs.pids_dir(path),
        }
    }

    fn read(&self, kind: ScopeKind, path: Option<&str>) -> Result<Reading, CgroupError> {
        match (kind, path) {
            (ScopeKind::Memory, Some(path)) => {
                let memory = self.cgroupfs.read_memory(path)?;
                Ok(Reading {
                    value: memory.usage_bytes,
                    working_set: Some(memory.working_set_bytes()),
                })
            }
            (ScopeKind::Pids, Some(path)) => Ok(Reading {
                value: self.cgroupfs.read_pids(path)?,
                working_set: None,
            }),
            (_, None) => Ok(Reading {
                value: cgroupfs::node_tasks(None)?,
                working_set: None,
            }),
        }
    }

    /// The gauges of `key`, and a log line and a count when its level moved.
    fn report(&self, key: ScopeKey, settled: Settled, reading: Reading, origin: Origin) {
        let Some(scope) = self.registry.get(key) else {
            return;
        };
        let labels = [scope.label(), key.kind.as_str()];
        self.metrics
            .scope_value
            .with_label_values(&labels)
            .set(reading.value as i64);
        self.metrics
            .scope_level
            .with_label_values(&labels)
            .set(scope.level as i64);
        if let Some(working_set) = reading.working_set {
            self.metrics
                .scope_working_set
                .with_label_values(&[scope.label()])
                .set(working_set as i64);
        }
        let Some(change) = settled.change else {
            return;
        };
        let direction = change.direction();
        self.metrics
            .crossings
            .with_label_values(&[key.kind.as_str(), direction, origin.source])
            .inc();
        let bytes = key.kind.in_bytes();
        info!(
            scope = scope.label(),
            resource = key.kind.as_str(),
            direction,
            threshold = logs::amount(change.threshold, bytes).logged(),
            level = change.to,
            previous_level = change.from,
            kernel_value = logs::maybe_amount(origin.kernel_value, bytes).logged(),
            value = logs::amount(reading.value, bytes).logged(),
            working_set = logs::maybe_amount(reading.working_set, bytes).logged(),
            latency_us = origin.latency.map(|l| l.as_micros() as u64),
            source = origin.source,
            "threshold crossed"
        );
    }
}

#[cfg(test)]
mod tests;
