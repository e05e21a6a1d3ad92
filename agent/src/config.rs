//! Command line. Every default is written once, here, with where it comes
//! from.
use std::{net::SocketAddr, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{duration, quantity::Quantity, watch::WatchSpec};

#[derive(Debug, Parser)]
#[command(
    name = "evictd",
    version,
    about = "Kubernetes node agent: detects memory and PID pressure in the kernel with eBPF",
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
    Run(RunArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Kernel programs push threshold crossings; cgroupfs is re-read every
    /// --resync-interval to repair anything lost.
    Event,
    /// No eBPF: read cgroupfs every --housekeeping-interval, as kubelet does.
    Poll,
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
    #[arg(long, value_enum, default_value_t = Mode::Event)]
    pub mode: Mode,

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
    /// kernel program. Bounds how far past a threshold usage can get before
    /// the kernel notices; 256Ki costs one read per 64 pages of churn.
    #[arg(long, value_name = "BYTES", default_value = "256Ki", value_parser = parse_bytes)]
    pub memory_check_step: u64,

    /// In event mode, how often every scope is re-read from cgroupfs to
    /// repair a lost record; also the polling period of a resource the kernel
    /// cannot watch (e.g. no memcg tracepoints).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_period)]
    pub resync_interval: Duration,

    /// Polling period in --mode poll. 10s is kubelet's housekeeping interval.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_period)]
    pub housekeeping_interval: Duration,

    /// Address of the Prometheus endpoint (/metrics, /healthz). Loopback by
    /// default; a DaemonSet sets 0.0.0.0:9808.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9808")]
    pub metrics_address: SocketAddr,

    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Forward the eBPF programs' own debug log (aya-log) to the agent log.
    #[arg(long)]
    pub bpf_log: bool,
}

impl RunArgs {
    pub fn watches(&self) -> Vec<WatchSpec> {
        self.watch_memory
            .iter()
            .chain(&self.watch_pids)
            .chain(&self.watch_node_pids)
            .cloned()
            .collect()
    }
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    let quantity = Quantity::parse(text).map_err(|e| e.to_string())?;
    if quantity.is_negative() {
        return Err(format!("{text:?} must not be negative"));
    }
    Ok(quantity.value() as u64)
}

fn parse_period(text: &str) -> Result<Duration, String> {
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
    fn bare_evictd_runs_with_defaults() {
        let cli = parse(&[]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.mode, Mode::Event);
        assert_eq!(cli.run.memory_check_step, 256 * 1024);
        assert_eq!(cli.run.housekeeping_interval, Duration::from_secs(10));
        assert!(cli.run.watches().is_empty());
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
        ] {
            let err = parse(&[arg]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{arg}");
            assert_eq!(err.exit_code(), 2);
            assert!(err.to_string().contains(&format!("{quoted:?}")), "{err}");
        }
    }
}
