//! The measurement and demonstration tools of the `tools/` crate:
//! `cargo xtask demo`, `bpf-cost`, `hook-tax`, `stats-tax` and
//! `measure-triggers` (and the builds `cargo xtask bench` shares). Each runs
//! a tool as root, against real cgroups and the real agent but for
//! `stats-tax`, which times empty programs alone.
use std::{path::PathBuf, process::Command};

use anyhow::{Result, bail};
use clap::Args;

use crate::{agent, setup, vm};

#[derive(Args)]
pub struct BpfCostArgs {
    /// Free/re-touch rounds of 128 MiB.
    #[arg(long, default_value_t = 40)]
    rounds: u32,
    /// How tasks are watched: `cgroup` (a line in the churning cgroup,
    /// crossed each round: forks walk pids cgroups) or `node` (node-wide
    /// only: forks read the node's count alone).
    #[arg(long, default_value = "cgroup", value_parser = ["cgroup", "node"])]
    pids: String,
    /// Extra agent arguments, e.g. `-- --memory-check-step 1Mi`.
    #[arg(last = true)]
    agent_args: Vec<String>,
}

#[derive(Args)]
pub struct HookTaxArgs {
    /// Rounds; each runs every configuration once.
    #[arg(long, default_value_t = 7)]
    rounds: u32,
}

#[derive(Args)]
pub struct StatsTaxArgs {
    /// Rounds; each times every configuration once.
    #[arg(long, default_value_t = 21)]
    rounds: u32,
}

#[derive(Args)]
pub struct MeasureTriggersArgs {
    /// Crossings measured per hook and scenario.
    #[arg(long, default_value_t = 10)]
    runs: u32,
    /// Measure in the Linux guest of `cargo xtask test --vm`.
    #[arg(long)]
    vm: bool,
    #[command(flatten)]
    kernel: vm::GuestKernel,
}

/// `cargo xtask demo`.
pub fn demo() -> Result<()> {
    let release = build(true, "the demo sandboxes pods in cgroups")?;
    setup::step(
        "demo",
        Command::new(release.join("evictd-demo"))
            .arg(release.join("evictd"))
            .arg(release.join("evictd-workload")),
    )
}

/// `cargo xtask bpf-cost`.
pub fn bpf_cost(args: &BpfCostArgs) -> Result<()> {
    let release = build(true, "measuring BPF programs")?;
    setup::step(
        "measure",
        Command::new(release.join("evictd-bpf-cost"))
            .arg(release.join("evictd"))
            .arg(release.join("evictd-workload"))
            .arg(args.rounds.to_string())
            .arg(&args.pids)
            .args(&args.agent_args),
    )
}

/// `cargo xtask hook-tax`.
pub fn hook_tax(args: &HookTaxArgs) -> Result<()> {
    let release = build(true, "measuring what the memory hooks cost a workload")?;
    setup::step(
        "measure",
        Command::new(release.join("evictd-hook-tax"))
            .arg(release.join("evictd"))
            .arg(release.join("evictd-workload"))
            .arg(args.rounds.to_string()),
    )
}

/// `cargo xtask stats-tax`.
pub fn stats_tax(args: &StatsTaxArgs) -> Result<()> {
    let release = build(true, "measuring what a BPF program and its statistics cost")?;
    setup::step(
        "measure",
        Command::new(release.join("evictd-stats-tax")).arg(args.rounds.to_string()),
    )
}

/// `cargo xtask measure-triggers`.
pub fn measure_triggers(args: &MeasureTriggersArgs) -> Result<()> {
    let release = build(true, "measuring triggers")?;
    let command = [
        release.join("evictd-memory-triggers"),
        release.join("evictd-workload"),
    ];
    if args.vm {
        vm::run(
            &crate::target_dir()?,
            &args.kernel.kernel,
            &command,
            &[args.runs.to_string()],
        )
    } else {
        setup::step(
            "measure",
            Command::new(&command[0])
                .arg(&command[1])
                .arg(args.runs.to_string()),
        )
    }
}

/// Builds the agent, the workload and the tools and returns their
/// directory; `why_root` says why the task needs root.
pub fn build(release: bool, why_root: &str) -> Result<PathBuf> {
    let toolchain = setup::ensure()?;
    agent::build(&toolchain, release, false)?;
    let mut cargo = toolchain.cargo_host();
    cargo.args([
        "build",
        "--package",
        "evictd-integration",
        "--package",
        "evictd-tools",
        "--bins",
    ]);
    if release {
        cargo.arg("--release");
    }
    setup::step("build the workload and the tools", &mut cargo)?;
    if !setup::is_root() {
        bail!("{why_root}: run as root");
    }
    Ok(crate::target_dir()?.join(agent::profile_dir(release)))
}
