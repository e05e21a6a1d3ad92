//! Helpers for unit tests: what the code under test logged, and the
//! `fakes` the evictor's and the daemon's tests drive the loop with.
use std::{
    io,
    sync::{Arc, Mutex, Once, PoisonError},
};

use tracing::subscriber::DefaultGuard;
use tracing_subscriber::fmt::MakeWriter;

/// Log lines (debug and up) written on this thread while the capture is
/// alive.
#[derive(Clone, Default)]
pub(crate) struct LogCapture {
    text: Arc<Mutex<Vec<u8>>>,
}

impl LogCapture {
    /// Starts capturing; the returned guard ends it.
    pub(crate) fn start() -> (Self, DefaultGuard) {
        // tracing caches each callsite's interest for the whole process,
        // asking the subscriber of the thread that reaches it first: a test
        // running beside this one with no subscriber would cache "never",
        // and this capture would miss that line (a CI run missed `eviction
        // decided` so). A global subscriber that records nothing and wants
        // everything keeps every callsite open; lines still go to the
        // thread's own subscriber.
        static KEEP_CALLSITES_OPEN: Once = Once::new();
        KEEP_CALLSITES_OPEN.call_once(|| {
            let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
        });
        let capture = Self::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(capture.clone())
            .finish();
        (capture, tracing::subscriber::set_default(subscriber))
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        let text = self.text.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&text)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Lines at WARN or ERROR.
    pub(crate) fn problems(&self) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
            .collect()
    }

    pub(crate) fn contains(&self, text: &str) -> bool {
        self.lines().iter().any(|line| line.contains(text))
    }
}

impl io::Write for LogCapture {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogCapture {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Fakes of the loop's seams ([`crate::act::io::Io`]): a node whose memory
/// is what its pods hold, a killer that removes the pod it kills, an API
/// that answers as told, a band table and a kernel fed by the test.
pub(crate) mod fakes {
    use std::{
        cell::RefCell,
        collections::{BTreeMap, HashMap},
        path::PathBuf,
        rc::Rc,
        sync::Arc,
        time::Duration,
    };

    use evictd_common::Band;
    use tokio::sync::mpsc;

    use crate::{
        act::{
            evictor::{Evaluation, EvictionBudget, Evictor, EvictorOptions, Parts, SpentBudget},
            io::{EvictionApi, Io, KernelRecords, NodeSource, PodKiller},
            kill::{KillError, KillMethod, KillReport, Sandbox},
            pre_kill::PreKillHook,
            wake::{Clock, Wake, WakeCause},
        },
        decide::snapshot::{
            FsStats, MemoryStats, NodeStats, PidStats, PodSnapshot, PodUsage, QosClass,
        },
        decide::{
            engine::VictimPolicy,
            memory_high::MemoryHighThresholds,
            rank::PidRanking,
            thrashing::{Thrashing, ThrashingLimits},
            thresholds::{EvictionConfig, Resource, Signal, Threshold},
        },
        kernel::bpf::{BpfError, DecodeError, Purpose, Received},
        metrics::Metrics,
        node::{
            cgroupfs::{CgroupError, CgroupFs, CgroupVersion, MemoryReading},
            container_pressure::PodFinding,
            inventory::{ContainerPressurePod, InventoryError, MemoryFindings, ThrashingPod},
            runtime::{
                disk_usage::PodDiskUsage,
                link::NodeReclaim,
                local_storage::{self, LocalStorageEviction},
            },
            stats::NodeObservation,
        },
        report::kubernetes::{
            EvictOutcome, EvictionAction, EvictionNotice, KnownPod, PodWarning, PressureCondition,
        },
        scopes::{
            monitor::{BandTable, KernelCoverage, Monitor, MonitorOptions},
            registry::ScopeKey,
            zone::ZoneOptions,
        },
    };

    pub(crate) const MIB: u64 = 1 << 20;
    /// The fake node's cgroup and its memory.
    pub(crate) const NODE_CGROUP: &str = "/node";
    pub(crate) const NODE_CAPACITY: u64 = 1024 * MIB;

    pub(crate) struct Fake;

    impl Io for Fake {
        type Node = FakeNode;
        type Killer = FakeKiller;
        type Api = FakeApi;
        type Bands = FakeBands;
        type Kernel = FakeKernel;
    }

    /// A node of [`NODE_CAPACITY`] whose working set is what runs outside
    /// the pods plus what the pods hold.
    #[derive(Debug, Default)]
    pub(crate) struct NodeModel {
        pub outside_pods: u64,
        /// Inactive file pages: charged (usage) but not working set.
        pub page_cache: u64,
        /// The node's PID limit; 0 for the kernel's default (4194304).
        pub pid_max: u64,
        /// Page cache each pod holds beside its working set.
        pub pod_page_cache: u64,
        /// Pods read exactly after a cheap listing.
        pub refined: usize,
        pub pods: Vec<PodSnapshot>,
        /// Observations taken, and pod listings.
        pub observations: usize,
        pub listings: usize,
        /// The node's nodefs, if observed.
        pub nodefs: Option<FsStats>,
        /// What node-level reclaim answers a disk decision, and the signals
        /// it was asked for.
        pub reclaim: Option<NodeReclaim>,
        pub reclaims: Vec<Signal>,
        /// A disk decision finds the pods' disk usage still being read, and
        /// is told to look again after this long.
        pub disk_usage_pending: Option<Duration>,
        /// A disk decision finds the runtime unable to say what the pods
        /// use.
        pub disk_usage_unknown: bool,
        /// The runtime's reading of the pods' disk, by uid.
        pub pod_disk: BTreeMap<String, PodDiskUsage>,
        /// Pods held to their local-storage limits.
        pub local_storage_checks: usize,
        /// The runtime's sandbox ids by pod uid; none: no runtime.
        pub sandboxes: Option<BTreeMap<String, Vec<String>>>,
        /// Tasks of a killed pod not reaped yet, by cgroup: charged to it,
        /// and to the node, though the pod lists no process.
        pub unreaped: BTreeMap<String, u64>,
        /// What the next reading of the pods' memory counters finds
        /// thrashing, by pod uid; `None`: no reading is due.
        pub thrashing: Option<Vec<(String, Thrashing)>>,
        /// What the next reading of the counters finds of KEP-5986's
        /// container pressure, by pod uid.
        pub container_pressure: Option<Vec<(String, PodFinding)>>,
        /// Container cgroups whose memory.high was relaxed, in order.
        pub relaxed: Vec<String>,
    }

    impl NodeModel {
        pub(crate) fn working_set(&self) -> u64 {
            self.outside_pods
                + self
                    .pods
                    .iter()
                    .map(|pod| pod.usage.memory_working_set_bytes)
                    .sum::<u64>()
        }
    }

    /// A running BestEffort pod holding `mib` MiB.
    pub(crate) fn pod(name: &str, mib: u64) -> PodSnapshot {
        PodSnapshot {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            priority: 0,
            is_static: false,
            mirror: false,
            containers: Vec::new(),
            init_containers: Vec::new(),
            overhead: Default::default(),
            resources: None,
            empty_dirs: Vec::new(),
            termination_grace_period_seconds: None,
            usage: PodUsage {
                memory_working_set_bytes: mib * MIB,
                pids: 1,
                ..PodUsage::default()
            },
            cgroup: Some(format!("{NODE_CGROUP}/kubepods/besteffort/pod{name}")),
            unknown: Vec::new(),
            cgroup_qos: Some(QosClass::BestEffort),
            hosts_evictd: false,
        }
    }

    #[derive(Clone, Default)]
    pub(crate) struct FakeNode(pub Rc<RefCell<NodeModel>>);

    impl NodeSource for FakeNode {
        fn observe(&mut self) -> Result<NodeObservation, InventoryError> {
            let mut model = self.0.borrow_mut();
            model.observations += 1;
            let working_set = model.working_set();
            let tasks = model.pods.iter().map(|pod| pod.usage.pids).sum::<u64>()
                + model.unreaped.values().sum::<u64>()
                + 10;
            let pid_max = if model.pid_max == 0 {
                4_194_304
            } else {
                model.pid_max
            };
            Ok(NodeObservation {
                stats: NodeStats {
                    memory: MemoryStats {
                        capacity_bytes: NODE_CAPACITY,
                        working_set_bytes: working_set,
                    },
                    allocatable: None,
                    pid: Some(PidStats {
                        max: pid_max,
                        in_use: tasks,
                    }),
                    nodefs: model.nodefs,
                    imagefs: None,
                    containerfs: None,
                },
                node_cgroup: NODE_CGROUP.into(),
                node_memory: MemoryReading {
                    usage_bytes: working_set + model.page_cache,
                    inactive_file_bytes: model.page_cache,
                },
                node_band_value: Some(working_set + model.page_cache),
                kubepods: None,
                scope_tasks: Some(tasks),
            })
        }

        fn pods(&mut self) -> Result<Vec<PodSnapshot>, InventoryError> {
            let mut model = self.0.borrow_mut();
            model.listings += 1;
            Ok(model.pods.clone())
        }

        /// Memory bounds count each pod's page cache too, as bytes charged
        /// do; the process count is left unknown (0).
        fn pods_for(
            &mut self,
            resource: Resource,
        ) -> Result<Vec<Arc<PodSnapshot>>, InventoryError> {
            if matches!(resource, Resource::EphemeralStorage | Resource::Inodes) {
                let model = self.0.borrow();
                if let Some(wait) = model.disk_usage_pending {
                    return Err(InventoryError::DiskUsagePending { wait });
                }
                if model.disk_usage_unknown {
                    return Err(InventoryError::DiskUsageUnknown);
                }
            }
            let mut pods = self.pods()?;
            if resource == Resource::Memory {
                let model = self.0.borrow();
                for pod in &mut pods {
                    pod.usage.memory_working_set_bytes += model.pod_page_cache;
                    pod.usage.pids = 0;
                }
            }
            Ok(pods.into_iter().map(Arc::new).collect())
        }

        fn refine(&mut self, pod: &PodSnapshot) -> Result<Option<PodSnapshot>, InventoryError> {
            let mut model = self.0.borrow_mut();
            model.refined += 1;
            Ok(model
                .pods
                .iter()
                .find(|p| p.uid == pod.uid && p.usage.pids > 0)
                .cloned())
        }

        fn cgroups_changed(&mut self) {}

        fn cgroup_changed(&mut self, _hierarchy_id: u32, _path: &str) {}

        fn read_memory_stalls(&mut self) -> Option<MemoryFindings> {
            let mut model = self.0.borrow_mut();
            let thrashing = model.thrashing.take();
            let container_pressure = model.container_pressure.take();
            if thrashing.is_none() && container_pressure.is_none() {
                return None;
            }
            let pod = |uid: &str| {
                let pod = model.pods.iter().find(|pod| pod.uid == uid)?;
                Some(Arc::new(pod.clone()))
            };
            Some(MemoryFindings {
                thrashing: thrashing
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(uid, thrashing)| {
                        Some(ThrashingPod {
                            pod: pod(&uid)?,
                            thrashing,
                        })
                    })
                    .collect(),
                container_pressure: container_pressure
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(uid, finding)| {
                        Some(ContainerPressurePod {
                            pod: pod(&uid)?,
                            finding,
                        })
                    })
                    .collect(),
            })
        }

        fn relax_memory_high(&mut self, path: &str) -> Result<String, CgroupError> {
            self.0.borrow_mut().relaxed.push(path.to_owned());
            Ok("max".to_owned())
        }

        /// As the inventory: only pods that set a limit, judged on the
        /// runtime's reading when there is one.
        fn local_storage_violations(
            &mut self,
            dedicated_imagefs: bool,
        ) -> Result<Vec<LocalStorageEviction>, InventoryError> {
            let mut model = self.0.borrow_mut();
            model.local_storage_checks += 1;
            let limited: Vec<PodSnapshot> = model
                .pods
                .iter()
                .filter(|pod| local_storage::has_limit(pod))
                .cloned()
                .collect();
            if limited.is_empty() {
                return Ok(Vec::new());
            }
            if let Some(wait) = model.disk_usage_pending {
                return Err(InventoryError::DiskUsagePending { wait });
            }
            if model.disk_usage_unknown {
                return Err(InventoryError::DiskUsageUnknown);
            }
            Ok(local_storage::violations(
                limited,
                &model.pod_disk,
                dedicated_imagefs,
            ))
        }

        fn reclaim(&mut self, signal: Signal, _dry_run: bool) -> NodeReclaim {
            let mut model = self.0.borrow_mut();
            model.reclaims.push(signal);
            model.reclaim.unwrap_or(NodeReclaim::Unavailable)
        }

        fn sandbox_of(&self, uid: &str) -> impl Future<Output = Option<Vec<String>>> + 'static {
            let ids = self
                .0
                .borrow()
                .sandboxes
                .as_ref()
                .map(|sandboxes| sandboxes.get(uid).cloned().unwrap_or_default());
            std::future::ready(ids)
        }

        fn tasks(&self, cgroup: &str) -> Result<u64, CgroupError> {
            let model = self.0.borrow();
            let running = model
                .pods
                .iter()
                .filter(|pod| pod.cgroup.as_deref() == Some(cgroup))
                .map(|pod| pod.usage.pids)
                .sum::<u64>();
            Ok(running + model.unreaped.get(cgroup).copied().unwrap_or(0))
        }

        fn working_set(&self, cgroup: &str) -> Result<u64, CgroupError> {
            let model = self.0.borrow();
            Ok(model
                .pods
                .iter()
                .find(|pod| pod.cgroup.as_deref() == Some(cgroup))
                .map_or(0, |pod| pod.usage.memory_working_set_bytes))
        }

        fn container_working_sets(
            &self,
            _pod_cgroup: &str,
            containers: &[(String, String)],
        ) -> Vec<(String, Option<u64>)> {
            containers
                .iter()
                .map(|(name, _)| (name.clone(), None))
                .collect()
        }
    }

    /// Kills by removing the pod from the node, or fails when told to.
    #[derive(Clone, Default)]
    pub(crate) struct FakeKiller {
        pub node: FakeNode,
        pub fail: Rc<RefCell<bool>>,
        /// Cgroups asked to be killed, in order, and the grace each got.
        pub killed: Rc<RefCell<Vec<String>>>,
        pub graces: Rc<RefCell<Vec<Duration>>>,
        /// What each kill was told of the pod's sandbox, in order.
        pub sandboxes: Rc<RefCell<Vec<Sandbox>>>,
    }

    impl PodKiller for FakeKiller {
        /// A soft eviction's processes ignore SIGTERM: the kill takes the
        /// whole grace period.
        async fn kill_pod(
            &self,
            cgroup: &str,
            grace: Duration,
            sandbox: &Sandbox,
        ) -> Result<KillReport, KillError> {
            self.killed.borrow_mut().push(cgroup.to_owned());
            self.graces.borrow_mut().push(grace);
            self.sandboxes.borrow_mut().push(sandbox.clone());
            tokio::time::sleep(grace).await;
            if *self.fail.borrow() {
                return Err(KillError::Timeout {
                    cgroup: cgroup.to_owned(),
                    pids: vec![42],
                    waited: Duration::from_secs(10),
                });
            }
            self.node
                .0
                .borrow_mut()
                .pods
                .retain(|pod| pod.cgroup.as_deref() != Some(cgroup));
            Ok(KillReport {
                method: KillMethod::Signals,
                started_at_ns: 0,
                sigterm_sent: 0,
                sigkill_sent: 1,
                rounds: 1,
                mrelease_ok: 1,
                mrelease_failed: 0,
                frozen: false,
                frozen_after: None,
                freeze_holdouts: Vec::new(),
                thawed_after: None,
                first_sigkill_after: Some(Duration::ZERO),
                released_after: Some(Duration::ZERO),
                empty_after: Duration::ZERO,
            })
        }

        fn thaw_abandoned(&self, _cgroups: &[&str]) -> Vec<String> {
            Vec::new()
        }
    }

    #[derive(Debug)]
    pub(crate) struct ApiModel {
        pub action: EvictionAction,
        pub known: HashMap<String, KnownPod>,
        /// What the Eviction API answers.
        pub answer: EvictOutcome,
        pub evictions: usize,
        pub reports: Vec<EvictionNotice>,
        pub warnings: Vec<PodWarning>,
        pub conditions: Vec<PressureCondition>,
    }

    #[derive(Clone)]
    pub(crate) struct FakeApi(pub Rc<RefCell<ApiModel>>);

    impl FakeApi {
        /// An API with `--eviction-action evict` that knows `pods`.
        pub(crate) fn evicting(pods: &[PodSnapshot], answer: EvictOutcome) -> Self {
            let known = pods
                .iter()
                .map(|pod| {
                    let known = KnownPod {
                        snapshot: pod.clone(),
                        container_ids: Vec::new(),
                        mirror_of: None,
                    };
                    (pod.uid.clone(), known)
                })
                .collect();
            Self(Rc::new(RefCell::new(ApiModel {
                action: EvictionAction::Evict,
                known,
                answer,
                evictions: 0,
                reports: Vec::new(),
                warnings: Vec::new(),
                conditions: Vec::new(),
            })))
        }
    }

    impl EvictionApi for FakeApi {
        fn action(&self) -> EvictionAction {
            self.0.borrow().action
        }

        fn known(&self, uid: &str) -> Option<KnownPod> {
            self.0.borrow().known.get(uid).cloned()
        }

        fn report(&self, notice: EvictionNotice) {
            self.0.borrow_mut().reports.push(notice);
        }

        async fn evict(&self, _notice: EvictionNotice, _grace: Duration) -> EvictOutcome {
            let mut model = self.0.borrow_mut();
            model.evictions += 1;
            model.answer.clone()
        }

        fn warn_pod(&self, warning: PodWarning) {
            self.0.borrow_mut().warnings.push(warning);
        }

        fn set_pressure_condition(&self, condition: PressureCondition) {
            self.0.borrow_mut().conditions.push(condition);
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct FakeBands {
        pub bands: BTreeMap<ScopeKey, Band>,
        pub writes: usize,
        /// Refuses new scopes, as a full BPF map does.
        pub full: bool,
    }

    impl BandTable for FakeBands {
        fn band(&self, key: ScopeKey) -> Result<Option<Band>, BpfError> {
            Ok(self.bands.get(&key).copied())
        }

        fn set_band(&mut self, key: ScopeKey, band: Band) -> Result<(), BpfError> {
            if self.full && !self.bands.contains_key(&key) {
                return Err(BpfError::Poll(std::io::Error::from_raw_os_error(
                    libc::E2BIG,
                )));
            }
            self.writes += 1;
            self.bands.insert(key, band);
            Ok(())
        }

        fn remove(&mut self, key: ScopeKey) -> Result<(), BpfError> {
            self.bands.remove(&key);
            Ok(())
        }
    }

    /// Records the test sends, as the ring buffer would deliver them.
    /// Records the test sends, and the memory hooks' attachments.
    pub(crate) struct FakeKernel {
        pub records: mpsc::UnboundedReceiver<Received>,
        /// Whether the memory hooks are attached (they are at startup).
        pub memory_hooks: Rc<RefCell<bool>>,
        /// Every change, in order: true for attached.
        pub memory_hook_changes: Rc<RefCell<Vec<bool>>>,
        /// Whether the PID hooks are attached (they are at startup).
        pub pid_hooks: Rc<RefCell<bool>>,
        /// Moves of the PID hooks asked for, and whether they fail.
        pub pid_hook_moves: u32,
        pub refuse_pid_hooks: bool,
        /// Kills started (a [`FakeKiller`]'s `killed`), and how many had
        /// at each change.
        pub kills: Rc<RefCell<Vec<String>>>,
        pub kills_at_changes: Rc<RefCell<Vec<usize>>>,
    }

    impl FakeKernel {
        pub(crate) fn new(records: mpsc::UnboundedReceiver<Received>) -> Self {
            Self {
                records,
                memory_hooks: Rc::new(RefCell::new(true)),
                memory_hook_changes: Rc::default(),
                pid_hooks: Rc::new(RefCell::new(true)),
                pid_hook_moves: 0,
                refuse_pid_hooks: false,
                kills: Rc::default(),
                kills_at_changes: Rc::default(),
            }
        }
    }

    impl KernelRecords for FakeKernel {
        async fn next_batch(
            &mut self,
            out: &mut Vec<Result<Received, DecodeError>>,
        ) -> Result<(), BpfError> {
            match self.records.recv().await {
                Some(record) => out.push(Ok(record)),
                None => std::future::pending().await,
            }
            while let Ok(record) = self.records.try_recv() {
                out.push(Ok(record));
            }
            Ok(())
        }

        fn new_drops(&mut self, _metrics: &Metrics) -> u64 {
            0
        }

        fn refresh_counters(&mut self, _metrics: &Metrics) -> u64 {
            0
        }

        fn set_hooks(&mut self, purpose: Purpose, armed: bool) -> Result<bool, BpfError> {
            if purpose == Purpose::Pids {
                self.pid_hook_moves += 1;
                if self.refuse_pid_hooks {
                    return Err(BpfError::Missing("task_fork"));
                }
                return Ok(self.pid_hooks.replace(armed) != armed);
            }
            let changed = self.memory_hooks.replace(armed) != armed;
            if changed {
                self.memory_hook_changes.borrow_mut().push(armed);
                self.kills_at_changes
                    .borrow_mut()
                    .push(self.kills.borrow().len());
            }
            Ok(changed)
        }
    }

    /// An evictor on fakes, with handles to what it touches. The cgroup
    /// directories the scope monitor resolves ids from exist in `dir`.
    pub(crate) struct Harness {
        pub evictor: Evictor<Fake>,
        pub node: FakeNode,
        pub killer: FakeKiller,
        pub metrics: Arc<Metrics>,
        /// Holds the fake cgroupfs.
        pub _dir: tempfile::TempDir,
    }

    pub(crate) struct HarnessOptions {
        pub eviction: EvictionConfig,
        pub pods: Vec<PodSnapshot>,
        pub outside_pods: u64,
        pub api: Option<FakeApi>,
        pub dry_run: bool,
        /// Kernel programs watch the engine's scopes (event mode).
        pub kernel: bool,
        pub budget: EvictionBudget,
        /// Precise memory hooks near thresholds only.
        pub zone: Option<ZoneOptions>,
        /// PID hooks near PID thresholds only.
        pub pid_zone: Option<ZoneOptions>,
        /// The state directory that keeps the budget spent.
        pub state_dir: Option<PathBuf>,
        pub pid_ranking: PidRanking,
        pub pre_kill: Option<PreKillHook>,
        pub thrashing_eviction: bool,
        pub memory_high_thresholds: MemoryHighThresholds,
    }

    impl Default for HarnessOptions {
        fn default() -> Self {
            Self {
                eviction: EvictionConfig::of(
                    Threshold::hard_memory_available(100 * MIB as i64).to_vec(),
                ),
                pods: Vec::new(),
                outside_pods: 0,
                api: None,
                dry_run: false,
                kernel: true,
                budget: EvictionBudget {
                    count: 10,
                    period: Duration::from_secs(60),
                },
                zone: None,
                pid_zone: None,
                state_dir: None,
                pid_ranking: PidRanking::Kubelet,
                pre_kill: None,
                thrashing_eviction: false,
                memory_high_thresholds: MemoryHighThresholds::OFF,
            }
        }
    }

    impl Harness {
        /// Call with tokio's clock paused: the evictor's clock is tokio's.
        pub(crate) fn new(options: HarnessOptions) -> Self {
            let dir = tempfile::tempdir().expect("temporary directory");
            let cgroupfs = CgroupFs {
                version: CgroupVersion::V2,
                memory_root: dir.path().join("memory"),
                pids_root: Some(dir.path().join("pids")),
                freezer_root: None,
            };
            for root in ["memory", "pids"] {
                let node: PathBuf = dir
                    .path()
                    .join(root)
                    .join(NODE_CGROUP.trim_start_matches('/'));
                std::fs::create_dir_all(node).expect("fake cgroup directory");
            }
            let config = options.eviction;
            let metrics = Metrics::new().expect("metrics");
            let node = FakeNode::default();
            {
                let mut model = node.0.borrow_mut();
                model.pods = options.pods;
                model.outside_pods = options.outside_pods;
            }
            let killer = FakeKiller {
                node: node.clone(),
                ..FakeKiller::default()
            };
            let coverage = KernelCoverage {
                memory: options.kernel,
                pids: options.kernel,
                cgroup_lifecycle: options.kernel,
            };
            let monitor = Monitor::new(
                cgroupfs,
                Vec::new(),
                options.kernel.then(FakeBands::default),
                coverage,
                metrics.clone(),
                MonitorOptions {
                    memory_hysteresis: 16 * MIB,
                    pids_hysteresis: 8,
                },
            );
            let evictor = Evictor::new(
                config,
                Parts {
                    node: node.clone(),
                    killer: killer.clone(),
                    api: options.api,
                    monitor,
                    spent_budget: options
                        .state_dir
                        .and_then(|dir| SpentBudget::new(&dir, "node-a")),
                    pre_kill: options.pre_kill,
                },
                metrics.clone(),
                Clock::new(),
                EvictorOptions {
                    policy: VictimPolicy::One,
                    pid_ranking: options.pid_ranking,
                    dry_run: options.dry_run,
                    reclaim_timeout: Duration::from_secs(10),
                    kernel_triggers: options.kernel,
                    budget: options.budget,
                    zone: options.zone,
                    pid_zone: options.pid_zone,
                    thrashing_eviction: options.thrashing_eviction,
                    thrashing_limits: ThrashingLimits::default(),
                    memory_high_thresholds: options.memory_high_thresholds,
                },
            );
            Self {
                evictor,
                node,
                killer,
                metrics,
                _dir: dir,
            }
        }

        /// Runs the engine for `wake`, then, as the serve loop does, every
        /// eviction it starts to its end and the engine again after each,
        /// until none is under way. Returns the last evaluation.
        pub(crate) async fn settle(&mut self, wake: Wake) -> Evaluation {
            let mut evaluation = self.evictor.evaluate(wake);
            while self.evictor.evictions_running() > 0 {
                let (id, ended) = self.evictor.next_ended().await;
                self.evictor.end(id, ended);
                let wake = self.evictor.clock().wake(WakeCause::EvictionEnded);
                evaluation = self.evictor.evaluate(wake);
            }
            evaluation
        }

        /// Engine runs counted for `cause` (`evictd_engine_runs_total`).
        pub(crate) fn engine_runs(&self, cause: &str) -> u64 {
            self.metrics.engine_runs.with_label_values(&[cause]).get()
        }
    }
}
