//! `evictd run`: starts the agent step by step (metrics, the Kubernetes
//! API, the kernel's capabilities and programs, the scopes, the metrics
//! endpoint), then serves: every wake-up (a kernel record, a notification,
//! the timer, a close watch) is one pass of the `Evictor`, until told to
//! stop.
use std::{
    future::Future,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures::FutureExt as _;
use tokio::time::MissedTickBehavior;
use tracing::{error, info, warn};

use crate::{
    act::{
        evictor::{
            Action, Ended, Evaluation, Evictor, EvictorOptions, Parts, SpentBudget,
            thaw_abandoned_pods,
        },
        io::{Io, KernelRecords, KernelSide, Live},
        kill::Killer,
        timer::Pacer,
        wake::{Clock, Wake, WakeCause},
    },
    config::{PreciseHooksArg, RunArgs},
    decide::{
        memory_high::MemoryHighThresholds,
        rank::PidRanking,
        thresholds::{EvictionConfig, containerfs_conflicts},
    },
    kernel::{
        bpf::{BpfError, ChargesError, KernelEvent, ProbeOptions, Probes, Purpose, ScopeKind},
        capabilities::Capabilities,
        notify::{MemcgThresholds, Notifier, NotifyError, PsiTrigger},
        triggers::{self, MemoryFalls, Mode},
    },
    logs,
    metrics::{Metrics, MetricsError},
    node::{
        cgroupfs::{CgroupFs, CgroupVersion},
        inventory::Inventory,
        runtime::{
            link::{LinkError, RuntimeLink},
            reclaim::ImageTracker,
        },
    },
    report::{
        self,
        decisions::{DecisionRecords, DecisionsError},
        endpoint::{Endpoint, EndpointError, EndpointLimits, Routes},
        kernel_side::CounterExport,
        kubernetes::{KubeError, Kubernetes},
    },
    run::precise::PreciseHooks,
    scopes::{
        monitor::{KernelCoverage, Monitor, MonitorOptions},
        tripwires::MemcgLevels,
        zone::{self, FarTrigger, ZoneOptions, ZonePlan},
    },
    state::StateDir,
};

/// Why the agent stopped, naming the startup step that failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("startup, registering the metrics: {0}")]
    Metrics(#[source] MetricsError),
    #[error("startup, connecting to the Kubernetes API for pod metadata: {0}")]
    Metadata(#[source] KubeError),
    #[error("startup, loading the eBPF programs: {0}")]
    Load(#[source] BpfError),
    #[error("startup, arming the kernel notification of --mode {mode}: {source}")]
    Notify {
        mode: Mode,
        #[source]
        source: NotifyError,
    },
    #[error("startup, {0}")]
    RuntimeLink(#[source] LinkError),
    #[error("startup, serving metrics: {0}")]
    Endpoint(#[source] EndpointError),
    #[error("reading kernel records: {0}")]
    Records(#[source] BpfError),
}

impl RunError {
    /// Whether the user's input is at fault (exit status 2).
    pub fn is_input_error(&self) -> bool {
        matches!(self, Self::Metadata(e) if e.is_input_error())
    }
}

/// How long queued eviction reports may still take at shutdown; kubelet
/// gives the pod 30 s (terminationGracePeriodSeconds in the DaemonSet).
const REPORT_FLUSH: Duration = Duration::from_secs(10);

/// What the command line and --config resolve to, checked before the
/// agent touches anything.
pub struct Settings {
    pub eviction: EvictionConfig,
    /// kubelet's `imageMinimumGCAge` (`--minimum-image-ttl-duration`).
    pub image_minimum_gc_age: Duration,
}

/// Runs the agent until `shutdown` resolves. On return every program is
/// detached and every map freed.
pub async fn run(
    args: RunArgs,
    settings: Settings,
    mut inventory: Inventory,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let config = settings.eviction;
    let started = Instant::now();
    // Before anything that can fail: a pod a killed agent left frozen must
    // not stay frozen because this one cannot start.
    let killer = Killer::new(inventory.cgroupfs().clone());
    thaw_abandoned_pods(&mut inventory, &killer);
    crate::node::inventory::raise_file_limit();
    return_freed_heap();
    lock_memory();
    killer.ready_threads().await;
    let metrics = Metrics::new().map_err(RunError::Metrics)?;
    inventory.set_metrics(metrics.clone());
    inventory.set_thrashing_limits(args.thrashing_limits());
    inventory.set_memory_high_thresholds(args.memory_high_thresholds());
    tell_memory_high(&args.memory_high_thresholds(), inventory.cgroupfs().version);
    if args.policy.pid_ranking == PidRanking::ForkRate {
        inventory.measure_fork_rates();
    }
    // Held to the end: dropping it stops the runtime's thread.
    let _runtime_thread = match &args.inventory.container_runtime_endpoint {
        Some(endpoint) => {
            let age = settings.image_minimum_gc_age;
            // First sightings kept across restarts when the directory can
            // be had; without it every image is new at startup, which
            // only delays its removal.
            let images = match StateDir::open(&args.state_dir) {
                Ok(state) => ImageTracker::persisted(age, state),
                Err(e) => {
                    warn!(error = %e, "images first seen are not kept across restarts");
                    ImageTracker::new(age)
                }
            };
            let (link, thread) = RuntimeLink::start(
                endpoint.clone(),
                args.inventory.nodefs_path.clone(),
                metrics.clone(),
                images,
            )
            .map_err(RunError::RuntimeLink)?;
            inventory.set_runtime(link);
            Some(thread)
        }
        None => None,
    };
    let kubernetes_options = args.kubernetes.options();
    let kubernetes = match &args.kubernetes.node_name {
        Some(node_name) => {
            let kubernetes = Kubernetes::start(
                &kubernetes_options,
                node_name,
                &args.state_dir,
                metrics.clone(),
            )
            .map_err(RunError::Metadata)?;
            inventory.set_metadata(Box::new(kubernetes.store().clone()));
            info!(
                node = node_name,
                action = kubernetes_options.eviction_action.as_str(),
                "Kubernetes API: watching this node's pods, reporting evictions"
            );
            Some(kubernetes)
        }
        None => None,
    };
    let cgroupfs = inventory.cgroupfs().clone();
    info!(version = ?cgroupfs.version, memory = %cgroupfs.memory_root.display(),
        pids = ?cgroupfs.pids_root, node = inventory.node_cgroup(), "cgroup hierarchies");
    for threshold in &config.thresholds {
        let bytes = threshold.signal.resource().in_bytes();
        info!(signal = %threshold.signal, value = logs::threshold(threshold.value, bytes).logged(),
            hard = threshold.hard, grace = ?threshold.grace_period,
            min_reclaim = logs::threshold(threshold.min_reclaim, bytes).logged(), "eviction threshold");
    }
    if config.thresholds.is_empty() {
        warn!("no eviction thresholds: evictd reports but never evicts");
    }
    // kubelet derives them from nodefs or imagefs (UpdateContainerFsThresholds),
    // with this line for each one set.
    for error in containerfs_conflicts(&config.thresholds) {
        warn!(
            error,
            "eviction manager: found conflicting containerfs eviction. Ignoring."
        );
    }

    let mode = Mode::from(args.mode);
    let check_interval = if mode.housekeeping() {
        args.housekeeping_interval
    } else {
        args.resync_interval
    };
    let (capabilities, btf) = Capabilities::detect(&cgroupfs);
    let options = ProbeOptions {
        check_step_bytes: args.memory_check_step,
        kernel_log: args.bpf_log,
    };
    let falls = if args.watch_memory.is_empty() {
        MemoryFalls::AtTheNextCharge
    } else {
        MemoryFalls::WhenTheyHappen
    };
    let armed = triggers::arm(capabilities, btf.as_ref(), mode, falls, options);
    // The kernel's answers were only needed to load the programs.
    drop(btf);
    triggers::report(&armed, mode, &metrics, check_interval);
    let zone = zone_options(&armed, &args, check_interval);
    let pid_zone = pid_zone_options(&armed, &args, check_interval);
    let precise = zone.map(|_| {
        let clock = Pacer::new();
        if !clock.is_precise() {
            warn!("no timerfd for the zone's backstop reads: tokio's timer instead");
        }
        PreciseHooks::new(cgroupfs.clone(), metrics.clone(), check_interval, clock)
    });
    let notifier = notifier(&armed, &args, &cgroupfs, inventory.node_cgroup())
        .map_err(|source| RunError::Notify { mode, source })?;
    let mut kernel = None;
    let mut kernel_log = None;
    let mut bands = None;
    let mut coverage = KernelCoverage::default();
    if let Some(mut probes) = armed.probes {
        // Walked from the pods' cgroup: the node's may be the hierarchy's
        // root, whose usage file counts otherwise (so the first reading
        // cannot be checked) and which holds every system cgroup.
        match inventory.pods_cgroup_and_depth() {
            Some((kubepods, depth)) => {
                let charges = probes.cgroup_charges(&cgroupfs.memory_dir(&kubepods), depth, || {
                    cgroupfs.read_memory_usage(&kubepods)
                });
                match charges {
                    Ok(charges) => {
                        info!(
                            cgroup = kubepods,
                            "pods' memory read at once by the kernel's cgroup iterator"
                        );
                        inventory.set_charges_source(Box::new(charges));
                    }
                    Err(ChargesError::Setup(e)) => {
                        info!(error = %e, "no cgroup iterator: a memory decision reads each pod's file");
                    }
                    Err(e) => {
                        warn!(error = %e, "the cgroup iterator is not used: a memory decision reads each pod's file");
                    }
                }
            }
            None => {
                info!("no pods' cgroup at start: a memory decision reads each pod's file");
            }
        }
        if probes.covers(Purpose::Memory) {
            watch_the_root(&probes, &mut inventory);
        }
        info!(programs = ?probes.program_ids(), "eBPF programs attached");
        if args.bpf_log {
            kernel_log = Some(tokio::spawn(
                probes.kernel_logger().map_err(RunError::Load)?.run(),
            ));
        }
        coverage = KernelCoverage {
            memory: probes.covers(Purpose::Memory),
            pids: probes.covers(Purpose::Pids),
            cgroup_lifecycle: probes.covers(Purpose::CgroupLifecycle),
        };
        bands = Some(probes.take_scope_maps().map_err(RunError::Load)?);
        kernel = Some(KernelSide {
            events: probes.take_events().map_err(RunError::Load)?,
            probes,
            counters: CounterExport::default(),
        });
    }
    let monitor = Monitor::new(
        cgroupfs.clone(),
        args.watches(),
        bands,
        coverage,
        metrics.clone(),
        MonitorOptions {
            memory_hysteresis: args.memory_hysteresis,
            pids_hysteresis: args.pids_hysteresis,
        },
    );
    // Shadow mode writes nothing to the API, but keeps watching its pods:
    // dropped, the client's thread would end with its watch, at once and
    // most often before the first listing.
    let (api, watch_only) = if args.dry_run {
        (None, kubernetes)
    } else {
        (kubernetes, None)
    };
    let mut evictor = Evictor::<Live>::new(
        config,
        Parts {
            node: inventory,
            killer,
            api,
            monitor,
            // Nor spends any budget.
            spent_budget: if args.dry_run {
                None
            } else {
                SpentBudget::new(
                    &args.state_dir,
                    args.kubernetes.node_name.as_deref().unwrap_or_default(),
                )
            },
            pre_kill: args.pre_kill_hook(),
        },
        metrics.clone(),
        Clock::new(),
        EvictorOptions {
            policy: args.policy.into(),
            pid_ranking: args.policy.pid_ranking,
            dry_run: args.dry_run,
            reclaim_timeout: args.reclaim_timeout,
            kernel_triggers: kernel.is_some(),
            budget: args.eviction_budget,
            zone,
            pid_zone,
            thrashing_eviction: args.thrashing_eviction,
            thrashing_limits: args.thrashing_limits(),
            memory_high_thresholds: args.memory_high_thresholds(),
        },
    );
    if args.decision_records > 0 {
        // A node is protected without its record: only the record is lost.
        match StateDir::open(&args.state_dir)
            .map_err(DecisionsError::from)
            .and_then(|dir| DecisionRecords::start(dir, args.decision_records))
        {
            Ok(records) => evictor.set_decision_records(records),
            Err(e) => warn!(error = %e, "decisions are not recorded"),
        }
    }
    if args.dry_run {
        warn!("--dry-run: evictions are decided and reported, nothing is killed");
    }
    evictor.monitor().install_all();

    let ready = Arc::new(AtomicBool::new(false));
    let endpoint = Endpoint::start(
        metrics.clone(),
        ready.clone(),
        args.metrics_address,
        Routes::Metrics,
        EndpointLimits::default(),
    )
    .map_err(RunError::Endpoint)?;
    info!(address = %endpoint.address(), "serving /metrics and /healthz");
    // kubelet's probes on slots of their own: slow scrapers can fill the
    // metrics endpoint's, never these.
    let probes = Endpoint::start(
        metrics.clone(),
        ready.clone(),
        args.health_address,
        Routes::Probes,
        EndpointLimits::probes(),
    )
    .map_err(RunError::Endpoint)?;
    info!(address = %probes.address(), "serving /healthz and /readyz for probes");
    // What a restart costs the node: from here on the engine decides (the
    // first run follows at once) and the kernel watches.
    let startup = started.elapsed();
    metrics.startup.set(startup.as_secs_f64());
    // Only now: loading the programs (seconds of verifier time on a slow
    // CPU) and the first walks would otherwise hold a CPU at real-time
    // priority, which on a 1-CPU node starves everything else until the
    // kernel's RT throttling.
    run_in_real_time(args.realtime_priority);
    info!(startup_ms = startup.as_millis() as u64, "protection armed");

    let timer_cause = if mode.housekeeping() {
        WakeCause::Poll
    } else {
        WakeCause::Resync
    };
    let result = serve(
        &mut evictor,
        Sources {
            kernel: kernel.as_mut(),
            notifier,
            precise,
            check_interval,
            timer_cause,
        },
        &ready,
        shutdown,
    )
    .await;
    info!("shutting down");
    let (api, monitor) = evictor.into_parts();
    if let Some(kubernetes) = api.or(watch_only) {
        kubernetes.shutdown(REPORT_FLUSH);
    }
    drop((endpoint, probes));
    if let Some(task) = kernel_log {
        task.abort();
    }
    // Dropping the probes and the maps taken from them detaches every
    // program and frees every map.
    if let Some(kernel) = kernel {
        drop((kernel, monitor.into_bands()));
        info!("all eBPF programs detached");
    }
    result.map_err(RunError::Records)
}

/// Has glibc give freed heap back to the kernel. glibc raises its trim
/// threshold to twice the largest mmapped block freed so far, so once the
/// startup peak (the kernel's BTF, the BPF object, the first pod list) was
/// freed, 13 MiB of free heap stayed resident below the heap's top, locked
/// with the rest ([`lock_memory`]). A fixed 1 MiB threshold returns it:
/// release build on the sandbox node, resident 25.8 → 12.5 MiB and 30.3 →
/// 17.4 MiB with the API watch (tests/tests/footprint.rs). musl's
/// allocator, the container image's, returns freed memory by itself.
fn return_freed_heap() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt takes two integers and only changes the
        // allocator's parameters.
        let set = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20) };
        if set != 1 {
            warn!("cannot set the allocator's trim threshold: freed heap stays resident");
        }
    }
}

/// Keeps the agent's memory resident (as Android's lmkd does): under the
/// thrashing evictd exists to stop, its own code would otherwise be paged
/// out and every decision would wait on disk. Pages are locked as they are
/// touched (`MCL_ONFAULT`), so untouched reservations such as thread stacks
/// cost nothing; what the agent touches counts towards its memory limit for
/// good. Needs CAP_IPC_LOCK (or a large enough RLIMIT_MEMLOCK).
fn lock_memory() {
    // SAFETY: mlockall takes flags by value and changes no memory contents.
    let locked =
        unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    if locked == 0 {
        info!("agent memory locked (mlockall)");
    } else {
        warn!(error = %std::io::Error::last_os_error(),
            "cannot lock the agent's memory (mlockall needs CAP_IPC_LOCK): under thrashing its code may be paged out");
    }
}

/// Makes the calling thread, the one that reads records, decides and kills,
/// a real-time one (SCHED_FIFO at `priority`; 0: leaves it alone), as
/// Android's lmkd does: on a node whose CPUs are busy, a woken agent then
/// runs at once instead of waiting its turn behind the workloads it is
/// about to judge. Threads it starts later run normally
/// (SCHED_RESET_ON_FORK): the metrics endpoint, the API watch and the
/// reapers never get ahead of a workload. A runaway loop here would take
/// one CPU, of which the kernel's RT throttling still leaves the workloads
/// 5 % by default.
fn run_in_real_time(priority: u8) {
    if priority == 0 {
        return;
    }
    // SAFETY: sched_param is plain integers (musl has more of them than
    // glibc), for which all zeroes are a valid value.
    let mut param: libc::sched_param = unsafe { std::mem::zeroed() };
    param.sched_priority = libc::c_int::from(priority);
    // SAFETY: pid 0 is the calling thread; `param` is a live sched_param.
    let set = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if set == 0 {
        info!(priority, "deciding thread runs in real time (SCHED_FIFO)");
    } else {
        warn!(error = %std::io::Error::last_os_error(),
            "cannot run the deciding thread in real time (SCHED_FIFO needs CAP_SYS_NICE): a busy node may delay decisions");
    }
}

/// The push mechanism of --mode psi or memcg-threshold, on the node cgroup.
fn notifier(
    armed: &triggers::Armed,
    args: &RunArgs,
    cgroupfs: &CgroupFs,
    node_cgroup: &str,
) -> Result<Option<Notifier>, NotifyError> {
    let notifier = match armed.triggers.get(Purpose::Memory).trigger {
        triggers::Trigger::Psi => {
            // A cgroup's own pressure on v2; the whole machine's on v1.
            let path = if armed.capabilities.psi.cgroup && node_cgroup != "/" {
                cgroupfs.memory_dir(node_cgroup).join("memory.pressure")
            } else {
                PathBuf::from("/proc/pressure/memory")
            };
            let trigger = PsiTrigger::open(&path, args.psi_stall, args.psi_window)?;
            info!(path = %trigger.path().display(), stall = ?args.psi_stall,
                window = ?args.psi_window, "PSI trigger armed");
            Notifier::Psi(trigger)
        }
        triggers::Trigger::MemcgThreshold => {
            Notifier::MemcgThresholds(MemcgThresholds::open(&cgroupfs.memory_dir(node_cgroup))?)
        }
        _ => return Ok(None),
    };
    Ok(Some(notifier))
}

/// Where the precise memory hooks come and go with the node's distance to
/// its memory thresholds: event mode with a kernel memory hook, unless
/// `--precise-hooks always`, or a `--watch` memory scope (whose flags the
/// hooks report at any distance) needs them all the time.
/// On a node that is the memory hierarchy's root (`--node-cgroup /`, a
/// real node), has the kernel watch the node's memory lines on the root,
/// comparing the machine's working set as kubelet computes it; says which
/// line the kernel watches, or why none.
fn watch_the_root(probes: &Probes, inventory: &mut Inventory) {
    if !inventory.node_cgroup().trim_matches('/').is_empty() {
        return;
    }
    match probes.machine_working_set() {
        Ok(()) => {
            inventory.set_root_band(true);
            info!(
                compares = "the machine's working set (kubelet's anon + file - inactive file, from the kernel's per-NUMA-node counters), at charges anywhere on the node",
                "node memory watched on the root"
            );
        }
        Err(e) => {
            warn!(error = %e, "node memory not watched by the kernel: no memory.available line on the root (its working set cannot be added up there); the engine compares it at every reading, at least every --resync-interval");
        }
    }
}

fn zone_options(
    armed: &triggers::Armed,
    args: &RunArgs,
    check_interval: Duration,
) -> Option<ZoneOptions> {
    let hook = match armed.triggers.get(Purpose::Memory).trigger {
        triggers::Trigger::Kernel(hook) if args.precise_hooks != PreciseHooksArg::Always => hook,
        _ => return None,
    };
    if !args.watch_memory.is_empty() {
        info!("--watch-memory scopes keep the precise memory hooks attached");
        return None;
    }
    let far = if armed.capabilities.memcg_event_control {
        FarTrigger::MemcgEventfd
    } else {
        FarTrigger::AdaptiveRead {
            max_period: check_interval,
        }
    };
    // A hook that sees falls as they happen runs on every free.
    let off_while_reclaiming = hook.sees_memory_falls();
    info!(far_trigger = ?far, off_while_reclaiming, "precise memory hooks attached only near a memory threshold (--precise-hooks zone)");
    Some(ZoneOptions::new(far, off_while_reclaiming))
}

/// Whether the PID hooks go on only near a PID threshold: event mode with
/// the kernel's PID hook, unless `--precise-hooks always`. A `--watch-pids`
/// scope, whose crossings are reported at any distance, keeps them on
/// while it is watched ([`PidHooks`]).
fn pid_zone_options(
    armed: &triggers::Armed,
    args: &RunArgs,
    check_interval: Duration,
) -> Option<ZoneOptions> {
    if !matches!(
        armed.triggers.get(Purpose::Pids).trigger,
        triggers::Trigger::Kernel(_)
    ) || args.precise_hooks == PreciseHooksArg::Always
    {
        return None;
    }
    info!(
        zone_min_tasks = zone::PID_ZONE_MIN_TASKS,
        floor_rate = zone::PID_FLOOR_RATE,
        "PID hooks attached only near a PID threshold (--precise-hooks zone): farther away the engine reads the node's tasks again before a fork storm could get there"
    );
    Some(ZoneOptions::pids(check_interval))
}

/// What wakes the engine besides a close watch.
pub(crate) struct Sources<'a, K> {
    /// Kernel records (event mode).
    pub kernel: Option<&'a mut K>,
    /// The push mechanism of --mode psi or memcg-threshold.
    pub notifier: Option<Notifier>,
    /// The precise memory hooks' zone and its far trigger (event mode).
    pub precise: Option<PreciseHooks>,
    pub check_interval: Duration,
    /// Why a timer tick wakes the engine: `Resync` behind the kernel
    /// programs, `Poll` where the timer is the trigger.
    pub timer_cause: WakeCause,
}

/// Serves wake-ups until `shutdown` resolves: kernel records go to the
/// scope monitor (a crossing of an engine scope wakes the engine), and a
/// notification, a timer tick, a due close watch or the end of an eviction
/// wakes it directly. Each wake-up is one [`Evictor::evaluate`], whose
/// [`Action`] sets the next close watch; the evictions it starts run here,
/// beside the loop.
pub(crate) async fn serve<I: Io>(
    evictor: &mut Evictor<I>,
    sources: Sources<'_, I::Kernel>,
    ready: &AtomicBool,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BpfError> {
    let Sources {
        mut kernel,
        mut notifier,
        mut precise,
        check_interval,
        timer_cause,
    } = sources;
    // The first run is now, not a tick later: an agent restarted on a node
    // already under pressure acts at once.
    let startup = evictor.clock().wake(WakeCause::Startup);
    let (first, mut ended_at_start) = evaluate(evictor, startup);
    let reached = rearm(notifier.as_mut(), first.memcg_levels.as_ref());
    let attached = place_hooks(precise.as_mut(), kernel.as_deref_mut(), &first);
    let mut pid_plan = first.pid_hooks;
    // Ready (/readyz) once the node has been looked at and, under pressure,
    // relieved: a rolling update moves on only then.
    ready.store(true, Ordering::Release);
    let mut close_watch = deadline(first.action, attached || reached);
    let mut timer =
        tokio::time::interval_at(tokio::time::Instant::now() + check_interval, check_interval);
    timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut batch = Vec::new();
    let mut pid_hooks = PidHooks::default();
    tokio::pin!(shutdown);
    loop {
        // Here, so that a PID scope the last records installed or removed
        // moves them too.
        if pid_hooks.place(evictor, kernel.as_deref_mut(), pid_plan.as_ref()) {
            close_watch = Some(tokio::time::Instant::now());
        }
        let wake = if let Some((id, ended)) = ended_at_start.take() {
            eviction_ended(evictor, id, ended)
        } else {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                result = or_never(kernel.as_mut().map(|kernel| kernel.next_batch(&mut batch))) => {
                    result?;
                    let Some(kernel) = kernel.as_mut() else { continue };
                    match handle_records(evictor, *kernel, &mut batch) {
                        Some(wake) => wake,
                        None => continue,
                    }
                }
                notified = or_never(notifier.as_mut().map(Notifier::wait)) => {
                    let cause = match notifier {
                        Some(Notifier::Psi(_)) => WakeCause::Psi,
                        _ => WakeCause::MemcgThreshold,
                    };
                    match notified {
                        Ok(at_ns) => {
                            resync(evictor, kernel.as_deref_mut());
                            Wake { cause, at_ns }
                        }
                        Err(e) => {
                            error!(error = %e, period = ?check_interval,
                                "kernel notifications failed: POLLING cgroupfs only");
                            notifier = None;
                            continue;
                        }
                    }
                }
                woke = or_never(precise.as_mut().map(PreciseHooks::wait)) => match woke {
                    Ok(at_ns) => Wake { cause: WakeCause::Zone, at_ns },
                    Err(e) => {
                        if let Some(precise) = precise.as_mut() {
                            precise.give_up(kernel.as_deref_mut(), &e);
                        }
                        continue;
                    }
                },
                _ = timer.tick() => {
                    resync(evictor, kernel.as_deref_mut());
                    evictor.clock().wake(timer_cause)
                }
                () = or_never(close_watch.map(tokio::time::sleep_until)) => {
                    evictor.clock().wake(WakeCause::CloseWatch)
                }
                (id, ended) = evictor.next_ended() => eviction_ended(evictor, id, ended),
            }
        };
        let (evaluation, ended) = evaluate(evictor, wake);
        ended_at_start = ended;
        let reached = rearm(notifier.as_mut(), evaluation.memcg_levels.as_ref());
        let attached = place_hooks(precise.as_mut(), kernel.as_deref_mut(), &evaluation);
        close_watch = deadline(evaluation.action, attached || reached);
        pid_plan = evaluation.pid_hooks;
        // After the tick's decision, and not while a kill runs: reading
        // every pod's counters takes milliseconds at a few hundred pods.
        if wake.cause == timer_cause && evictor.evictions_running() == 0 {
            evictor.read_memory_stalls(&wake);
        }
    }
}

/// One engine run on `wake`. A kill it starts runs up to its first wait
/// (the freeze, or the reapers) before the caller moves the precise hooks:
/// detaching them takes about 0.3 ms of text patching on every CPU, which
/// the freezing hides instead of the kill waiting for it. Returns the
/// eviction that already ended in that first step, for the next wake-up.
fn evaluate<I: Io>(evictor: &mut Evictor<I>, wake: Wake) -> (Evaluation, Option<(u64, Ended)>) {
    let running = evictor.evictions_running();
    let evaluation = evictor.evaluate(wake);
    let ended = if evictor.evictions_running() > running {
        evictor.next_ended().now_or_never()
    } else {
        None
    };
    (evaluation, ended)
}

/// Reports how eviction `id` ended; the engine runs again at once.
fn eviction_ended<I: Io>(evictor: &mut Evictor<I>, id: u64, ended: Ended) -> Wake {
    evictor.end(id, ended);
    evictor.clock().wake(WakeCause::EvictionEnded)
}

/// Hands a batch of kernel records to the scope monitor and the reports;
/// returns the wake-up it calls for: the first crossing of an engine
/// scope, or a resync when the kernel dropped records.
fn handle_records<I: Io>(
    evictor: &mut Evictor<I>,
    kernel: &mut I::Kernel,
    batch: &mut Vec<Result<crate::kernel::bpf::Received, crate::kernel::bpf::DecodeError>>,
) -> Option<Wake> {
    let mut wake = None;
    for record in batch.drain(..) {
        let received = match record {
            Ok(received) => received,
            Err(e) => {
                report::kernel_side::decode_error(evictor.metrics(), &e);
                continue;
            }
        };
        let metrics = evictor.metrics();
        metrics
            .events
            .with_label_values(&[received.event.kind()])
            .inc();
        metrics
            .event_latency
            .observe(received.latency().as_secs_f64());
        match &received.event {
            KernelEvent::Crossing(crossing) => {
                let engine = evictor.monitor().on_crossing(crossing, received.latency());
                if engine && wake.is_none() {
                    wake = Some(Wake {
                        cause: WakeCause::Kernel,
                        at_ns: received.event.timestamp_ns(),
                    });
                }
            }
            KernelEvent::OomVictim(victim) => {
                let scope = evictor
                    .monitor()
                    .memory_scope_label(victim.memory_cgroup_id)
                    .map(str::to_owned);
                report::kernel_side::oom_victim(
                    evictor.metrics(),
                    victim,
                    scope.as_deref(),
                    received.latency(),
                );
            }
            KernelEvent::CgroupCreated(change) => {
                evictor.cgroup_changed(change);
                evictor.monitor().on_mkdir(change);
            }
            KernelEvent::CgroupRemoved(change) => {
                evictor.cgroup_changed(change);
                evictor.monitor().on_rmdir(change);
            }
        }
    }
    // A lost record may be the pressure itself: resync at once rather than
    // at the next tick.
    if kernel.new_drops(evictor.metrics()) > 0 {
        evictor.cgroups_changed();
        evictor.monitor().resync(true);
        if wake.is_none() {
            wake = Some(evictor.clock().wake(WakeCause::Resync));
        }
    }
    wake
}

/// Brings the kernel's counters into the metrics and re-reads every flag
/// scope (a resync behind the programs, or the poll without them).
fn resync<I: Io>(evictor: &mut Evictor<I>, kernel: Option<&mut I::Kernel>) {
    let lost = kernel.is_some_and(|kernel| kernel.refresh_counters(evictor.metrics()) > 0);
    // Without the lifecycle programs, or with their records lost, nothing
    // else says pods came or went; with them, the listing stays as the
    // records keep it, so a decision need not list the pods again.
    if lost || !evictor.monitor().sees_cgroup_lifecycle() {
        evictor.cgroups_changed();
    }
    evictor.monitor().resync(lost);
}

/// Moves `--mode memcg-threshold`'s eventfd to where the thresholds could
/// next be met, from the engine run just done (kubelet re-arms on each
/// sync). After a signal, a reading below a level registers the levels
/// afresh ([`MemcgThresholds::rearm`]); a reading past them all keeps them,
/// so the kill it starts does not wait out a registration. True when usage
/// reached a level between the reading and a registration: the kernel
/// takes that level as crossed and never signals it, so the caller looks
/// again at once. Levels past at the reading do not count: the engine saw
/// those, and during a kill usage stays there.
fn rearm(notifier: Option<&mut Notifier>, levels: Option<&MemcgLevels>) -> bool {
    let (Some(Notifier::MemcgThresholds(thresholds)), Some(levels)) = (notifier, levels) else {
        return false;
    };
    let read_usage = levels.read_usage;
    let registered = if levels.levels.iter().any(|&level| read_usage < level) {
        thresholds.rearm(&levels.levels)
    } else {
        thresholds.arm(&levels.levels)
    };
    match registered.and_then(|()| thresholds.reached_since(read_usage)) {
        Ok(reached) => {
            if reached {
                info!("memory threshold reached before its eventfd was armed: looking again");
            }
            reached
        }
        Err(e) => {
            warn!(error = %e, "cannot re-arm the memory thresholds; the timer still polls");
            false
        }
    }
}

/// Attaches or detaches the precise memory hooks as the engine run just
/// done says; true when they were just attached.
fn place_hooks<K: KernelRecords>(
    precise: Option<&mut PreciseHooks>,
    kernel: Option<&mut K>,
    evaluation: &Evaluation,
) -> bool {
    match (precise, &evaluation.precise) {
        (Some(precise), Some(plan)) => precise.apply(kernel, plan),
        _ => false,
    }
}

/// Attaches the PID programs while a kernel band watches a PID scope that
/// needs them and detaches them otherwise: they run on every fork and exit
/// on the node (0.5 to 1 µs a call here). A `--watch-pids` scope needs them
/// at any distance; the engine's PID scope needs them within its zone
/// ([`ZoneOptions::pids`]), or whenever it has a line where the zone is not
/// managed (`--precise-hooks always`).
#[derive(Debug, Default)]
struct PidHooks {
    /// Where they were last put; `None` before the first time.
    attached: Option<bool>,
    /// Moving them failed once: they stay as they are (the resync still
    /// reads), rather than being tried and warned about at every wake-up.
    stuck: bool,
}

impl PidHooks {
    /// Moves them where the registry's PID scopes and the engine's last
    /// `plan` want them. True when they were just attached: a line crossed
    /// before then is seen at the next fork or exit, and the engine looks at
    /// once in case none comes.
    fn place<I: Io>(
        &mut self,
        evictor: &mut Evictor<I>,
        kernel: Option<&mut I::Kernel>,
        plan: Option<&ZonePlan>,
    ) -> bool {
        let Some(kernel) = kernel else { return false };
        let monitor = evictor.monitor();
        let (wanted, reason) = if monitor.kernel_watches_a_flag_scope(ScopeKind::Pids) {
            (true, "a --watch-pids scope is watched")
        } else if !monitor.kernel_watches_a_scope(ScopeKind::Pids) {
            (false, "no PID threshold or watched PID scope")
        } else {
            match plan {
                Some(plan) => (plan.armed, plan.reason.describe(ScopeKind::Pids)),
                None => (true, "a PID scope is watched"),
            }
        };
        if self.stuck || self.attached == Some(wanted) {
            return false;
        }
        match kernel.set_hooks(Purpose::Pids, wanted) {
            Ok(moved) => {
                self.attached = Some(wanted);
                if moved {
                    let state = if wanted { "attached" } else { "detached" };
                    match plan {
                        Some(plan) => info!(state, reason, distance = ?plan.distance,
                            zone = logs::amount(plan.zone_width, false).logged(), "PID hooks"),
                        None => info!(state, reason, "PID hooks"),
                    }
                }
                moved && wanted
            }
            Err(e) => {
                self.stuck = true;
                warn!(error = %e, wanted, "cannot move the PID hooks: they stay as they are, and the resync still reads");
                false
            }
        }
    }
}

/// When the engine runs next without a wake-up: at once when `look_now`
/// (the precise hooks were just attached, and a line crossed between the
/// engine's read and the attachment would wait for the next charge; or a
/// threshold was reached before its eventfd was armed), else as `action`
/// says.
fn deadline(action: Action, look_now: bool) -> Option<tokio::time::Instant> {
    if look_now {
        return Some(tokio::time::Instant::now());
    }
    match action {
        Action::AwaitChange => None,
        Action::Requeue(after) => Some(tokio::time::Instant::now() + after),
    }
}

/// Resolves as `future` does, or never when there is none: a `select!`
/// branch for a source this mode does not have.
async fn or_never<F: Future>(future: Option<F>) -> F::Output {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;

/// Says whether KEP-5986's per-container memory pressure is judged, and
/// why not on cgroup v1 (no memory.high: the KEP is a no-op there too).
fn tell_memory_high(thresholds: &MemoryHighThresholds, version: CgroupVersion) {
    if !thresholds.enabled() {
        return;
    }
    if version == CgroupVersion::V1 {
        warn!(
            "--memory-*-eviction-threshold set, but the memory controller is on cgroup v1, which has no memory.high or memory.events: containers' memory pressure is not judged"
        );
        return;
    }
    info!(
        high_rate = thresholds.high_rate,
        max_rate = thresholds.max_rate,
        psi_some_avg10 = thresholds.psi_some_avg10,
        grace = ?thresholds.grace,
        "containers' memory pressure judged at each 10 s reading (KEP-5986): memory.high relaxed, then the pod evicted"
    );
}
