//! The pods on the node, found in cgroups as kubelet lays them out, with
//! what a metadata source says about them, and the node's signals: the live
//! [`Snapshot`] the engine decides on.
//!
//! kubelet's layouts under the node's cgroup (QoS class from the path):
//! - cgroupfs driver: `kubepods/pod<uid>` (Guaranteed),
//!   `kubepods/burstable/pod<uid>`, `kubepods/besteffort/pod<uid>`;
//! - systemd driver: `kubepods.slice/kubepods-pod<uid>.slice`,
//!   `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`,
//!   and besteffort likewise, with the uid's dashes written as underscores.
//!
//! Containers are cgroups below the pod's; usage is read at the pod's level,
//! which counts them all.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fs, io,
    os::unix::fs::DirEntryExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::{debug, info, warn};

pub(crate) use crate::node::pod_metadata::MetadataFile;
use crate::{
    decide::memory_high::MemoryHighThresholds,
    decide::snapshot::{PodSnapshot, PodUsage, QosClass, ResourceList, Resources, Snapshot},
    decide::thrashing::{Thrashing, ThrashingLimits},
    decide::thresholds::{Resource, Signal},
    metrics::Metrics,
    node::cgroupfs::{CgroupError, CgroupFs, KeptOpen, OpenMemory, hierarchy_ids, is_gone},
    node::cold_cache::ColdCache,
    node::container_pressure::{ContainerPressures, PodFinding},
    node::forks::{ForkClock, ForkRateError},
    node::runtime::{
        link::{DiskUsageAnswer, NodeReclaim, RuntimeLink},
        local_storage::{self, LocalStorageEviction},
        reading::fill_pods,
    },
    node::stalls::{self, PodStalls, StallsError},
    node::stats::{NodeObservation, NodeSignals, SignalsError, child_path, memory_limit},
    quantity::Quantity,
};

/// Where the node and its pods are found (built from the command line's
/// `config::InventoryArgs`).
#[derive(Debug, Clone)]
pub struct InventoryOptions {
    /// The cgroup that stands for the node (`--node-cgroup`).
    pub node_cgroup: String,
    /// A JSON list of pods in the snapshot schema (`--pod-metadata`).
    pub pod_metadata: Option<PathBuf>,
    /// The uid of the pod evictd runs in, never a victim (`--pod-uid`).
    pub pod_uid: Option<String>,
    /// The filesystem the nodefs signals measure (`--nodefs-path`).
    pub nodefs_path: PathBuf,
    /// The filesystem the imagefs signals measure (`--imagefs-path`).
    pub imagefs_path: PathBuf,
    /// memory.available also leaves out the node's cold active file pages
    /// (`--memory-signal reclaimable`).
    pub cold_cache: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(
        "--node-cgroup {path:?}: no such cgroup in the memory hierarchy ({dir}); create it or name an existing one"
    )]
    NoNodeCgroup { path: String, dir: PathBuf },
    #[error("--pod-metadata {path}: {source}")]
    MetadataRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--pod-metadata {path}: not a JSON list of pods in the snapshot schema: {source}")]
    MetadataParse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("listing pods under {path}: {source}")]
    List {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Signals(#[from] SignalsError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Look again after `wait` (the runtime's thread says how long a
    /// reading under way may still take).
    #[error("the pods' disk usage is being read from the container runtime")]
    DiskUsagePending { wait: Duration },
    #[error(
        "the container runtime cannot say what disk the pods use (down, or its reading failed)"
    )]
    DiskUsageUnknown,
}

impl InventoryError {
    /// Whether the user's input is at fault (exit status 2).
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            Self::NoNodeCgroup { .. } | Self::MetadataRead { .. } | Self::MetadataParse { .. }
        )
    }
}

/// What is known about pods beyond their cgroups (namespace, name,
/// priority, requests...): --pod-metadata's file, or the Kubernetes API's
/// pod store. Lookups must not block: the engine calls them mid-decision.
pub(crate) trait PodMetadataSource: Send {
    /// The pod with this uid, if the source knows it.
    fn lookup(&mut self, uid: &str) -> Result<Option<PodSnapshot>, InventoryError>;

    /// Takes in what changed at the source since the last call, once
    /// before a listing's lookups.
    fn refresh(&mut self) {}

    /// Changes whenever a lookup's answer may have: a listing reuses the
    /// pods it built from the source while this stays the same.
    fn generation(&self) -> u64;

    /// Where the source counts its own troubles, once the metrics exist.
    fn set_metrics(&mut self, _metrics: Arc<Metrics>) {}
}

/// The bytes charged to every memory cgroup under one, read at once: the
/// kernel's cgroup iterator (`kernel::bpf::CgroupCharges`).
pub(crate) trait ChargesSource: Send {
    /// Bytes charged by cgroup id into `charges`, cleared first.
    fn read(&mut self, charges: &mut HashMap<u64, u64>) -> io::Result<()>;
}

/// The pods as last listed, and what was built of each from its metadata.
struct Listing {
    cgroups: Vec<PodCgroup>,
    /// Per cgroup, the pod last built from the metadata source's answer,
    /// while the source's generation is still `generation`: a decision
    /// then reads only the pods' usage, and neither looks every pod up nor
    /// copies its spec. `None` for a pod the source did not know, which is
    /// built afresh each time (its memory limit is read again).
    built: Vec<Option<Arc<PodSnapshot>>>,
    generation: Option<u64>,
}

/// A pod found thrashing at its own memory limit.
#[derive(Debug, Clone)]
pub(crate) struct ThrashingPod {
    pub pod: Arc<PodSnapshot>,
    pub thrashing: Thrashing,
}

/// A pod whose containers' memory pressure calls for a KEP-5986 stage.
#[derive(Debug, Clone)]
pub(crate) struct ContainerPressurePod {
    pub pod: Arc<PodSnapshot>,
    pub finding: PodFinding,
}

/// What one reading of the pods' memory counters found.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemoryFindings {
    pub thrashing: Vec<ThrashingPod>,
    pub container_pressure: Vec<ContainerPressurePod>,
}

/// A pod cgroup found on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodCgroup {
    pub uid: String,
    pub qos: QosClass,
    /// Relative to the hierarchy root.
    pub path: String,
    /// The kernel's cgroup id (the directory's inode number) when listed.
    pub id: u64,
}

pub struct Inventory {
    signals: NodeSignals,
    /// The pod cgroups as last listed; `None` once a pod's cgroup was
    /// created or removed since (a kernel record says so), or when that
    /// cannot be known (records lost, no lifecycle programs).
    listed: Option<Listing>,
    /// The listed pods' memory files, open, by cgroup path: a memory
    /// listing reads each pod's bytes charged with one system call, and an
    /// exact read its working set with two.
    memory_files: HashMap<String, OpenMemory>,
    /// Where a memory listing reads every pod's bytes charged at once, if
    /// the kernel can; a pod it does not cover is read through its file.
    charges_source: Option<Box<dyn ChargesSource>>,
    /// The last such reading, by cgroup id (kept for its allocation).
    charges: HashMap<u64, u64>,
    /// The memory controller's hierarchy id (0 on v2): only its cgroups
    /// can change the listing.
    memory_hierarchy: Option<u32>,
    metadata: Option<Box<dyn PodMetadataSource>>,
    /// Where this process sits in the memory hierarchy, and the uid of its
    /// pod from the downward API, to recognise the pod evictd runs in.
    own_cgroup: Option<String>,
    own_pod_uid: Option<String>,
    /// The container runtime (--container-runtime-endpoint): the pods' disk
    /// usage and where the imagefs and containerfs are.
    runtime: Option<RuntimeLink>,
    /// The runtime's filesystems as last taken into `signals`.
    runtime_filesystems: u64,
    /// Reads each pod's fork rate for PID decisions
    /// (`--pid-ranking fork-rate`).
    fork_rates: Option<ForkClock>,
    /// Each pod's memory stall and refault counters as last read.
    stalls: PodStalls,
    /// Each pod's containers' KEP-5986 signals as last read.
    container_pressures: ContainerPressures,
    /// Where the pods' counters are exported.
    metrics: Option<Arc<Metrics>>,
}

impl Inventory {
    pub fn new(cgroupfs: CgroupFs, args: &InventoryOptions) -> Result<Self, InventoryError> {
        let node = format!("/{}", args.node_cgroup.trim_matches('/'));
        let dir = cgroupfs.memory_dir(&node);
        if !dir.is_dir() {
            return Err(InventoryError::NoNodeCgroup {
                path: args.node_cgroup.clone(),
                dir,
            });
        }
        let metadata = match &args.pod_metadata {
            Some(path) => Some(Box::new(MetadataFile::open(path)?) as Box<dyn PodMetadataSource>),
            None => None,
        };
        Ok(Self {
            listed: None,
            memory_files: HashMap::new(),
            charges_source: None,
            charges: HashMap::new(),
            memory_hierarchy: hierarchy_ids(&cgroupfs).memory,
            own_cgroup: own_memory_cgroup(),
            own_pod_uid: args.pod_uid.clone(),
            signals: NodeSignals {
                cgroupfs,
                node,
                nodefs: args.nodefs_path.clone(),
                imagefs: args.imagefs_path.clone(),
                containerfs: None,
                files: KeptOpen::default(),
                root_band: false,
                cold_cache: args.cold_cache.then(ColdCache::default),
            },
            runtime: None,
            runtime_filesystems: 0,
            metadata,
            fork_rates: None,
            stalls: PodStalls::default(),
            container_pressures: ContainerPressures::default(),
            metrics: None,
        })
    }

    /// Has PID decisions read each pod's fork rate.
    pub(crate) fn measure_fork_rates(&mut self) {
        self.fork_rates = Some(ForkClock::new());
    }

    /// Hands the metrics to the pod metadata source, and exports the pods'
    /// memory counters there.
    pub(crate) fn set_metrics(&mut self, metrics: Arc<Metrics>) {
        if let Some(source) = self.metadata.as_mut() {
            source.set_metrics(Arc::clone(&metrics));
        }
        self.metrics = Some(metrics);
    }

    /// Reads every pod's memory stall and refault counters and exports
    /// them, if [`stalls::STALLS_INTERVAL`] has passed since the last
    /// reading: the timer's work, off any decision's path. A pod whose
    /// files cannot be read or parsed is left out of this reading (its
    /// series with it) and the others are read. Returns the pods found
    /// thrashing at their own memory limit since their last reading, and
    /// those whose containers' pressure calls for a KEP-5986 stage; `None`
    /// when nothing was read.
    pub(crate) fn read_memory_stalls(&mut self) -> Option<MemoryFindings> {
        let now_ns = stalls::monotonic_now_ns();
        if !self.stalls.due(now_ns) {
            return None;
        }
        let started = Instant::now();
        let pods = match self.read_pods(Reads::MemoryBound) {
            Ok(pods) => pods,
            Err(e) => {
                warn!(error = %e, "cannot list the pods to read their memory stalls");
                return None;
            }
        };
        let mut readings = Vec::with_capacity(pods.len());
        for pod in &pods {
            let Some(path) = pod.cgroup.as_deref() else {
                continue;
            };
            match self.memory_stalls(path, now_ns) {
                Ok(stalls) => readings.push((
                    path.to_owned(),
                    [pod.namespace.clone(), pod.name.clone()],
                    stalls,
                )),
                Err(StallsError::Cgroup(CgroupError::Gone(_))) => {}
                Err(e) => warn!(pod = path, error = %e, "cannot read a pod's memory stalls"),
            }
        }
        let read = readings.len();
        let thrashing = self
            .stalls
            .record(readings, now_ns, self.metrics.as_deref());
        let stalls_took = started.elapsed();
        let pod_of = |cgroup: &str| {
            pods.iter()
                .find(|pod| pod.cgroup.as_deref() == Some(cgroup))
                .map(Arc::clone)
        };
        let thrashing = thrashing
            .into_iter()
            .filter_map(|(cgroup, thrashing)| {
                Some(ThrashingPod {
                    pod: pod_of(&cgroup)?,
                    thrashing,
                })
            })
            .collect();
        let cgroupfs = &self.signals.cgroupfs;
        let container_pressure = if self.container_pressures.enabled(cgroupfs.version) {
            let pod_cgroups: Vec<&str> = pods
                .iter()
                .filter_map(|pod| pod.cgroup.as_deref())
                .collect();
            self.container_pressures
                .read(cgroupfs, &pod_cgroups, now_ns)
                .into_iter()
                .filter_map(|finding| {
                    Some(ContainerPressurePod {
                        pod: pod_of(&finding.pod_cgroup)?,
                        finding,
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        // What the reading costs the agent every 10 s, at any pod count;
        // the containers' part only with a KEP-5986 threshold set.
        debug!(
            pods = read,
            took_us = started.elapsed().as_micros() as u64,
            containers_us = (started.elapsed() - stalls_took).as_micros() as u64,
            "pods' memory counters read"
        );
        Some(MemoryFindings {
            thrashing,
            container_pressure,
        })
    }

    /// Judges thrashing by `limits` (`decide::thrashing`).
    pub(crate) fn set_thrashing_limits(&mut self, limits: ThrashingLimits) {
        self.stalls.set_thrashing_limits(limits);
    }

    /// Reads each pod's containers' KEP-5986 signals against `thresholds`
    /// (cgroup v2 only; nothing is read while every threshold is off).
    pub(crate) fn set_memory_high_thresholds(&mut self, thresholds: MemoryHighThresholds) {
        self.container_pressures.set_thresholds(thresholds);
    }

    /// KEP-5986's stage 1 for container cgroup `path`: its memory.high
    /// raised to its memory.max; returns the value written.
    pub(crate) fn relax_memory_high(&self, path: &str) -> Result<String, CgroupError> {
        self.signals.cgroupfs.relax_memory_high(path)
    }

    /// Pod cgroup `path`'s counters now, read as [`Inventory::bytes_charged`],
    /// with the bytes charged, its memory limit and how often it met it:
    /// whether it is at its limit. A limit or a count that cannot be read
    /// judges no thrashing.
    fn memory_stalls(
        &mut self,
        path: &str,
        now_ns: u64,
    ) -> Result<crate::decide::snapshot::MemoryStalls, StallsError> {
        let texts = self
            .read_kept(path, OpenMemory::stall_texts)
            .unwrap_or_else(|| self.signals.cgroupfs.stall_texts(path))?;
        let usage_bytes = self.bytes_charged(path)?;
        let cgroupfs = &self.signals.cgroupfs;
        let mut stalls =
            stalls::parse(&texts, cgroupfs.version, now_ns, &cgroupfs.memory_dir(path))?;
        stalls.usage_bytes = Some(usage_bytes);
        stalls.limit_bytes = memory_limit(cgroupfs, path).ok().flatten();
        stalls.limit_hits = cgroupfs.memory_limit_hits(path).ok();
        Ok(stalls)
    }

    /// Replaces the pod metadata source (the Kubernetes API's pod store,
    /// once it is started).
    pub(crate) fn set_metadata(&mut self, source: Box<dyn PodMetadataSource>) {
        self.metadata = Some(source);
        // Pods built from the last source's answers are built again.
        self.listed = None;
    }

    /// Reads the pods' bytes charged for memory decisions from `source`.
    pub(crate) fn set_charges_source(&mut self, source: Box<dyn ChargesSource>) {
        self.charges_source = Some(source);
    }

    /// Has the node's observation read the machine's working set as the
    /// kernel programs compare it on the memory hierarchy's root, for a
    /// node that is the root (see [`NodeObservation::node_band_value`]).
    pub(crate) fn set_root_band(&mut self, compared: bool) {
        self.signals.root_band = compared;
    }

    /// Takes disk usage and the runtime's filesystems from `link`.
    pub(crate) fn set_runtime(&mut self, link: RuntimeLink) {
        self.runtime = Some(link);
    }

    /// The container runtime's link, if there is one.
    pub(crate) fn runtime(&self) -> Option<&RuntimeLink> {
        self.runtime.as_ref()
    }

    pub(crate) fn cgroupfs(&self) -> &CgroupFs {
        &self.signals.cgroupfs
    }

    /// The node cgroup, relative to the hierarchy root.
    pub(crate) fn node_cgroup(&self) -> &str {
        &self.signals.node
    }

    /// The pods' cgroup if it exists now, and the deepest level below the
    /// hierarchy root a pod's cgroup sits at (`<pods>/<QoS class>/<pod>`).
    pub(crate) fn pods_cgroup_and_depth(&self) -> Option<(String, u32)> {
        let kubepods = self.kubepods_cgroup()?;
        let level = kubepods.split('/').filter(|part| !part.is_empty()).count() as u32;
        Some((kubepods, level + 2))
    }

    /// The pods' cgroup, if it exists now.
    pub(crate) fn kubepods_cgroup(&self) -> Option<String> {
        self.signals.kubepods()
    }

    /// Every signal's input and the engine scopes' readings, read now. The
    /// imagefs and containerfs are where the runtime says, once it has.
    pub(crate) fn observe(&mut self) -> Result<NodeObservation, InventoryError> {
        if let Some(link) = &self.runtime {
            let version = link.filesystems_version();
            if version != self.runtime_filesystems
                && let Some(paths) = link.filesystems()
            {
                self.signals.imagefs = paths.imagefs;
                self.signals.containerfs = Some(paths.containerfs);
                self.runtime_filesystems = version;
            }
        }
        Ok(self.signals.observe()?)
    }

    /// Every pod, with usage read now. A pod removed while it is read is
    /// left out.
    pub(crate) fn pods(&mut self) -> Result<Vec<PodSnapshot>, InventoryError> {
        Ok(self
            .read_pods(Reads::Exact)?
            .into_iter()
            .map(Arc::unwrap_or_clone)
            .collect())
    }

    /// Every pod with what a decision on `resource` ranks it by, read
    /// cheaply: for memory, the bytes charged (one small file per pod), an
    /// upper bound of the working set the ranking compares, which
    /// [`Inventory::refine`] makes exact for the pods a decision turns on;
    /// every other resource's usage is exact.
    ///
    /// For disk, each pod's disk usage comes from the runtime, read at most
    /// `USAGE_MAX_AGE` ago;
    /// while a fresh reading is under way this is
    /// [`InventoryError::DiskUsagePending`], and while the runtime is down
    /// or its reading failed [`InventoryError::DiskUsageUnknown`] (ranking
    /// on no usage would take the lowest-priority pod, whatever it
    /// writes). Without a runtime pods have no disk usage, and rank by
    /// priority and requests.
    pub(crate) fn pods_for(
        &mut self,
        resource: Resource,
    ) -> Result<Vec<Arc<PodSnapshot>>, InventoryError> {
        match resource {
            Resource::Memory => self.read_pods(Reads::MemoryBound),
            Resource::Pids => {
                let pods = self.read_pods(Reads::Exact)?;
                Ok(match self.fork_rates {
                    Some(clock) => self.with_fork_rates(pods, clock),
                    None => pods,
                })
            }
            Resource::EphemeralStorage | Resource::Inodes => {
                let usage = self
                    .runtime
                    .as_ref()
                    .map(|link| link.pod_usage(Instant::now()));
                match usage {
                    Some(DiskUsageAnswer::Pending { wait }) => {
                        return Err(InventoryError::DiskUsagePending { wait });
                    }
                    Some(DiskUsageAnswer::Unavailable) => {
                        return Err(InventoryError::DiskUsageUnknown);
                    }
                    Some(DiskUsageAnswer::Fresh(_)) | None => {}
                }
                let pods = self.read_pods(Reads::Exact)?;
                let Some(DiskUsageAnswer::Fresh(usage)) = usage else {
                    return Ok(pods);
                };
                let mut pods: Vec<PodSnapshot> =
                    pods.into_iter().map(Arc::unwrap_or_clone).collect();
                fill_pods(&usage, &mut pods);
                Ok(pods.into_iter().map(Arc::new).collect())
            }
        }
    }

    /// `pods` with their fork rates read now. A rate that cannot be read
    /// (not a pod gone meanwhile) leaves every pod without one: kubelet's
    /// order for this decision, rather than a pod that hides its forks
    /// ranked as quiet.
    fn with_fork_rates(
        &self,
        mut pods: Vec<Arc<PodSnapshot>>,
        clock: ForkClock,
    ) -> Vec<Arc<PodSnapshot>> {
        let mut rates = Vec::with_capacity(pods.len());
        for pod in &pods {
            let Some(path) = pod.cgroup.as_deref() else {
                rates.push(None);
                continue;
            };
            match clock.rate(&self.signals.cgroupfs, path) {
                Ok(rate) => rates.push(Some(rate)),
                Err(ForkRateError::Cgroup(CgroupError::Gone(_))) => rates.push(None),
                Err(e) => {
                    warn!(pod = path, error = %e,
                        "cannot read a pod's fork rate: PID pressure ranks this decision in kubelet's order");
                    return pods;
                }
            }
        }
        for (pod, rate) in pods.iter_mut().zip(rates) {
            Arc::make_mut(pod).usage.forks_per_second = rate;
        }
        pods
    }

    /// `pod` with its working set read exactly now; `None` once it is gone
    /// or no process runs in it (a killed pod's cgroup may linger, holding
    /// page cache). Its other usage is left as listed.
    pub(crate) fn refine(
        &mut self,
        pod: &PodSnapshot,
    ) -> Result<Option<PodSnapshot>, InventoryError> {
        let Some(path) = pod.cgroup.as_deref() else {
            return Ok(Some(pod.clone()));
        };
        let read = self.working_set(path).and_then(|working_set| {
            let running = self.signals.cgroupfs.has_processes(path)?;
            Ok(running.then_some(working_set))
        });
        match read {
            Ok(Some(working_set)) => {
                let mut pod = pod.clone();
                pod.usage.memory_working_set_bytes = working_set;
                Ok(Some(pod))
            }
            Ok(None) | Err(CgroupError::Gone(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Node-level reclaim through the runtime before a disk decision for
    /// `signal` (`RuntimeLink::reclaim`). A pod whose cgroup kubelet still
    /// keeps is alive for kubelet's container GC, its sandbox up or not.
    pub(crate) fn reclaim(&mut self, signal: Signal, dry_run: bool) -> NodeReclaim {
        let Some(link) = self.runtime.clone() else {
            return NodeReclaim::Unavailable;
        };
        link.reclaim(signal, dry_run, Instant::now(), || {
            match self.read_pods(Reads::MemoryBound) {
                Ok(pods) => pods.iter().map(|pod| pod.uid.clone()).collect(),
                Err(e) => {
                    warn!(error = %e, "cannot list the pods alive: only the runtime says which keep their dead containers");
                    BTreeSet::new()
                }
            }
        })
    }

    /// The running pods over a local-storage limit
    /// ([`local_storage::violations`]). Only pods that set a limit are
    /// looked at, and only when one does is the runtime asked for the
    /// pods' disk usage (a reading serves
    /// `USAGE_MAX_AGE`): while
    /// it is being read this is [`InventoryError::DiskUsagePending`], and
    /// while the runtime is down [`InventoryError::DiskUsageUnknown`].
    /// Without a runtime, none.
    pub(crate) fn local_storage_violations(
        &mut self,
        dedicated_imagefs: bool,
    ) -> Result<Vec<LocalStorageEviction>, InventoryError> {
        if self.runtime.is_none() {
            return Ok(Vec::new());
        }
        let limited: Vec<Arc<PodSnapshot>> = self
            .read_pods(Reads::MemoryBound)?
            .into_iter()
            .filter(|pod| local_storage::has_limit(pod))
            .collect();
        let mut running = Vec::with_capacity(limited.len());
        for pod in &limited {
            // A killed pod's volumes stay until kubelet cleans it up: only
            // a pod with processes is judged again.
            if let Some(pod) = self.refine(pod)? {
                running.push(pod);
            }
        }
        if running.is_empty() {
            return Ok(Vec::new());
        }
        match self
            .runtime
            .as_ref()
            .map(|link| link.pod_usage(Instant::now()))
        {
            Some(DiskUsageAnswer::Fresh(usage)) => Ok(local_storage::violations(
                running,
                &usage,
                dedicated_imagefs,
            )),
            Some(DiskUsageAnswer::Pending { wait }) => {
                Err(InventoryError::DiskUsagePending { wait })
            }
            Some(DiskUsageAnswer::Unavailable) | None => Err(InventoryError::DiskUsageUnknown),
        }
    }

    /// Cgroups may have been created or removed: the pods are listed again
    /// before the next decision.
    pub(crate) fn cgroups_changed(&mut self) {
        self.listed = None;
    }

    /// The cgroup `path` of hierarchy `hierarchy_id` was created or removed
    /// (a kernel record): the pods are listed again before the next
    /// decision, unless it cannot change the listing: a cgroup of another
    /// hierarchy (v1 makes one per controller), or a container's inside a
    /// listed pod. Containers come and go far more often than pods, and a
    /// listing would then be redone at the next decision.
    pub(crate) fn cgroup_changed(&mut self, hierarchy_id: u32, path: &str) {
        if self.memory_hierarchy != Some(hierarchy_id) {
            return;
        }
        let Some(listed) = &self.listed else {
            return;
        };
        let path = format!("/{}", path.trim_matches('/'));
        let inside_a_pod = listed.cgroups.iter().any(|pod| {
            path.strip_prefix(&pod.path)
                .is_some_and(|rest| rest.starts_with('/'))
        });
        if !inside_a_pod {
            self.listed = None;
        }
    }

    fn read_pods(&mut self, reads: Reads) -> Result<Vec<Arc<PodSnapshot>>, InventoryError> {
        // Read before the lookups: a change made during them is then seen
        // by the next listing, which builds those pods again.
        let generation = self.metadata.as_mut().map(|source| {
            source.refresh();
            source.generation()
        });
        let mut listing = match self.listed.take() {
            Some(listing) if listing.generation == generation => listing,
            Some(listing) => Listing {
                built: vec![None; listing.cgroups.len()],
                generation,
                ..listing
            },
            None => {
                let cgroups = match self.kubepods_cgroup() {
                    Some(kubepods) => {
                        find_pods(&self.signals.cgroupfs.memory_dir(&kubepods), &kubepods)?
                    }
                    None => Vec::new(),
                };
                self.keep_memory_files_of(&cgroups, kept_files_budget());
                Listing {
                    built: vec![None; cgroups.len()],
                    cgroups,
                    generation,
                }
            }
        };
        let charges = match reads {
            Reads::MemoryBound => self.read_charges(),
            Reads::Exact => None,
        };
        let mut pods = Vec::with_capacity(listing.cgroups.len());
        let mut gone = false;
        for (cgroup, built) in listing.cgroups.iter().zip(&mut listing.built) {
            let charged = charges
                .as_ref()
                .and_then(|charges| charges.get(&cgroup.id).copied());
            let usage = match self.usage(&cgroup.path, reads, charged) {
                Ok(usage) => usage,
                Err(CgroupError::Gone(_)) => {
                    debug!(pod = cgroup.path, "pod cgroup vanished while being read");
                    gone = true;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let pod = match built.take() {
                // In place unless the last decision still holds the pod.
                Some(mut pod) => {
                    Arc::make_mut(&mut pod).usage = usage;
                    pod
                }
                None => Arc::new(self.pod(cgroup, usage)?),
            };
            // Nothing defaulted: built from the metadata source's answer.
            if pod.unknown.is_empty() {
                *built = Some(Arc::clone(&pod));
            }
            pods.push(pod);
        }
        if let Some(charges) = charges {
            self.charges = charges;
        }
        if !gone {
            self.listed = Some(listing);
        }
        Ok(pods)
    }

    /// Every memory cgroup's bytes charged from the charges source, if
    /// there is one. One that fails is not asked again: each pod's file
    /// still answers.
    fn read_charges(&mut self) -> Option<HashMap<u64, u64>> {
        let source = self.charges_source.as_mut()?;
        let mut charges = std::mem::take(&mut self.charges);
        match source.read(&mut charges) {
            Ok(()) => Some(charges),
            Err(e) => {
                warn!(error = %e, "reading every pod's memory at once failed: each pod's file is read from now on");
                self.charges_source = None;
                None
            }
        }
    }

    pub fn snapshot(&mut self, time: f64) -> Result<Snapshot, InventoryError> {
        // A snapshot shows the counters, not who thrashes.
        self.read_memory_stalls();
        Ok(Snapshot {
            time,
            node: self.observe()?.stats,
            pods: self.pods()?,
        })
    }

    /// The pod in `cgroup`, from what the metadata source says of it, with
    /// `usage`.
    fn pod(&mut self, cgroup: &PodCgroup, usage: PodUsage) -> Result<PodSnapshot, InventoryError> {
        let known = match self.metadata.as_mut() {
            Some(source) => source.lookup(&cgroup.uid)?,
            None => None,
        };
        // With a private cgroup namespace (v2) /proc/self/cgroup reads
        // `0::/`, which names no pod: the downward API's uid still does.
        let hosts_evictd = self.own_pod_uid.as_deref() == Some(cgroup.uid.as_str())
            || self.own_cgroup.as_deref().is_some_and(|own| {
                own == cgroup.path || own.starts_with(&format!("{}/", cgroup.path))
            });
        let guaranteed_shape = match known {
            Some(_) => None,
            None => self.guaranteed_shape(cgroup),
        };
        let pod = match known {
            Some(pod) => PodSnapshot {
                uid: cgroup.uid.clone(),
                usage,
                cgroup: Some(cgroup.path.clone()),
                cgroup_qos: Some(cgroup.qos),
                unknown: Vec::new(),
                hosts_evictd,
                ..pod
            },
            None => PodSnapshot {
                namespace: String::new(),
                name: format!("pod{}", cgroup.uid),
                is_static: is_static_pod_uid(&cgroup.uid),
                unknown: UNKNOWN_WITHOUT_METADATA
                    .iter()
                    .filter(|field| !(**field == "static" && is_static_pod_uid(&cgroup.uid)))
                    .map(|field| (*field).to_owned())
                    .collect(),
                uid: cgroup.uid.clone(),
                priority: 0,
                mirror: false,
                containers: Vec::new(),
                init_containers: Vec::new(),
                overhead: Default::default(),
                resources: guaranteed_shape,
                empty_dirs: Vec::new(),
                termination_grace_period_seconds: None,
                usage,
                cgroup: Some(cgroup.path.clone()),
                cgroup_qos: Some(cgroup.qos),
                hosts_evictd,
            },
        };
        Ok(pod)
    }

    /// A pod without metadata in kubelet's Guaranteed cgroup has requests
    /// equal to its limits: its cgroup's memory limit is its memory
    /// request, so it ranks as Guaranteed within its request rather than as
    /// a pod that requests nothing. `None` for any other pod, or when the
    /// limit cannot be read.
    fn guaranteed_shape(&self, cgroup: &PodCgroup) -> Option<Resources> {
        if cgroup.qos != QosClass::Guaranteed {
            return None;
        }
        let limit = match memory_limit(&self.signals.cgroupfs, &cgroup.path) {
            Ok(Some(limit)) => i64::try_from(limit).ok()?,
            Ok(None) => return None,
            Err(e) => {
                debug!(pod = cgroup.path, error = %e, "no memory limit for a pod without metadata");
                return None;
            }
        };
        let memory = ResourceList::from([("memory".to_owned(), Quantity::from_units(limit, true))]);
        Some(Resources {
            requests: memory.clone(),
            limits: memory,
        })
    }

    /// Pod cgroup `path`'s usage; for `Reads::MemoryBound`, `charged` when
    /// the charges source had it.
    fn usage(
        &mut self,
        path: &str,
        reads: Reads,
        charged: Option<u64>,
    ) -> Result<PodUsage, CgroupError> {
        if reads == Reads::MemoryBound {
            let charged = match charged {
                Some(bytes) => bytes,
                // Not walked: made since the source was attached, or gone
                // (which its file says).
                None => self.bytes_charged(path)?,
            };
            // The process count, and so whether it runs, is read by `refine`.
            return Ok(PodUsage {
                memory_working_set_bytes: charged,
                ..PodUsage::default()
            });
        }
        Ok(PodUsage {
            memory_working_set_bytes: self.working_set(path)?,
            pids: self.signals.cgroupfs.count_processes(path)?,
            // A lookup beside the reads above; memory decisions' listings
            // (bytes charged only) go without.
            memory_stalls: self.stalls.get(path),
            ..PodUsage::default()
        })
    }

    /// Keeps the listed pods' memory files open, and only theirs, so a
    /// memory decision reads each with one system call (opening them is
    /// the cost a listing pays, off the decision when it can be: at
    /// startup, or when a pod came or went). At most `budget` files are
    /// kept ([`kept_files_budget`]), so that a kill always has descriptors
    /// left.
    fn keep_memory_files_of(&mut self, listed: &[PodCgroup], budget: usize) {
        let paths: HashSet<&str> = listed.iter().map(|pod| pod.path.as_str()).collect();
        self.memory_files
            .retain(|path, _| paths.contains(path.as_str()));
        for pod in listed {
            if self.memory_files.len() * OpenMemory::FILES >= budget {
                debug!(
                    kept = self.memory_files.len(),
                    "no descriptors left to keep more pods' memory files open: the rest are read by path"
                );
                break;
            }
            if self.memory_files.contains_key(&pod.path) {
                continue;
            }
            // A pod gone meanwhile: read by path.
            if let Ok(Some(open)) = self.signals.cgroupfs.open_memory(&pod.path) {
                self.memory_files.insert(pod.path.clone(), open);
            }
        }
    }

    /// Pod cgroup `path`'s kept files, dropped once its cgroup is gone:
    /// removed, or removed and made again under the same path (the record
    /// of either lists the pods again, which opens the new one).
    fn read_kept<T>(
        &mut self,
        path: &str,
        read: impl Fn(&OpenMemory) -> Result<T, CgroupError>,
    ) -> Option<Result<T, CgroupError>> {
        match read(self.memory_files.get(path)?) {
            Err(CgroupError::Gone(_)) => {
                self.memory_files.remove(path);
                None
            }
            result => Some(result),
        }
    }

    /// The bytes charged to pod cgroup `path`: through its files kept
    /// open, or by path where the listing could not open them.
    fn bytes_charged(&mut self, path: &str) -> Result<u64, CgroupError> {
        self.read_kept(path, OpenMemory::charged)
            .unwrap_or_else(|| self.signals.cgroupfs.read_memory_usage(path))
    }

    /// Pod cgroup `path`'s working set, read as [`Inventory::bytes_charged`];
    /// less its active file pages too while `--memory-signal reclaimable`
    /// counts the node's as available ([`ColdCache::counted`]).
    fn working_set(&mut self, path: &str) -> Result<u64, CgroupError> {
        let working_set = self
            .read_kept(path, OpenMemory::read)
            .unwrap_or_else(|| self.signals.cgroupfs.read_memory(path))?
            .working_set_bytes();
        match &self.signals.cold_cache {
            Some(cold_cache) if cold_cache.counted() => {
                let cache = self.signals.cgroupfs.read_file_cache(None, path)?;
                Ok(working_set.saturating_sub(cache.active_file_bytes))
            }
            _ => Ok(working_set),
        }
    }
}

/// Lets the agent open as many files as the hard limit allows, at its
/// start: the pods' files the inventory keeps open take the soft limit
/// less [`FILES_LEFT_TO_THE_REST`], and a kill opens pidfds in batches
/// (`act::kill`'s `SIGNAL_BATCH`); the soft limit a runtime sets (1,024
/// under containerd 2.x) would leave the pods none.
pub(crate) fn raise_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => info!(
                from = soft,
                to = hard,
                "open-file limit raised to its hard limit"
            ),
            Err(e) => warn!(error = %e, soft, hard, "cannot raise the open-file limit"),
        },
        Ok(_) => {}
        Err(e) => warn!(error = %e, "cannot read the open-file limit"),
    }
}

/// Open files the inventory leaves to the rest of the agent: a kill's
/// pidfds above all (`act::kill` checks that its batches fit).
pub(crate) const FILES_LEFT_TO_THE_REST: u64 = 1024;

/// How many files the inventory may keep open for pods: the open-file
/// limit less [`FILES_LEFT_TO_THE_REST`]; none when the limit cannot be
/// read.
fn kept_files_budget() -> usize {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map_or(
        0,
        |(soft, _)| {
            usize::try_from(soft.saturating_sub(FILES_LEFT_TO_THE_REST)).unwrap_or(usize::MAX)
        },
    )
}

/// How much of a pod's usage a listing reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reads {
    /// The working set, and the process count.
    Exact,
    /// Only the bytes charged: an upper bound of the working set.
    MemoryBound,
}

/// Fields a pod found only in cgroups carries as defaults, not knowledge.
/// Its requests count as zero in rankings, as for a pod that has none,
/// unless its cgroup is Guaranteed-shaped (`guaranteed_shape`).
const UNKNOWN_WITHOUT_METADATA: [&str; 7] = [
    "namespace",
    "name",
    "priority",
    "static",
    "mirror",
    "containers",
    "termination_grace_period_seconds",
];

/// kubelet names a static pod (from a manifest file, never evicted) with
/// the md5 of its source as uid: 32 hex digits, where API pods have a
/// dashed UUID. A pod without metadata shaped so is protected as static.
fn is_static_pod_uid(uid: &str) -> bool {
    uid.len() == 32 && uid.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Pod cgroups under the pods' cgroup `dir` (whose path is `kubepods`).
fn find_pods(dir: &Path, kubepods: &str) -> Result<Vec<PodCgroup>, InventoryError> {
    let mut pods = Vec::new();
    for (name, id) in subdirectories(dir)? {
        if let Some(uid) = pod_uid(&name) {
            pods.push(PodCgroup {
                uid,
                qos: QosClass::Guaranteed,
                path: child_path(kubepods, &name),
                id,
            });
            continue;
        }
        let Some(qos) = qos_directory(&name) else {
            continue;
        };
        let qos_path = child_path(kubepods, &name);
        for (pod_name, id) in subdirectories(&dir.join(&name))? {
            if let Some(uid) = pod_uid(&pod_name) {
                pods.push(PodCgroup {
                    uid,
                    qos,
                    path: child_path(&qos_path, &pod_name),
                    id,
                });
            }
        }
    }
    pods.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(pods)
}

/// The names of `dir`'s subdirectories, with their inode numbers (a
/// cgroup's id).
fn subdirectories(dir: &Path) -> Result<Vec<(String, u64)>, InventoryError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if is_gone(&e) => return Ok(Vec::new()),
        Err(source) => {
            return Err(InventoryError::List {
                path: dir.to_owned(),
                source,
            });
        }
    };
    Ok(entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| Some((entry.file_name().into_string().ok()?, entry.ino())))
        .collect())
}

/// The QoS class a directory directly under kubepods stands for.
fn qos_directory(name: &str) -> Option<QosClass> {
    match name {
        "burstable" | "kubepods-burstable.slice" => Some(QosClass::Burstable),
        "besteffort" | "kubepods-besteffort.slice" => Some(QosClass::BestEffort),
        _ => None,
    }
}

/// The uid in a pod cgroup's name, dashes restored for the systemd driver.
fn pod_uid(name: &str) -> Option<String> {
    if let Some(uid) = name.strip_prefix("pod") {
        return (!uid.is_empty() && !uid.contains('.')).then(|| uid.to_owned());
    }
    let stem = name.strip_prefix("kubepods-")?.strip_suffix(".slice")?;
    let uid = ["burstable-pod", "besteffort-pod", "pod"]
        .into_iter()
        .find_map(|prefix| stem.strip_prefix(prefix))?;
    (!uid.is_empty()).then(|| uid.replace('_', "-"))
}

/// This process's memory cgroup from /proc/self/cgroup (the v1 memory line,
/// or the v2 line).
fn own_memory_cgroup() -> Option<String> {
    let text = match fs::read_to_string("/proc/self/cgroup") {
        Ok(text) => text,
        Err(e) => {
            warn!(error = %e, "cannot read /proc/self/cgroup; cannot tell which pod hosts evictd");
            return None;
        }
    };
    parse_own_cgroup(&text)
}

fn parse_own_cgroup(text: &str) -> Option<String> {
    let mut unified = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            return Some(path.to_owned());
        }
        if controllers.is_empty() {
            unified = Some(path.to_owned());
        }
    }
    unified
}

#[cfg(test)]
mod tests;
