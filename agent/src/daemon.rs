//! `evictd run`: discovers the node, loads the kernel programs (or says why
//! it cannot and polls instead), and serves until told to stop.
use std::{future::Future, path::Path};

use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::{
    bpf::{BpfError, ProbeOptions, Probes, Resource},
    cgroup::{CgroupError, CgroupFs},
    config::{Mode, RunArgs},
    kernel_layout::{KernelBtf, VMLINUX_BTF},
    metrics::{Metrics, MetricsError},
    monitor::{Monitor, MonitorOptions},
};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Bpf(#[from] BpfError),
}

/// Runs the agent until `shutdown` resolves. On return every program is
/// detached and every map freed.
pub async fn run(args: RunArgs, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let metrics = Metrics::new()?;
    let cgroupfs = CgroupFs::discover()?;
    info!(version = ?cgroupfs.version, memory = %cgroupfs.memory_root.display(),
        pids = ?cgroupfs.pids_root, "cgroup hierarchies");

    let mut probes = match args.mode {
        Mode::Poll => None,
        Mode::Event => match load_probes(&args) {
            Ok(probes) => Some(probes),
            Err(e) => {
                error!(error = %e, period = ?args.resync_interval,
                    "eBPF programs unavailable: POLLING cgroupfs instead of kernel events");
                None
            }
        },
    };
    let mut kernel_log = None;
    if let Some(probes) = probes.as_mut() {
        for missing in probes.unattached() {
            warn!(
                program = missing.program,
                tracepoint = missing.tracepoint,
                reason = missing.reason,
                "program not attached"
            );
        }
        info!(programs = ?probes.program_ids(), "eBPF programs attached");
        if args.bpf_log {
            kernel_log = Some(tokio::spawn(probes.kernel_logger()?.run()));
        }
    }
    let events = match probes.as_mut() {
        Some(probes) => Some(probes.take_events()?),
        None => None,
    };
    let check_interval = match args.mode {
        Mode::Poll => args.housekeeping_interval,
        Mode::Event => args.resync_interval,
    };
    let mut monitor = Monitor::new(
        cgroupfs,
        args.watches(),
        probes,
        metrics.clone(),
        MonitorOptions {
            memory_hysteresis: args.memory_hysteresis,
            pids_hysteresis: args.pids_hysteresis,
            check_interval,
        },
    );
    for resource in [Resource::Memory, Resource::Pids] {
        let trigger = if monitor.kernel_watches(resource) {
            "bpf"
        } else {
            "poll"
        };
        metrics
            .trigger
            .with_label_values(&[resource.as_str(), trigger])
            .set(1);
        if trigger == "poll" && args.mode == Mode::Event {
            warn!(resource = resource.as_str(), period = ?check_interval,
                "no kernel trigger for this resource: POLLING cgroupfs");
        } else {
            info!(resource = resource.as_str(), trigger, "trigger");
        }
    }
    if args.watches().is_empty() {
        warn!("nothing to watch: add --watch-memory, --watch-pids or --watch-node-pids");
    }
    monitor.install_all();

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut server_stop = stop_rx.clone();
    let (address, server) = crate::metrics::serve(metrics, args.metrics_address, async move {
        // Either a stop or the sender dropping ends the server.
        let _ = server_stop.wait_for(|stop| *stop).await;
    })
    .await?;
    let server = tokio::spawn(server);
    info!(%address, "serving /metrics and /healthz");

    let result = monitor.run(events, shutdown).await;
    info!("shutting down");
    let _ = stop_tx.send(true);
    if let Ok(Err(e)) = server.await {
        warn!(error = %e, "metrics endpoint");
    }
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

fn load_probes(args: &RunArgs) -> Result<Probes, BpfError> {
    let btf = KernelBtf::open(Path::new(VMLINUX_BTF))?;
    Probes::load(
        &btf,
        ProbeOptions {
            check_step_bytes: args.memory_check_step,
            kernel_log: args.bpf_log,
        },
    )
}
