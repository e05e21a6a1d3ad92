//! `cargo xtask`: the project's developer commands. Each one installs what it
//! needs first (see `setup`), so a fresh clone needs nothing else. Each
//! module owns its command's options.
mod agent;
mod bench;
mod deploy;
mod fuzz;
mod setup;
mod supply_chain;
mod test;
mod tools;
mod vm;

use std::{
    path::PathBuf,
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "evictd developer commands")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building the eBPF programs needs (idempotent).
    Setup,
    /// Build the agent with its eBPF programs embedded.
    Build(agent::BuildArgs),
    /// Build and run the agent (needs root). Arguments after `--` go to evictd.
    Run(agent::RunArgs),
    /// Measure each eBPF program's cost per invocation under memory churn
    /// (needs root; turns kernel.bpf_stats_enabled on for the run).
    BpfCost(tools::BpfCostArgs),
    /// What the memory hooks cost a workload far from every threshold:
    /// fault in, munmap and SIGKILL of 1 GiB with no agent, with the hooks
    /// detached (the default far away), attached, and attached but
    /// returning early (needs root).
    HookTax(tools::HookTaxArgs),
    /// What running any eBPF program costs a hook on this machine, and
    /// what kernel.bpf_stats_enabled adds to each run (and so to every
    /// figure bpf-cost and the bench report): empty programs on sys_enter,
    /// timed from outside (needs root).
    StatsTax(tools::StatsTaxArgs),
    /// A sandbox node with pods of every QoS class, a memory hog, evictd in
    /// event mode, and a timeline of what happened (needs root).
    Demo,
    /// What users pay: evictd's event mode against polling (10s, 1s,
    /// 100ms), a PSI trigger, cgroup v1 memcg thresholds and the kernel's
    /// floor (the oracle), on a 2 GiB sandbox node: memory bombs at several
    /// rates, a fork bomb, 10/100/250 pods, workload overhead; then the
    /// ranking micro-benchmark (needs root; `--rank` alone does not). Writes
    /// bench.json, bench.md, rank.md, memory-back.png and pod-count.png to
    /// results/ (release build).
    Bench(bench::BenchArgs),
    /// Run every cargo-fuzz target in fuzz/ for a bounded time (installs
    /// cargo-fuzz when missing) and print what each did.
    Fuzz(fuzz::FuzzArgs),
    /// Run a command as root in the Linux guest of `cargo xtask test --vm`
    /// (chrooted into this host's /, so host binaries and paths work).
    Vm(vm::VmArgs),
    /// Measure each memory trigger the kernel offers: how far past a
    /// threshold it reports, what its programs cost; and PSI and memory.high
    /// on cgroup v2 (needs root; --vm: in the QEMU guest).
    MeasureTriggers(tools::MeasureTriggersArgs),
    /// Render deploy/ with a pinned kubectl and validate every object against
    /// the Kubernetes OpenAPI schemas (installs the pinned tools under
    /// target/deploy-check on first use).
    DeployCheck,
    /// fmt check, clippy, cargo-deny (licenses, bans, sources; installs it
    /// when missing), unit tests, the deploy/ check, then the privileged
    /// integration tests.
    /// With --vm: only the privileged integration tests, inside a QEMU guest
    /// on another kernel with pure cgroup v2.
    Test(test::TestArgs),
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> Result<ExitCode> {
    match task {
        Task::Setup => setup::ensure().map(drop)?,
        Task::Build(args) => agent::build_command(&args)?,
        Task::Run(args) => return agent::run_command(&args),
        Task::Test(args) => test::run(&args)?,
        Task::DeployCheck => {
            let toolchain = setup::ensure()?;
            deploy::check(&toolchain, &workspace_root(), &target_dir()?)?;
        }
        Task::Fuzz(args) => fuzz::run(&args)?,
        Task::Bench(args) => bench::run(&args)?,
        Task::Demo => tools::demo()?,
        Task::Vm(args) => vm::command(&args)?,
        Task::MeasureTriggers(args) => tools::measure_triggers(&args)?,
        Task::BpfCost(args) => tools::bpf_cost(&args)?,
        Task::HookTax(args) => tools::hook_tax(&args)?,
        Task::StatsTax(args) => tools::stats_tax(&args)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn workspace_root() -> PathBuf {
    // xtask/ is a direct child of the workspace root.
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn target_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata")?;
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata has no target_directory")
}
