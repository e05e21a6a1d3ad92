//! The loop's I/O, each piece a trait that the live agent implements with
//! the real thing and a unit test with a fake (as mini-redis passes its
//! listener in): the node as cgroupfs shows it, the kill, the Kubernetes
//! API, the kernel's band table and the kernel's records.
use std::{future::Future, sync::Arc, time::Duration};

use crate::{
    act::kill::{KillError, KillReport, Killer, Sandbox},
    decide::snapshot::PodSnapshot,
    decide::thresholds::{Resource, Signal},
    kernel::bpf::{BpfError, DecodeError, EventStream, Probes, Purpose, Received, ScopeMaps},
    metrics::Metrics,
    node::{
        cgroupfs::CgroupError,
        inventory::{Inventory, InventoryError, MemoryFindings},
        runtime::{link::NodeReclaim, local_storage::LocalStorageEviction},
        stats::NodeObservation,
    },
    report::{
        kernel_side::CounterExport,
        kubernetes::{
            EvictOutcome, EvictionAction, EvictionNotice, KnownPod, Kubernetes, PodWarning,
            PressureCondition,
        },
    },
    scopes::monitor::BandTable,
};

/// Every seam of the loop, as one set of types.
pub(crate) trait Io {
    type Node: NodeSource;
    /// Cloned into each eviction, which runs beside the loop.
    type Killer: PodKiller + Clone + 'static;
    type Api: EvictionApi + 'static;
    type Bands: BandTable;
    type Kernel: KernelRecords;
}

/// The live agent's I/O.
pub(crate) struct Live;

impl Io for Live {
    type Node = Inventory;
    type Killer = Killer;
    type Api = Kubernetes;
    type Bands = ScopeMaps;
    type Kernel = KernelSide;
}

/// The node, read fresh on every call.
pub(crate) trait NodeSource {
    /// Every signal's input and the engine scopes' readings, each file read
    /// once.
    fn observe(&mut self) -> Result<NodeObservation, InventoryError>;
    /// Every pod, with its usage read now.
    fn pods(&mut self) -> Result<Vec<PodSnapshot>, InventoryError>;
    /// Every pod with a cheap reading for a decision on `resource`: for
    /// memory an upper bound of the working set (bytes charged) and no
    /// process count, made exact by [`NodeSource::refine`]. The pods are
    /// shared with the source, which may keep them for the next call.
    fn pods_for(&mut self, resource: Resource) -> Result<Vec<Arc<PodSnapshot>>, InventoryError>;
    /// `pod` with its working set read exactly; `None` once it is gone or
    /// no process runs in it.
    fn refine(&mut self, pod: &PodSnapshot) -> Result<Option<PodSnapshot>, InventoryError>;
    /// Cgroups may have been created or removed (records lost, or a
    /// resync without the lifecycle programs).
    fn cgroups_changed(&mut self);
    /// Cgroup `path` of hierarchy `hierarchy_id` was created or removed (a
    /// kernel record).
    fn cgroup_changed(&mut self, hierarchy_id: u32, path: &str);
    /// Reads and exports every pod's memory stall and refault counters,
    /// when they are due (a timer's work, never a decision's): the pods
    /// found thrashing at their own limit and those whose containers'
    /// pressure calls for a KEP-5986 stage, `None` when nothing was read.
    fn read_memory_stalls(&mut self) -> Option<MemoryFindings> {
        None
    }
    /// KEP-5986's stage 1: container cgroup `path`'s memory.high raised to
    /// its memory.max; the value written.
    fn relax_memory_high(&mut self, path: &str) -> Result<String, CgroupError>;
    /// Each container's ephemeral storage (writable layer and logs, by
    /// name) in pod `uid`, as the last disk reading found it; empty without
    /// a container runtime.
    fn container_ephemeral_storage(&self, _uid: &str) -> Vec<(String, Option<u64>)> {
        Vec::new()
    }
    /// Node-level reclaim before a disk decision for `signal` (kubelet's
    /// `reclaimNodeLevelResources`): a node without a container runtime
    /// has none.
    fn reclaim(&mut self, _signal: Signal, _dry_run: bool) -> NodeReclaim {
        NodeReclaim::Unavailable
    }
    /// The running pods over a local-storage limit (kubelet's
    /// `localStorageEviction`), judged on the runtime's reading of their
    /// disk; none without a container runtime.
    fn local_storage_violations(
        &mut self,
        _dedicated_imagefs: bool,
    ) -> Result<Vec<LocalStorageEviction>, InventoryError> {
        Ok(Vec::new())
    }
    /// The container runtime's sandbox ids for pod `uid`, asked now (the
    /// runtime's thread answers); `None` without a runtime, or when it
    /// cannot say.
    fn sandbox_of(&self, _uid: &str) -> impl Future<Output = Option<Vec<String>>> + 'static {
        std::future::ready(None)
    }
    /// A cgroup's working set now; 0 once the cgroup is gone.
    fn working_set(&self, cgroup: &str) -> Result<u64, CgroupError>;
    /// The tasks a cgroup's subtree is charged for now (`pids.current`:
    /// one that exited counts until it is reaped); 0 once it is gone.
    fn tasks(&self, cgroup: &str) -> Result<u64, CgroupError>;
    /// Each container's working set (by name), found below the pod's cgroup
    /// by its runtime id; `None` where it cannot be read.
    fn container_working_sets(
        &self,
        pod_cgroup: &str,
        containers: &[(String, String)],
    ) -> Vec<(String, Option<u64>)>;
}

/// Ends a pod's processes.
pub(crate) trait PodKiller {
    /// Kills every process of `cgroup`'s subtree, after SIGTERM (to all but
    /// `sandbox`'s processes) and up to `grace` when that is not zero.
    fn kill_pod(
        &self,
        cgroup: &str,
        grace: Duration,
        sandbox: &Sandbox,
    ) -> impl Future<Output = Result<KillReport, KillError>>;
    /// Thaws the pods among `cgroups` a killed agent left frozen; returns
    /// them.
    fn thaw_abandoned(&self, cgroups: &[&str]) -> Vec<String>;
}

/// The Kubernetes API, where evictions are made final and visible.
pub(crate) trait EvictionApi {
    fn action(&self) -> EvictionAction;
    /// The pod whose cgroup carries `uid`, as the API last showed it.
    fn known(&self, uid: &str) -> Option<KnownPod>;
    /// Queues the report of a finished eviction; never waits.
    fn report(&self, notice: EvictionNotice);
    /// A soft eviction through the Eviction API, waiting at most
    /// --api-timeout.
    fn evict(&self, notice: EvictionNotice, grace: Duration) -> impl Future<Output = EvictOutcome>;
    /// Queues a warning event on a pod (best effort); never waits.
    fn warn_pod(&self, warning: PodWarning);
    /// Queues KEP-5986's `ContainerMemoryPressure` condition on a pod;
    /// never waits.
    fn set_pressure_condition(&self, condition: PressureCondition);
}

/// The kernel programs' records and counters.
pub(crate) trait KernelRecords {
    /// Waits for records and appends every one available to `out`.
    fn next_batch(
        &mut self,
        out: &mut Vec<Result<Received, DecodeError>>,
    ) -> impl Future<Output = Result<(), BpfError>>;
    /// Records a full ring buffer dropped since the last look (logged and
    /// counted).
    fn new_drops(&mut self, metrics: &Metrics) -> u64;
    /// Exports the programs' counters; returns the records dropped since
    /// the last look.
    fn refresh_counters(&mut self, metrics: &Metrics) -> u64;
    /// Attaches or detaches the programs of the hook that serves
    /// `purpose`, which stay loaded; returns whether anything changed
    /// (nothing does where no hook serves it).
    fn set_hooks(&mut self, purpose: Purpose, attached: bool) -> Result<bool, BpfError>;
}

impl NodeSource for Inventory {
    fn observe(&mut self) -> Result<NodeObservation, InventoryError> {
        Inventory::observe(self)
    }

    fn pods(&mut self) -> Result<Vec<PodSnapshot>, InventoryError> {
        Inventory::pods(self)
    }

    fn pods_for(&mut self, resource: Resource) -> Result<Vec<Arc<PodSnapshot>>, InventoryError> {
        Inventory::pods_for(self, resource)
    }

    fn refine(&mut self, pod: &PodSnapshot) -> Result<Option<PodSnapshot>, InventoryError> {
        Inventory::refine(self, pod)
    }

    fn cgroups_changed(&mut self) {
        Inventory::cgroups_changed(self);
    }

    fn cgroup_changed(&mut self, hierarchy_id: u32, path: &str) {
        Inventory::cgroup_changed(self, hierarchy_id, path);
    }

    fn read_memory_stalls(&mut self) -> Option<MemoryFindings> {
        Inventory::read_memory_stalls(self)
    }

    fn relax_memory_high(&mut self, path: &str) -> Result<String, CgroupError> {
        Inventory::relax_memory_high(self, path)
    }

    fn reclaim(&mut self, signal: Signal, dry_run: bool) -> NodeReclaim {
        Inventory::reclaim(self, signal, dry_run)
    }

    fn local_storage_violations(
        &mut self,
        dedicated_imagefs: bool,
    ) -> Result<Vec<LocalStorageEviction>, InventoryError> {
        Inventory::local_storage_violations(self, dedicated_imagefs)
    }

    fn container_ephemeral_storage(&self, uid: &str) -> Vec<(String, Option<u64>)> {
        self.runtime()
            .and_then(|link| link.last_pod_usage(uid))
            .map(|pod| {
                pod.containers
                    .iter()
                    .map(|c| (c.name.clone(), c.ephemeral_storage_bytes()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn sandbox_of(&self, uid: &str) -> impl Future<Output = Option<Vec<String>>> + 'static {
        let lookup = self.runtime().map(|link| link.pod_sandboxes(uid));
        async move { lookup?.await }
    }

    fn working_set(&self, cgroup: &str) -> Result<u64, CgroupError> {
        match self.cgroupfs().read_memory(cgroup) {
            Ok(memory) => Ok(memory.working_set_bytes()),
            Err(CgroupError::Gone(_)) => Ok(0),
            Err(e) => Err(e),
        }
    }

    fn tasks(&self, cgroup: &str) -> Result<u64, CgroupError> {
        match self.cgroupfs().read_pids(cgroup) {
            Err(CgroupError::Gone(_)) => Ok(0),
            other => other,
        }
    }

    fn container_working_sets(
        &self,
        pod_cgroup: &str,
        containers: &[(String, String)],
    ) -> Vec<(String, Option<u64>)> {
        crate::node::containers::working_sets(self.cgroupfs(), pod_cgroup, containers)
    }
}

impl PodKiller for Killer {
    async fn kill_pod(
        &self,
        cgroup: &str,
        grace: Duration,
        sandbox: &Sandbox,
    ) -> Result<KillReport, KillError> {
        Killer::kill_pod(self, cgroup, grace, sandbox).await
    }

    fn thaw_abandoned(&self, cgroups: &[&str]) -> Vec<String> {
        Killer::thaw_abandoned(self, cgroups)
    }
}

impl EvictionApi for Kubernetes {
    fn action(&self) -> EvictionAction {
        Kubernetes::action(self)
    }

    fn known(&self, uid: &str) -> Option<KnownPod> {
        self.store().get(uid)
    }

    fn report(&self, notice: EvictionNotice) {
        Kubernetes::report(self, notice);
    }

    async fn evict(&self, notice: EvictionNotice, grace: Duration) -> EvictOutcome {
        Kubernetes::evict(self, notice, grace).await
    }

    fn warn_pod(&self, warning: PodWarning) {
        Kubernetes::warn_pod(self, warning);
    }

    fn set_pressure_condition(&self, condition: PressureCondition) {
        Kubernetes::set_pressure_condition(self, condition);
    }
}

/// The live kernel side: the ring buffer, and the programs whose counters
/// say what it dropped. Dropping it detaches every program.
pub(crate) struct KernelSide {
    pub events: EventStream,
    pub probes: Probes,
    pub counters: CounterExport,
}

impl KernelRecords for KernelSide {
    async fn next_batch(
        &mut self,
        out: &mut Vec<Result<Received, DecodeError>>,
    ) -> Result<(), BpfError> {
        self.events.next_batch(out).await
    }

    fn new_drops(&mut self, metrics: &Metrics) -> u64 {
        self.counters.new_drops(&self.probes, metrics)
    }

    fn refresh_counters(&mut self, metrics: &Metrics) -> u64 {
        self.counters.refresh(&self.probes, metrics)
    }

    fn set_hooks(&mut self, purpose: Purpose, attached: bool) -> Result<bool, BpfError> {
        let hook = self
            .probes
            .hooks()
            .iter()
            .copied()
            .find(|hook| hook.purpose() == purpose);
        match hook {
            Some(hook) => self.probes.set_active(hook, attached),
            None => Ok(false),
        }
    }
}
