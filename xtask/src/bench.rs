//! `cargo xtask bench`: builds the agent and the bench tools, runs
//! evictd-bench on a sandbox node, draws the plots, and with `--quick`
//! checks that every scenario and mode produced results (a smoke test for
//! CI, not a timing test).
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

/// `--quick`: one round of every mode at 1 GiB/s (with the oracle) and the
/// fork bomb, the pod-count scenario at its two ends, and the overhead
/// operations once each with event mode against no agent.
const QUICK_ARGS: [&str; 14] = [
    "--runs",
    "1",
    "--rates",
    "1Gi",
    "--idle",
    "2s",
    "--pod-counts",
    "10,250",
    "--overhead-reps",
    "1",
    "--overhead-modes",
    "event",
    "--overhead-bytes",
    "64Mi",
];

#[derive(Args)]
pub struct BenchArgs {
    /// Smoke test: one round at 1 GiB/s (every mode and the oracle), the
    /// fork bomb, 10 and 250 pods, the overhead operations once (event mode
    /// and no agent), 2 s idle, on the debug build, into target/bench-quick;
    /// fails unless every scenario and mode produced results.
    #[arg(long)]
    quick: bool,
    /// Where the results go.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// evictd-bench arguments, e.g. `-- --runs 30 --rates 256Mi,1Gi`
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
        check_every_scenario_produced_results(&out)?;
    }
    println!(
        "xtask: results in {}: bench.json, bench.md, {}",
        out.display(),
        PLOTS.join(", ")
    );
    Ok(())
}

/// What bench_plot.py draws.
const PLOTS: [&str; 2] = ["memory-back.png", "pod-count.png"];

/// Draws the plots with matplotlib from a venv made once.
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

/// Every mode ran in every scenario it applies to, and each run has an
/// outcome: for the bombs, the crossing was seen and the agent (or the
/// oracle) decided or the kernel won, and memory came back after a kill;
/// for the overhead, every operation was timed and nothing was evicted. No
/// agent held evictions for pressure outside the pods.
fn check_every_scenario_produced_results(out: &Path) -> Result<()> {
    let results: Value = serde_json::from_slice(&fs::read(out.join("bench.json"))?)?;
    let empty = Vec::new();
    let runs = results["runs"].as_array().unwrap_or(&empty);
    let scenarios = results["scenarios"].as_array().unwrap_or(&empty);
    let mut missing = Vec::new();
    for scenario in scenarios {
        let overhead = scenario["kind"] == "overhead";
        for mode in scenario["modes"].as_array().unwrap_or(&empty) {
            let mode_runs: Vec<&Value> = runs
                .iter()
                .filter(|r| r["scenario"] == scenario["name"] && r["mode"] == *mode)
                .map(|r| &r["run"])
                .collect();
            let complete = |run: &&Value| {
                if overhead {
                    return ["fault_ns", "unmap_ns", "kill_ns"]
                        .iter()
                        .all(|op| run[op].as_array().is_some_and(|t| !t.is_empty()))
                        && run["evictions"].as_u64() == Some(0);
                }
                if run["decided_without_crossing"] == true {
                    // The agent decided before the node crossed: nothing
                    // to measure from, but an outcome.
                    return true;
                }
                let kernel_won = run["kernel_kills"].as_u64() > Some(0);
                let decided = !run["decided_us"].is_null();
                // A kill by the agent or the oracle brings memory back.
                let back_expected = decided && !kernel_won && scenario["kind"] != "fork-bomb";
                !run["crossed_ns"].is_null()
                    && (decided || kernel_won)
                    && (!back_expected || !run["back_us"].is_null())
            };
            if mode_runs.is_empty() || !mode_runs.iter().all(complete) {
                missing.push(format!(
                    "{} / {}",
                    scenario["name"].as_str().unwrap_or_default(),
                    mode.as_str().unwrap_or_default()
                ));
            }
        }
    }
    if !missing.is_empty() {
        bail!("without a complete result: {}", missing.join(", "));
    }
    let held: Vec<&Value> = runs
        .iter()
        .filter(|r| {
            r["run"]["problems"].as_array().is_some_and(|p| {
                p.iter()
                    .any(|m| m.as_str().is_some_and(|m| m.contains("outside the pods")))
            })
        })
        .collect();
    if !held.is_empty() {
        bail!(
            "{} runs looked like pressure outside the pods to the agent: {}",
            held.len(),
            held.iter()
                .map(|r| format!("{} / {}", r["scenario"], r["mode"]))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!(
        "xtask: bench smoke test: all {} scenarios produced results in every mode",
        scenarios.len()
    );
    Ok(())
}
