//! `evictd run`: discovers the node, loads the kernel programs (or says why
//! it cannot and polls instead), and serves until told to stop.
use std::{
    future::Future,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::time::MissedTickBehavior;
use tracing::{error, info, warn};

use crate::{
    bpf::{BpfError, ProbeOptions, Purpose},
    capabilities::Capabilities,
    cgroup::{CgroupError, CgroupFs},
    config::RunArgs,
    endpoint::{Endpoint, EndpointError, EndpointLimits},
    engine::VictimPolicy,
    evictor::{Evictor, EvictorOptions, Trigger},
    inventory::Inventory,
    kill::Killer,
    kubernetes::{KubeError, Kubernetes},
    metrics::{Metrics, MetricsError},
    monitor::{Monitor, MonitorOptions, next_batch},
    notify::{MemcgThresholds, Notifier, NotifyError, PsiTrigger},
    thresholds::EvictionConfig,
    triggers,
};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error(transparent)]
    Notify(#[from] NotifyError),
    #[error(transparent)]
    Kube(#[from] KubeError),
}

impl RunError {
    /// Whether the user's input is at fault (exit status 2).
    pub fn is_input_error(&self) -> bool {
        matches!(self, Self::Kube(e) if e.is_input_error())
    }
}

/// How long queued eviction reports may still take at shutdown; kubelet
/// gives the pod 30 s (terminationGracePeriodSeconds in the DaemonSet).
const REPORT_FLUSH: Duration = Duration::from_secs(10);

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

/// Runs the agent until `shutdown` resolves. On return every program is
/// detached and every map freed.
pub async fn run(
    args: RunArgs,
    config: EvictionConfig,
    mut inventory: Inventory,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let started = Instant::now();
    let metrics = Metrics::new()?;
    inventory.set_metrics(metrics.clone());
    let kubernetes = match &args.kubernetes.node_name {
        Some(node_name) => {
            let kubernetes = Kubernetes::start(
                &args.kubernetes,
                node_name,
                &args.state_dir,
                metrics.clone(),
            )?;
            inventory.set_metadata(Box::new(kubernetes.store().clone()));
            info!(
                node = node_name,
                action = args.kubernetes.eviction_action.as_str(),
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
        info!(signal = %threshold.signal, value = ?threshold.value, hard = threshold.hard,
            grace = ?threshold.grace_period, min_reclaim = ?threshold.min_reclaim, "eviction threshold");
    }
    if config.thresholds.is_empty() {
        warn!("no eviction thresholds: evictd reports but never evicts");
    }

    let check_interval = if args.mode.housekeeping() {
        args.housekeeping_interval
    } else {
        args.resync_interval
    };
    let (capabilities, btf) = Capabilities::detect(&cgroupfs);
    let options = ProbeOptions {
        check_step_bytes: args.memory_check_step,
        kernel_log: args.bpf_log,
    };
    let armed = triggers::arm(capabilities, btf.as_ref(), args.mode, options);
    // The parsed BTF (tens of MiB) was only needed to load the programs.
    drop(btf);
    triggers::report(&armed, args.mode, &metrics, check_interval);
    let notifier = notifier(&armed, &args, &cgroupfs, inventory.node_cgroup())?;
    let mut probes = armed.probes;
    let mut kernel_log = None;
    if let Some(probes) = probes.as_mut() {
        info!(programs = ?probes.program_ids(), "eBPF programs attached");
        if args.bpf_log {
            kernel_log = Some(tokio::spawn(probes.kernel_logger()?.run()));
        }
    }
    let events = match probes.as_mut() {
        Some(probes) => Some(probes.take_events()?),
        None => None,
    };
    let kernel_triggers = probes.is_some();
    let mut monitor = Monitor::new(
        cgroupfs.clone(),
        args.watches(),
        probes,
        metrics.clone(),
        MonitorOptions {
            memory_hysteresis: args.memory_hysteresis,
            pids_hysteresis: args.pids_hysteresis,
        },
    );
    let mut evictor = Evictor::new(
        config,
        inventory,
        Killer::new(cgroupfs.clone()),
        cgroupfs,
        metrics.clone(),
        EvictorOptions {
            policy: if args.policy.evict_set {
                VictimPolicy::CoveringSet
            } else {
                VictimPolicy::One
            },
            dry_run: args.dry_run,
            reclaim_timeout: args.reclaim_timeout,
            kernel_triggers,
        },
        // Shadow mode writes nothing to the API.
        kubernetes.filter(|_| !args.dry_run),
    );
    if args.dry_run {
        warn!("--dry-run: evictions are decided and reported, nothing is killed");
    }
    monitor.install_all();

    let ready = Arc::new(AtomicBool::new(false));
    let endpoint = Endpoint::start(
        metrics.clone(),
        ready.clone(),
        args.metrics_address,
        EndpointLimits::default(),
    )?;
    info!(address = %endpoint.address(), "serving /metrics and /healthz");
    evictor.thaw_abandoned_pods();
    // What a restart costs the node: from here on the engine decides (the
    // first run follows at once) and the kernel watches.
    let startup = started.elapsed();
    metrics.startup.set(startup.as_secs_f64());
    info!(startup_ms = startup.as_millis() as u64, "protection armed");

    let timer_source = if args.mode.housekeeping() {
        "poll"
    } else {
        "resync"
    };
    let result = serve(
        &mut monitor,
        &mut evictor,
        Sources {
            events,
            notifier,
            check_interval,
            timer_source,
        },
        &ready,
        shutdown,
    )
    .await;
    info!("shutting down");
    evictor.shutdown_kubernetes(REPORT_FLUSH);
    drop(endpoint);
    if let Some(task) = kernel_log {
        task.abort();
    }
    // Dropping the probes detaches every program and frees every map.
    if let Some(probes) = monitor.into_probes() {
        drop(probes);
        info!("all eBPF programs detached");
    }
    result.map_err(RunError::from)
}

/// What wakes the engine besides the close-watch deadline.
struct Sources {
    /// Kernel records (event mode).
    events: Option<crate::bpf::EventStream>,
    /// The push mechanism of --mode psi or memcg-threshold.
    notifier: Option<Notifier>,
    check_interval: Duration,
    /// The trigger `source` of timer runs: `resync` or `poll`.
    timer_source: &'static str,
}

/// Feeds kernel records to the monitor and wakes the evictor on a crossing
/// of one of its scopes, on a notification, on the timer, and on the
/// close-watch deadline it asks for, until `shutdown` resolves.
async fn serve(
    monitor: &mut Monitor,
    evictor: &mut Evictor,
    sources: Sources,
    ready: &AtomicBool,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BpfError> {
    let Sources {
        mut events,
        mut notifier,
        check_interval,
        timer_source,
    } = sources;
    // The first run is now, not a tick later: an agent restarted on a node
    // already under pressure acts at once.
    let first = evictor.evaluate(Trigger::now("startup"), monitor).await;
    rearm(notifier.as_mut(), evictor);
    // Ready (/readyz) once the node has been looked at and, under pressure,
    // relieved: a rolling update moves on only then.
    ready.store(true, Ordering::Release);
    let mut close_watch = first.map(|after| tokio::time::Instant::now() + after);
    let mut timer =
        tokio::time::interval_at(tokio::time::Instant::now() + check_interval, check_interval);
    timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut batch = Vec::new();
    tokio::pin!(shutdown);
    loop {
        let wake_at = close_watch;
        let next = tokio::select! {
            () = &mut shutdown => return Ok(()),
            result = next_batch(events.as_mut(), &mut batch) => {
                result?;
                let mut trigger = None;
                for record in batch.drain(..) {
                    match record {
                        Ok(received) => {
                            let at_ns = received.event.timestamp_ns();
                            if monitor.handle(received) && trigger.is_none() {
                                trigger = Some(Trigger { source: "kernel", at_ns });
                            }
                        }
                        Err(e) => monitor.decode_error(&e),
                    }
                }
                if monitor.recover_lost_records() && trigger.is_none() {
                    trigger = Some(Trigger::now("resync"));
                }
                match trigger {
                    Some(trigger) => evictor.evaluate(trigger, monitor).await,
                    None => continue,
                }
            }
            notified = next_notification(notifier.as_mut()) => {
                let source = notifier.as_ref().map_or("notifier", Notifier::source);
                match notified {
                    Ok(at_ns) => {
                        monitor.check_all();
                        evictor.evaluate(Trigger { source, at_ns }, monitor).await
                    }
                    Err(e) => {
                        error!(error = %e, period = ?check_interval,
                            "kernel notifications failed: POLLING cgroupfs only");
                        notifier = None;
                        continue;
                    }
                }
            }
            _ = timer.tick() => {
                monitor.check_all();
                evictor.evaluate(Trigger::now(timer_source), monitor).await
            }
            () = sleep_until(wake_at), if wake_at.is_some() => {
                evictor.evaluate(Trigger::now("close-watch"), monitor).await
            }
        };
        close_watch = next.map(|after| tokio::time::Instant::now() + after);
        rearm(notifier.as_mut(), evictor);
    }
}

async fn next_notification(notifier: Option<&mut Notifier>) -> Result<u64, NotifyError> {
    match notifier {
        Some(notifier) => notifier.wait().await,
        None => std::future::pending().await,
    }
}

/// Moves memory thresholds to where the thresholds could next be met, on
/// fresh numbers after each engine run (kubelet re-arms on each sync).
fn rearm(notifier: Option<&mut Notifier>, evictor: &Evictor) {
    if let Some(Notifier::MemcgThresholds(thresholds)) = notifier
        && let Some(levels) = evictor.memcg_notification_levels()
        && let Err(e) = thresholds.arm(&levels)
    {
        warn!(error = %e, "cannot re-arm the memory thresholds; the timer still polls");
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
