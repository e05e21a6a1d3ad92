//! Command line. Every default is written once, here, with where it comes
//! from.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{
    act::evictor::EvictionBudget,
    act::pre_kill::{HookTarget, PreKillHook},
    decide::engine::VictimPolicy,
    decide::rank::PidRanking,
    decide::{memory_high::MemoryHighThresholds, thrashing::ThrashingLimits},
    duration,
    kernel::triggers::Mode,
    node::inventory::InventoryOptions,
    node::runtime::reclaim::images::DEFAULT_MINIMUM_AGE,
    quantity::Quantity,
    report::kubernetes::{EvictionAction, KubernetesOptions},
    scopes::spec::WatchSpec,
};

mod kubelet;

pub use kubelet::{ConfigError, ConfigWarning, EvictionArgs};

/// What `--mode event` uses on the kernels evictd is tested on
/// (`triggers::choose`; docs/kernels.md has the measurements behind it).
const TRIGGERS_BY_KERNEL: &str = "\
Triggers in --mode event, chosen at startup from what the kernel offers (logged,
and exported as evictd_trigger_info and evictd_trigger_hook_info):
  kernel                    memory             pids               OOM kills       new cgroups
  6.18 (memcg tracepoints)  bpf lru-insertion  bpf task-lifetime  bpf oom-victim  bpf cgroup-lifecycle
  6.1 (Debian, cgroup v2)   bpf page-alloc     bpf task-lifetime  bpf oom-victim  bpf cgroup-lifecycle
  6.12 (Debian, cgroup v2)  bpf page-alloc     bpf task-lifetime  bpf oom-victim  bpf cgroup-lifecycle
  7.2 (Debian, cgroup v2)   bpf lru-insertion  bpf task-lifetime  bpf oom-victim  bpf cgroup-lifecycle
  no BTF, or no privilege   poll               poll               none            poll
lru-insertion runs on charges only; with --watch-memory (whose falls are reported
as they happen) 6.18 and 7.2 take bpf memcg-stat instead, which also runs on every free.
Polling re-reads cgroupfs every --resync-interval and is logged as a warning.";

#[derive(Debug, Parser)]
#[command(
    name = "evictd",
    version,
    about = "Kubernetes node agent: detects memory and PID pressure in the kernel with eBPF",
    after_help = TRIGGERS_BY_KERNEL,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `evictd` alone is `evictd run`.
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent (the default).
    Run(Box<RunArgs>),
    /// Print the eviction thresholds the flags and --config give, as JSON.
    Thresholds(EvictionArgs),
    /// Decide on recorded node snapshots what evictd would do; touches
    /// nothing.
    Simulate(SimulateArgs),
    /// Print the live node (signals and pods) as a snapshot `simulate` reads.
    Snapshot(InventoryArgs),
    /// Print the agent's last decisions for a person, from its decision
    /// record in --state-dir.
    Explain(ExplainArgs),
    /// Print the seccomp profile the agent runs under, or install it where
    /// kubelet finds Localhost profiles (the DaemonSet's init container).
    SeccompProfile(SeccompProfileArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The agent's --state-dir.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/evictd")]
    pub state_dir: PathBuf,
    /// How many of the last decisions, newest last.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub last: usize,
}

#[derive(Debug, Clone, Args)]
pub struct SeccompProfileArgs {
    /// Write it as DIR/evictd.json (atomically; DIR is created if missing)
    /// instead of printing it. kubelet's directory is /var/lib/kubelet/seccomp.
    #[arg(long, value_name = "DIR")]
    pub install: Option<PathBuf>,
}

/// Where the node and its pods are found.
#[derive(Debug, Clone, Args)]
pub struct InventoryArgs {
    /// The cgroup that stands for the node, relative to the hierarchy root
    /// and resolved in every mounted hierarchy: its memory limit is the
    /// node's capacity and pods are found under PATH/kubepods (cgroupfs
    /// driver) or PATH/kubepods.slice (systemd driver). `/` is the machine.
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub node_cgroup: String,

    /// JSON list of pods in the snapshot schema (namespace, name, uid,
    /// priority, static, mirror, containers with requests and limits),
    /// matched to cgroups by uid.
    #[arg(long, value_name = "FILE")]
    pub pod_metadata: Option<PathBuf>,

    /// The uid of the pod evictd runs in (the DaemonSet sets it from the
    /// downward API), which is never a victim. evictd also finds its pod
    /// from /proc/self/cgroup, which a private cgroup namespace hides.
    #[arg(long, env = "POD_UID", value_name = "UID")]
    pub pod_uid: Option<String>,

    /// Filesystem kubelet's nodefs signals measure (statvfs). kubelet's
    /// root directory by default.
    #[arg(long, value_name = "PATH", default_value = "/var/lib/kubelet")]
    pub nodefs_path: PathBuf,

    /// Filesystem the imagefs signals measure: the container runtime's
    /// image store. containerd's by default.
    #[arg(long, value_name = "PATH", default_value = "/var/lib/containerd")]
    pub imagefs_path: PathBuf,

    /// The container runtime's CRI socket (kubelet's flag:
    /// `unix:///run/containerd/containerd.sock`, or an absolute path),
    /// connected to at startup on a thread of its own. With it the imagefs
    /// and containerfs signals measure the filesystems the runtime names
    /// (ImageFsInfo; they replace --imagefs-path), and disk decisions rank
    /// pods by the disk they use (writable layers, logs, local volumes under
    /// --nodefs-path/pods), read only for a disk decision and kept 10 s;
    /// before evicting for disk, dead containers and unused images are
    /// removed through CRI and the node looked at again (kubelet's node
    /// reclaim; --dry-run only logs them); `snapshot` fills the pods' disk
    /// fields. A runtime that cannot be
    /// reached is a warning (counted in
    /// evictd_container_runtime_errors_total): memory and PIDs are
    /// protected as without it, disk evictions are held until it answers
    /// (ranked on no disk usage, the lowest-priority pod would go whatever
    /// it writes), and evictd connects again. Without it, no CRI.
    #[arg(long, value_name = "ENDPOINT", value_parser = parse_runtime_endpoint)]
    pub container_runtime_endpoint: Option<String>,

    /// What memory.available leaves out of the node's working set:
    /// `kubelet`, its inactive file pages (kubelet's signal); or
    /// `reclaimable`, also its active file pages while the node's file
    /// refaults over the last 10 s stay at or below 10 % of them (cache the
    /// kernel would reclaim without reading it back). Nothing more is
    /// counted until 10 s of readings are in; allocatableMemory.available
    /// stays kubelet's. While they count, a pod's rank for a memory
    /// eviction leaves out its own active file pages too.
    #[arg(long, value_enum, value_name = "SIGNAL", default_value = "kubelet")]
    pub memory_signal: MemorySignal,
}

impl InventoryArgs {
    /// What the node's inventory takes from these flags.
    pub fn options(&self) -> InventoryOptions {
        InventoryOptions {
            node_cgroup: self.node_cgroup.clone(),
            pod_metadata: self.pod_metadata.clone(),
            pod_uid: self.pod_uid.clone(),
            nodefs_path: self.nodefs_path.clone(),
            imagefs_path: self.imagefs_path.clone(),
            cold_cache: self.memory_signal == MemorySignal::Reclaimable,
        }
    }
}

/// `--memory-signal`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum MemorySignal {
    #[default]
    Kubelet,
    Reclaimable,
}

/// An endpoint naming a unix socket, kept as written (logs quote it).
fn parse_runtime_endpoint(text: &str) -> Result<String, String> {
    crate::node::runtime::socket_path(text)
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// A snapshot (JSON object) or a timeline (JSON array of snapshots).
    #[arg(long, value_name = "FILE")]
    pub snapshot: PathBuf,

    #[command(flatten)]
    pub eviction: EvictionArgs,

    #[command(flatten)]
    pub policy: PolicyArgs,
}

#[derive(Debug, Clone, Copy, Default, Args)]
pub struct PolicyArgs {
    /// Evict, in one decision, the smallest set of pods whose usage covers
    /// the deficit to threshold + minimum reclaim, instead of kubelet's one
    /// pod per round.
    #[arg(long)]
    pub evict_set: bool,
    /// How PID pressure ranks pods of equal priority: `kubelet` (process
    /// count, kubelet's rankPIDPressure) or `fork-rate` (the pod's recent
    /// fork rate first, then process count).
    #[arg(long, value_name = "RANKING", default_value_t = PidRanking::Kubelet)]
    pub pid_ranking: PidRanking,
}

impl From<PolicyArgs> for VictimPolicy {
    fn from(args: PolicyArgs) -> Self {
        if args.evict_set {
            VictimPolicy::CoveringSet
        } else {
            VictimPolicy::One
        }
    }
}

/// `--mode`: [`Mode`] as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Kernel programs push threshold crossings; cgroupfs is re-read every
    /// --resync-interval to repair anything lost.
    Event,
    /// No eBPF: read cgroupfs every --housekeeping-interval, as kubelet does.
    Poll,
    /// No eBPF: a PSI trigger (--psi-stall in --psi-window, as Android's
    /// lmkd) wakes the engine, plus polling every --housekeeping-interval.
    Psi,
    /// No eBPF: cgroup v1 usage thresholds on an eventfd wake the engine
    /// (kubelet's --kernel-memcg-notification), plus polling every
    /// --housekeeping-interval. Needs cgroup v1; elsewhere memory is polled.
    MemcgThreshold,
}

impl From<ModeArg> for Mode {
    fn from(arg: ModeArg) -> Self {
        match arg {
            ModeArg::Event => Self::Event,
            ModeArg::Poll => Self::Poll,
            ModeArg::Psi => Self::Psi,
            ModeArg::MemcgThreshold => Self::MemcgThreshold,
        }
    }
}

/// The Kubernetes API: where pod metadata comes from and how evictions are
/// made final and visible.
#[derive(Debug, Clone, Args)]
pub struct KubernetesArgs {
    /// This node's name. Turns the Kubernetes API on: pods bound to NAME are
    /// watched (priority, requests, static/mirror, matched to cgroups by
    /// uid) and every eviction is reported. The DaemonSet sets it from the
    /// downward API.
    #[arg(
        long,
        env = "NODE_NAME",
        value_name = "NAME",
        conflicts_with = "pod_metadata"
    )]
    pub node_name: Option<String>,

    /// kubeconfig for the API server. Without it: the pod's service account
    /// in a cluster, else $KUBECONFIG or ~/.kube/config.
    #[arg(long, value_name = "FILE", requires = "node_name")]
    pub kubeconfig: Option<PathBuf>,

    /// What makes a kill final in the API, so that the pod is not restarted
    /// in place: `status` (kubelet's way), `delete`, or `evict` (policy/v1
    /// Eviction for soft evictions, honouring PodDisruptionBudgets; hard
    /// ones as `status`).
    #[arg(long, value_enum, default_value_t = EvictionActionArg::Status)]
    pub eviction_action: EvictionActionArg,

    /// Longest wait for one API request (a report is retried, with
    /// backoff, until the API takes it).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_period)]
    pub api_timeout: Duration,
}

impl KubernetesArgs {
    /// What the API side takes from these flags.
    pub(crate) fn options(&self) -> KubernetesOptions {
        KubernetesOptions {
            kubeconfig: self.kubeconfig.clone(),
            eviction_action: self.eviction_action.into(),
            api_timeout: self.api_timeout,
        }
    }
}

/// When the precise memory hooks are attached (`--precise-hooks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PreciseHooksArg {
    /// Near a memory threshold only (docs/design.md, "Pay per pressure").
    Zone,
    /// Always: every page charged or freed on the node runs them.
    Always,
}

/// `--eviction-action`: [`EvictionAction`] as the command line spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EvictionActionArg {
    /// Pod status phase Failed, reason Evicted, a DisruptionTarget
    /// condition, kubelet's message (kubelet's own way).
    Status,
    /// Delete the pod (its controller replaces it).
    Delete,
    /// Soft evictions through the policy/v1 Eviction API (a
    /// PodDisruptionBudget can refuse; no local kill then); hard evictions
    /// are killed locally and reported as `status`.
    Evict,
}

impl From<EvictionActionArg> for EvictionAction {
    fn from(arg: EvictionActionArg) -> Self {
        match arg {
            EvictionActionArg::Status => Self::Status,
            EvictionActionArg::Delete => Self::Delete,
            EvictionActionArg::Evict => Self::Evict,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// How pressure is detected.
    #[arg(long, value_enum, default_value_t = ModeArg::Event)]
    pub mode: ModeArg,

    /// Watch memory usage (bytes charged) of cgroup PATH against up to four
    /// thresholds, Kubernetes quantities. PATH is relative to the hierarchy
    /// root; a `*` segment matches every cgroup at that level, present and
    /// future. Repeatable. Example: --watch-memory /kubepods=6Gi,7Gi
    #[arg(long = "watch-memory", value_name = "PATH=BYTES[,BYTES...]", value_parser = WatchSpec::memory)]
    pub watch_memory: Vec<WatchSpec>,

    /// Watch the task count of cgroup PATH (pids controller). Repeatable.
    #[arg(long = "watch-pids", value_name = "PATH=TASKS[,TASKS...]", value_parser = WatchSpec::pids)]
    pub watch_pids: Vec<WatchSpec>,

    /// Watch the number of tasks on the whole node (what kubelet's
    /// pid.available subtracts from the pid limit).
    #[arg(long = "watch-node-pids", value_name = "TASKS[,TASKS...]", value_parser = WatchSpec::node_pids)]
    pub watch_node_pids: Option<WatchSpec>,

    /// A memory scope leaves a threshold only once this far below it (at
    /// most half the threshold), so a value hovering at the line reports one
    /// crossing, not a stream. 16Mi: well above the page-cache jitter of an
    /// idle node.
    #[arg(long, value_name = "BYTES", default_value = "16Mi", value_parser = parse_bytes)]
    pub memory_hysteresis: u64,

    /// Same for PID scopes, in tasks.
    #[arg(long, value_name = "TASKS", default_value_t = 8)]
    pub pids_hysteresis: u64,

    /// Memory charged or freed on a CPU between two page-counter reads by the
    /// kernel program, far from a line; 256Ki costs one read per 64 pages
    /// of churn. Within a few charge batches of a line each CPU reads after
    /// its share of the distance left, and within one batch at every
    /// charge. With `lru-insertion` a charge is seen when its page joins an
    /// LRU list, which a per-CPU batch of up to 31 pages can hold back.
    #[arg(long, value_name = "BYTES", default_value = "256Ki", value_parser = parse_bytes)]
    pub memory_check_step: u64,

    /// In event mode, when the precise memory hooks (which run on every page
    /// charged and freed on the node) are attached: `zone` only near a
    /// memory threshold, with a rare trigger standing in farther away, and
    /// none while a victim's memory is returned where they run on frees;
    /// `always` from start to stop. The PID hooks (every fork and exit)
    /// alike: `zone` only near a `pid.available` line, the engine reading
    /// the node's tasks farther away; `always` whenever a PID line is set.
    #[arg(long, value_name = "WHEN", default_value = "zone")]
    pub precise_hooks: PreciseHooksArg,

    /// In event mode, how often every scope is re-read from cgroupfs to
    /// repair a lost record; also the polling period of a resource the kernel
    /// cannot watch (e.g. no memcg tracepoints).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_period)]
    pub resync_interval: Duration,

    /// In --mode psi: how long tasks must stall on memory within
    /// --psi-window before the kernel wakes the engine (lmkd: 70ms).
    #[arg(long, value_name = "DURATION", default_value = "70ms", value_parser = parse_period)]
    pub psi_stall: Duration,

    /// In --mode psi: the PSI trigger's window, 500ms to 10s. lmkd uses 1s,
    /// which needs CAP_SYS_RESOURCE; without it the kernel takes only
    /// multiples of 2s, hence this default.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_period)]
    pub psi_window: Duration,

    /// The real-time (SCHED_FIFO) priority of the thread that reads the
    /// kernel's records, decides and kills, as Android's lmkd runs: a busy
    /// node's workloads do not delay a decision, from protection armed on
    /// (the start runs normally). Threads it starts run normally. 0: a
    /// normal thread. Needs CAP_SYS_NICE; without it the agent warns and
    /// runs normally.
    #[arg(long, value_name = "PRIORITY", default_value_t = 1,
        value_parser = clap::value_parser!(u8).range(0..=99))]
    pub realtime_priority: u8,

    /// Polling period in --mode poll, psi and memcg-threshold. 10s is
    /// kubelet's housekeeping interval.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_period)]
    pub housekeeping_interval: Duration,

    /// Address of the Prometheus endpoint (/metrics, /healthz). Loopback by
    /// default; a DaemonSet sets 0.0.0.0:9808.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9808")]
    pub metrics_address: SocketAddr,

    /// Address of the probe endpoint (/healthz, /readyz only), for
    /// kubelet's liveness and readiness probes: slots of its own, which no
    /// client of /metrics can take. Loopback by default; a DaemonSet sets
    /// 0.0.0.0:9809.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9809")]
    pub health_address: SocketAddr,

    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Forward the eBPF programs' own debug log (aya-log) to the agent log.
    #[arg(long)]
    pub bpf_log: bool,

    #[command(flatten)]
    pub eviction: EvictionArgs,

    #[command(flatten)]
    pub inventory: InventoryArgs,

    #[command(flatten)]
    pub policy: PolicyArgs,

    #[command(flatten)]
    pub kubernetes: KubernetesArgs,

    /// Shadow mode: decide and log every eviction, kill nothing and write
    /// nothing to the Kubernetes API (the pod watch still reads).
    #[arg(long)]
    pub dry_run: bool,

    /// kubelet's flag (`imageMinimumGCAge` in --config, which this
    /// overrides): node reclaim (with --container-runtime-endpoint) leaves an
    /// unused image alone until it was first seen this long ago, so an
    /// image pulled for a container not yet created stays. When each image
    /// was first seen is kept in --state-dir. kubelet's default: 2m.
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    pub minimum_image_ttl_duration: Option<Duration>,

    /// Where the agent keeps what must outlive a restart: the journal of
    /// eviction reports not yet made final in the Kubernetes API (with
    /// --node-name), and when each image was first seen (with
    /// --container-runtime-endpoint). Created if missing; a hostPath in the
    /// DaemonSet.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/evictd")]
    pub state_dir: PathBuf,

    /// How many threshold decisions to keep in --state-dir (decision-N.json,
    /// each at most 1 MiB, the oldest overwritten): the node and pods as the
    /// engine saw them, the thresholds, the ranking, the victims and what
    /// was done or why it was held. `evictd simulate --snapshot` replays
    /// one, `evictd explain` prints them. 0: none kept.
    #[arg(long, value_name = "N", default_value_t = crate::report::decisions::DEFAULT_RECORDS)]
    pub decision_records: usize,

    /// After a kill, how long to wait for the starved resource to come back
    /// before choosing the next victim anyway.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_period)]
    pub reclaim_timeout: Duration,

    /// At most COUNT evictions started per DURATION; past it evictd holds
    /// back (logged, counted in evictd_evictions_held_total) and lets the
    /// kernel OOM killer and kubelet act. 10 a minute drains no node by
    /// mistake yet outpaces kubelet, which evicts one pod per 10 s
    /// housekeeping. It also bounds an --evict-set decision.
    #[arg(long, value_name = "COUNT/DURATION", default_value = "10/1m")]
    pub eviction_budget: EvictionBudget,

    /// Runs before each soft eviction's SIGTERM (and each local-storage
    /// one's): an absolute path to an executable, run without a shell in a
    /// process group of its own and told the pod, the kill reason and its
    /// deadline in EVICTD_* variables, or an http:// URL that gets the same
    /// as a JSON POST. Hard evictions run none. A hook that fails or is
    /// still running at its deadline is logged and counted; the eviction
    /// goes on.
    #[arg(long, value_name = "PATH|URL")]
    pub pre_kill_hook: Option<HookTarget>,

    /// How long the pre-kill hook may run, and never more than half the
    /// pod's grace period: then it is killed (or hung up on) and the
    /// pod's SIGTERM follows. Long enough for a script to write a line or
    /// post a message, short against the 30 s grace a pod has by default.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_period)]
    pub pre_kill_hook_timeout: Duration,

    /// Evicts a pod thrashing at its own memory limit, as a soft memory
    /// eviction of that pod alone (its grace period, at most
    /// --eviction-max-pod-grace-period), reason `thrashing`. kubelet does
    /// not; without the flag a thrashing pod is only reported (a warning,
    /// evictd_pod_memory_thrashing).
    #[arg(long)]
    pub thrashing_eviction: bool,

    /// A pod that met its own memory limit between two 10 s readings of
    /// its counters thrashes when its file refaults between them reach
    /// this percentage of its file pages (Android lmkd's thrashing_limit,
    /// whose default this is).
    #[arg(long, value_name = "PERCENT", default_value_t = ThrashingLimits::default().refault_percent,
        value_parser = clap::value_parser!(u64).range(1..))]
    pub thrashing_refault_limit: u64,

    /// ... or when all its tasks stalled on memory (cgroup v2's `full`
    /// PSI) for this percentage of that window (lmkd's complete stall,
    /// 700 ms a second).
    #[arg(long, value_name = "PERCENT", default_value_t = ThrashingLimits::default().stall_percent,
        value_parser = clap::value_parser!(u64).range(1..=100))]
    pub thrashing_stall_limit: u64,

    /// KEP-5986's per-container memory pressure, out of tree (cgroup v2;
    /// each threshold 0, off, by default as in the KEP): a container whose
    /// memory.events `high` count grows faster than this many a second
    /// between two 10 s readings puts its pod under pressure. Past
    /// --memory-pressure-eviction-grace-period its memory.high is raised to
    /// its memory.max (stage 1); still under pressure a grace period later,
    /// the pod is evicted (stage 2, reason `container-memory-pressure`).
    #[arg(long, value_name = "EVENTS/S", default_value_t = 0.0, value_parser = parse_rate)]
    pub memory_high_eviction_threshold: f64,

    /// ... memory.events `max` (the container met its memory.max) more
    /// than this many a second: stage 2 after the grace, no stage 1.
    #[arg(long, value_name = "EVENTS/S", default_value_t = 0.0, value_parser = parse_rate)]
    pub memory_max_eviction_threshold: f64,

    /// ... memory.pressure `some avg10` above this percentage (0 to 100):
    /// stage 2 after the grace, no stage 1.
    #[arg(long, value_name = "PERCENT", default_value_t = 0.0, value_parser = parse_psi_percent)]
    pub memory_psi_eviction_threshold: f64,

    /// How long a pod's containers must stay under pressure before each
    /// stage (the KEP's MemoryPressureEvictionGracePeriod; it names no
    /// default, its example is 30 s). The readings are 10 s apart, so a
    /// grace is served in whole readings.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_age)]
    pub memory_pressure_eviction_grace_period: Duration,
}

impl RunArgs {
    pub(crate) fn thrashing_limits(&self) -> ThrashingLimits {
        ThrashingLimits {
            refault_percent: self.thrashing_refault_limit,
            stall_percent: self.thrashing_stall_limit,
        }
    }

    pub(crate) fn memory_high_thresholds(&self) -> MemoryHighThresholds {
        MemoryHighThresholds {
            high_rate: self.memory_high_eviction_threshold,
            max_rate: self.memory_max_eviction_threshold,
            psi_some_avg10: self.memory_psi_eviction_threshold,
            grace: self.memory_pressure_eviction_grace_period,
        }
    }

    /// The pre-kill hook, if one is set.
    pub(crate) fn pre_kill_hook(&self) -> Option<PreKillHook> {
        self.pre_kill_hook.clone().map(|target| PreKillHook {
            target,
            timeout: self.pre_kill_hook_timeout,
        })
    }

    /// kubelet's `imageMinimumGCAge`: the flag, else --config, else
    /// kubelet's default.
    pub fn image_minimum_gc_age(&self) -> Result<Duration, ConfigError> {
        Ok(match self.minimum_image_ttl_duration {
            Some(age) => age,
            None => self
                .eviction
                .config_image_minimum_gc_age()?
                .unwrap_or(DEFAULT_MINIMUM_AGE),
        })
    }

    pub(crate) fn watches(&self) -> Vec<WatchSpec> {
        self.watch_memory
            .iter()
            .chain(&self.watch_pids)
            .chain(&self.watch_node_pids)
            .cloned()
            .collect()
    }
}

/// A non-negative Kubernetes quantity as bytes (a command-line value parser).
/// A rate a second: a finite number, 0 or more.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 0.0 => Ok(rate),
        _ => Err(format!("{text:?} is not a rate of 0 or more a second")),
    }
}

/// A PSI percentage: 0 to 100.
fn parse_psi_percent(text: &str) -> Result<f64, String> {
    match parse_rate(text) {
        Ok(percent) if percent <= 100.0 => Ok(percent),
        _ => Err(format!("{text:?} is not a percentage from 0 to 100")),
    }
}

pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let quantity = Quantity::parse(text).map_err(|e| e.to_string())?;
    if quantity.is_negative() {
        return Err(format!("{text:?} must not be negative"));
    }
    Ok(quantity.value() as u64)
}

/// A duration, zero allowed (a command-line value parser).
fn parse_age(text: &str) -> Result<Duration, String> {
    duration::parse(text).map_err(|e| e.to_string())
}

/// A positive duration (`10s`, `100ms`) (a command-line value parser).
pub fn parse_period(text: &str) -> Result<Duration, String> {
    match duration::parse(text) {
        Ok(period) if period.is_zero() => Err(format!("{text:?} must be longer than zero")),
        Ok(period) => Ok(period),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, error::ErrorKind};

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("evictd").chain(args.iter().copied()))
    }

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_trigger_table_names_every_hook_as_logs_and_metrics_do() {
        for hook in crate::kernel::bpf::Hook::ALL {
            assert!(
                TRIGGERS_BY_KERNEL.contains(&format!("bpf {}", hook.as_str())),
                "{hook:?}"
            );
        }
    }

    #[test]
    fn every_mode_is_spelled_as_the_flag_spells_it() {
        for arg in ModeArg::value_variants() {
            let flag = arg.to_possible_value().unwrap();
            assert_eq!(Mode::from(*arg).as_str(), flag.get_name());
        }
    }

    #[test]
    fn every_eviction_action_is_spelled_as_the_flag_spells_it() {
        for arg in EvictionActionArg::value_variants() {
            let flag = arg.to_possible_value().unwrap();
            assert_eq!(EvictionAction::from(*arg).as_str(), flag.get_name());
        }
        assert_eq!(
            EvictionActionArg::value_variants().len(),
            EvictionAction::ALL.len()
        );
    }

    #[test]
    fn bare_evictd_runs_with_defaults() {
        let cli = parse(&[]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.mode, ModeArg::Event);
        assert_eq!(cli.run.memory_check_step, 256 * 1024);
        assert_eq!(cli.run.realtime_priority, 1);
        assert_eq!(cli.run.housekeeping_interval, Duration::from_secs(10));
        assert!(cli.run.watches().is_empty());
    }

    /// kubelet's flag name and default; the flag wins over --config.
    #[test]
    fn the_image_minimum_age_is_kubelets() {
        let run = |args: &[&str]| parse(args).unwrap().run.image_minimum_gc_age().unwrap();
        assert_eq!(run(&[]), Duration::from_secs(120));
        assert_eq!(
            run(&["--minimum-image-ttl-duration=0s"]),
            Duration::ZERO,
            "a flag of zero stays zero"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kubelet.yaml");
        std::fs::write(&file, "imageMinimumGCAge: 10m\n").unwrap();
        let config = format!("--config={}", file.display());
        assert_eq!(run(&[&config]), Duration::from_secs(600));
        assert_eq!(
            run(&[&config, "--minimum-image-ttl-duration=30s"]),
            Duration::from_secs(30)
        );
        assert!(parse(&["--minimum-image-ttl-duration=-1s"]).is_err());
    }

    #[test]
    fn collects_every_watch() {
        let cli = parse(&[
            "run",
            "--watch-memory",
            "/a=1Gi",
            "--watch-pids",
            "/a=100",
            "--watch-node-pids",
            "1000,2000",
        ])
        .unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!()
        };
        assert_eq!(run.watches().len(), 3);
    }

    #[test]
    fn bad_values_are_usage_errors_quoting_the_text() {
        for (arg, quoted) in [
            ("--watch-memory=/a=12Xi", "12Xi"),
            ("--resync-interval=0s", "0s"),
            ("--resync-interval=fast", "fast"),
            ("--memory-hysteresis=-1Mi", "-1Mi"),
            ("--realtime-priority=100", "100"),
        ] {
            let err = parse(&[arg]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{arg}");
            assert_eq!(err.exit_code(), 2);
            // Our parsers quote as Rust does, clap's range checks in '…'.
            let text = err.to_string();
            assert!(
                text.contains(&format!("{quoted:?}")) || text.contains(&format!("'{quoted}'")),
                "{err}"
            );
        }
    }
}
