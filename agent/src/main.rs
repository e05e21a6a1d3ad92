use std::process::ExitCode;

use clap::Parser as _;
use evictd::{
    config::{
        Cli, Command, EvictionArgs, ExplainArgs, InventoryArgs, LogFormat, SeccompProfileArgs,
        SimulateArgs,
    },
    decide::thresholds::EvictionConfig,
    node::cgroupfs::CgroupFs,
    node::inventory::{Inventory, InventoryError},
    node::runtime::{RuntimeClient, reading::DiskReading},
    report::decisions::{self, DecisionsError},
    run::{seccomp, simulate},
    state::StateDir,
};
use tracing_subscriber::EnvFilter;

/// Exit status for invalid configuration or input, as clap and the
/// simulate contract use it.
const USAGE_ERROR: u8 = 2;
/// How long the exit waits for the runtime's blocking threads: a reaper
/// finishes in milliseconds unless its victim's memory is locked.
const BLOCKING_THREADS_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(1);

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return usage_error(e),
    };
    let args = match cli.command {
        Some(Command::Run(args)) => *args,
        None => cli.run,
        Some(Command::Simulate(args)) => return simulate(&args),
        Some(Command::Snapshot(args)) => return snapshot(&args),
        Some(Command::Explain(args)) => return explain(&args),
        Some(Command::Thresholds(args)) => return thresholds(&args),
        Some(Command::SeccompProfile(args)) => return seccomp_profile(&args),
    };
    // Bad configuration stops the agent before it touches anything.
    let (config, warnings) = match args.eviction.resolve_with_warnings() {
        Ok(resolved) => resolved,
        Err(e) => return usage_error(e),
    };
    let image_minimum_gc_age = match args.image_minimum_gc_age() {
        Ok(age) => age,
        Err(e) => return usage_error(e),
    };
    let inventory = match open_inventory(&args.inventory) {
        Ok(inventory) => inventory,
        Err(e) if e.is_input_error() => return usage_error(e),
        Err(e) => {
            eprintln!("evictd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Text => {
            evictd::logs::write_quantities(true);
            builder.init();
        }
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(evictd::act::kill::BLOCKING_THREADS_KEEP_ALIVE)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("evictd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Handlers first: a SIGTERM while the programs load must stop the agent
    // cleanly once they are loaded, not kill it where it stands.
    let shutdown = {
        let _context = runtime.enter();
        shutdown_signal()
    };
    let settings = evictd::run::daemon::Settings {
        eviction: config,
        image_minimum_gc_age,
    };
    let result = runtime.block_on(evictd::run::daemon::run(
        args, settings, inventory, shutdown,
    ));
    // A reaper still blocked on a victim's mmap lock (act::kill) must not
    // hold the exit: dropping the runtime would wait for it forever.
    runtime.shutdown_timeout(BLOCKING_THREADS_AT_EXIT);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_input_error() => usage_error(e),
        Err(e) => {
            tracing::error!("{:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
    }
}

/// `evictd thresholds`: the parsed thresholds as one JSON array.
fn thresholds(args: &EvictionArgs) -> ExitCode {
    let config = match resolve(args) {
        Ok(config) => config,
        Err(code) => return code,
    };
    print_json(serde_json::to_string(&config.thresholds))
}

/// `evictd seccomp-profile`: the embedded profile, printed or installed.
fn seccomp_profile(args: &SeccompProfileArgs) -> ExitCode {
    match &args.install {
        None => {
            print!("{}", seccomp::PROFILE);
            ExitCode::SUCCESS
        }
        Some(dir) => match seccomp::install(dir) {
            Ok(path) => {
                println!("evictd: seccomp profile installed as {}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("evictd: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `evictd explain`: the last decisions of the agent's record, for a person.
fn explain(args: &ExplainArgs) -> ExitCode {
    if !args.state_dir.is_dir() {
        eprintln!(
            "evictd: no decision record: {} is not a directory (the agent's --state-dir)",
            args.state_dir.display()
        );
        return ExitCode::FAILURE;
    }
    let records = StateDir::open(&args.state_dir)
        .map_err(DecisionsError::from)
        .and_then(|dir| decisions::read_records(&dir));
    match records {
        Ok(records) if records.is_empty() => {
            println!(
                "no decisions recorded in {} (none made yet, or --decision-records 0)",
                args.state_dir.display()
            );
            ExitCode::SUCCESS
        }
        Ok(records) => {
            let shown = &records[records.len().saturating_sub(args.last)..];
            let text: Vec<String> = shown.iter().map(decisions::explain).collect();
            print!("{}", text.join("\n"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("evictd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `evictd snapshot`: the live node as one JSON object on stdout.
fn snapshot(args: &InventoryArgs) -> ExitCode {
    let result = open_inventory(args).and_then(|mut inventory| inventory.snapshot(0.0));
    let mut snapshot = match result {
        Ok(snapshot) => snapshot,
        Err(e) if e.is_input_error() => return usage_error(e),
        Err(e) => {
            eprintln!("evictd: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(endpoint) = &args.container_runtime_endpoint {
        match read_disk(endpoint, &args.nodefs_path) {
            Ok(reading) => reading.fill(&mut snapshot),
            Err(e) => {
                eprintln!("evictd: {e:#}");
                return ExitCode::FAILURE;
            }
        }
    }
    print_json(serde_json::to_string_pretty(&snapshot))
}

/// The runtime's filesystems and the pods' disk usage, read once.
fn read_disk(endpoint: &str, kubelet_root: &std::path::Path) -> anyhow::Result<DiskReading> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut client = RuntimeClient::connect(endpoint).await?;
        Ok(DiskReading::read(&mut client, kubelet_root).await?)
    })
}

fn open_inventory(args: &InventoryArgs) -> Result<Inventory, InventoryError> {
    Inventory::new(CgroupFs::discover()?, &args.options())
}

fn print_json(json: serde_json::Result<String>) -> ExitCode {
    match json {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("evictd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `evictd simulate`: decisions on stdout, one line per snapshot.
fn simulate(args: &SimulateArgs) -> ExitCode {
    let config = match resolve(&args.eviction) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let mut stdout = std::io::stdout().lock();
    let replay = if args.eviction.sets_thresholds() {
        simulate::Replay::CommandLineThresholds
    } else {
        simulate::Replay::RecordedThresholds
    };
    match simulate::run_file(&config, args.policy, replay, &args.snapshot, &mut stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_input_error() => usage_error(e),
        Err(e) => {
            eprintln!("evictd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The eviction configuration of a command that runs once, its warnings on
/// stderr; the exit status after reporting invalid configuration.
fn resolve(args: &EvictionArgs) -> Result<EvictionConfig, ExitCode> {
    let (config, warnings) = args.resolve_with_warnings().map_err(usage_error)?;
    for warning in warnings {
        eprintln!("evictd: warning: {warning}");
    }
    Ok(config)
}

/// One line on stderr, quoting the offending text, exit 2: what scripts and
/// the simulate contract expect, rather than clap's multi-line usage.
fn usage_error(error: impl std::fmt::Display) -> ExitCode {
    let message = error.to_string();
    // clap's message ends at the blank line before its usage text.
    let summary: Vec<&str> = message
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let summary = summary.join(" ");
    eprintln!(
        "evictd: {}",
        summary.strip_prefix("error: ").unwrap_or(&summary)
    );
    ExitCode::from(USAGE_ERROR)
}

/// Installs the SIGINT and SIGTERM (what kubelet sends a DaemonSet pod)
/// handlers now, in the runtime's context, and resolves on either.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(mut interrupt), Ok(mut terminate)) = handlers else {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
        }
    }
}
