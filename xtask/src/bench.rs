//! `cargo xtask bench`: builds the agent and the bench tools, runs
//! evictd-bench on a sandbox node, draws the plot, and with `--quick` checks
//! that every mode produced results (a smoke test for CI, not a timing test).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde_json::Value;

use crate::{setup, tools};

/// matplotlib for the plot, pinned, in a venv under the target directory.
const MATPLOTLIB: &str = "matplotlib==3.9.2";

/// `--quick`: one round of every mode at 1 GiB/s and the fork bomb.
const QUICK_ARGS: [&str; 6] = ["--runs", "1", "--rates", "1Gi", "--idle", "2s"];

#[derive(Args)]
pub struct BenchArgs {
    /// Smoke test: one round at 1 GiB/s and the fork bomb, 2 s idle, on the
    /// debug build, into target/bench-quick; fails unless every mode
    /// produced results.
    #[arg(long)]
    quick: bool,
    /// Where the results go.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// evictd-bench arguments, e.g. `-- --runs 20 --rates 256Mi,1Gi`
    /// (`-- --help` lists them).
    #[arg(last = true)]
    bench_args: Vec<String>,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let quick = args.quick;
    // The smoke test runs the debug build `cargo xtask test` already made;
    // published numbers come from release builds.
    let tools = tools::build(!quick, "the bench sandboxes pods in cgroups")?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent directory")?;
    let out = match (args.out.clone(), quick) {
        (Some(out), _) => out,
        (None, true) => crate::target_dir()?.join("bench-quick"),
        (None, false) => workspace.join("results"),
    };
    let mut bench = Command::new(tools.join("evictd-bench"));
    bench
        .arg("--evictd")
        .arg(tools.join("evictd"))
        .arg("--workload")
        .arg(tools.join("evictd-workload"))
        .arg("--out")
        .arg(&out);
    if quick {
        bench.args(QUICK_ARGS);
    }
    setup::step("bench", bench.args(&args.bench_args))?;
    plot(&out, workspace)?;
    if quick {
        check_every_mode_produced_results(&out)?;
    }
    println!(
        "xtask: results in {}: bench.json, bench.md, bench.png",
        out.display()
    );
    Ok(())
}

/// Draws bench.png with matplotlib from a venv made once.
fn plot(out: &Path, workspace: &Path) -> Result<()> {
    let venv = crate::target_dir()?.join("bench-venv");
    let python = venv.join("bin/python3");
    if !python.exists() {
        setup::step(
            "python venv for the plot",
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
        )?;
    }
    let installed = Command::new(&python)
        .args(["-c", "import matplotlib"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        setup::step(
            "install matplotlib",
            Command::new(&python).args(["-m", "pip", "install", "--quiet", MATPLOTLIB]),
        )?;
    }
    setup::step(
        "plot",
        Command::new(&python)
            .arg(workspace.join("xtask/bench_plot.py"))
            .arg(out),
    )
}

/// Every mode ran in every scenario it applies to and each run has an
/// outcome: the crossing was seen, and the agent decided or the kernel won.
fn check_every_mode_produced_results(out: &Path) -> Result<()> {
    let results: Value = serde_json::from_slice(&fs::read(out.join("bench.json"))?)?;
    let empty = Vec::new();
    let runs = results["runs"].as_array().unwrap_or(&empty);
    let mut missing = Vec::new();
    for mode in results["modes"].as_array().unwrap_or(&empty) {
        let mode_runs: Vec<&Value> = runs.iter().filter(|r| r["mode"] == *mode).collect();
        let complete = |run: &&Value| {
            let run = &run["run"];
            !run["crossed_ns"].is_null()
                && (!run["decided_us"].is_null() || run["kernel_kills"].as_u64() > Some(0))
        };
        if mode_runs.is_empty() || !mode_runs.iter().all(complete) {
            missing.push(mode.to_string());
        }
    }
    if !missing.is_empty() {
        bail!("modes without a complete result: {}", missing.join(", "));
    }
    let modes = results["modes"].as_array().map_or(0, Vec::len);
    println!("xtask: bench smoke test: all {modes} modes produced results");
    Ok(())
}
