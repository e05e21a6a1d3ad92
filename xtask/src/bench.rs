//! `cargo xtask bench`: builds the agent and the bench tools, runs
//! evictd-bench on a sandbox node and the ranking micro-benchmark
//! (evictd-rank-bench), draws the plots, and with `--quick` checks that
//! every scenario and mode produced results (a smoke test for CI, not a
//! timing test). `--rank` runs the micro-benchmark alone.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde_json::Value;

use crate::{setup, tools, vm};

/// matplotlib for the plot, pinned, in a venv under the target directory.
const MATPLOTLIB: &str = "matplotlib==3.9.2";

/// `--quick`: one round of every mode at 1 GiB/s (with the oracle) and the
/// fork bomb, the pod-count scenario at 250 pods, the overhead operations
/// once each with event mode against no agent, and the thrashing pod with
/// and without `--thrashing-eviction`; 1 s idle. What it
/// adds to the smoke test's time is kept small: CI runs it.
const QUICK_ARGS: [&str; 14] = [
    "--runs",
    "1",
    "--rates",
    "1Gi",
    "--idle",
    "1s",
    "--pod-counts",
    "250",
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
    /// fork bomb, 250 pods, the overhead operations once (event mode and no
    /// agent), 1 s idle, the ranking 50 times, on the debug build, into
    /// target/bench-quick; fails unless every scenario and mode produced
    /// results.
    #[arg(long)]
    quick: bool,
    /// Only the ranking micro-benchmark (kubelet's ranking of 1,000 pods,
    /// timed against its 1 ms goal; release build, no root, no sandbox):
    /// prints its table and writes rank.md to the results directory.
    #[arg(long, conflicts_with = "quick")]
    rank: bool,
    /// Where the results go.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Run the bench in the VM guest of `cargo xtask test --vm` (cgroup
    /// v2, software emulation, 2.5 GiB), on the guest's root as a real
    /// node: `--node root`, every v2 mode, earlyoom as a peer, the kernel's
    /// OOM killer without an agent. Results go to results/v2-<kernel>.
    /// `touch <run directory>/stop` (printed at the start) ends it after
    /// the run under way, with the complete rounds.
    #[arg(long, conflicts_with_all = ["quick", "rank"])]
    vm: bool,
    #[command(flatten)]
    kernel: vm::GuestKernel,
    /// Keep every agent's log in DIR, one JSON-lines file per run (with
    /// `--vm`, brought back from the guest). `-- --agent-log-level debug`
    /// adds a line per engine run.
    #[arg(long, value_name = "DIR")]
    agent_logs: Option<PathBuf>,
    /// evictd-bench arguments, e.g. `-- --runs 30 --rates 256Mi,1Gi`
    /// (`-- --help` lists them).
    #[arg(last = true)]
    bench_args: Vec<String>,
}

/// Rankings the micro-benchmark times per signal: its default in the full
/// bench, fewer on the smoke test's debug build.
const RANK_RUNS: &str = "1000";
const QUICK_RANK_RUNS: &str = "50";

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.rank {
        return rank_only(args);
    }
    if args.vm {
        return in_vm(args);
    }
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
        // The thrashing scenario's cold files need a disk, which the
        // target directory is.
        let files = crate::target_dir()?.join("tmp");
        fs::create_dir_all(&files).with_context(|| format!("creating {}", files.display()))?;
        bench.arg("--thrashing-dir").arg(files);
    }
    if let Some(dir) = &args.agent_logs {
        bench.arg("--agent-logs").arg(dir);
    }
    setup::step("bench", bench.args(&args.bench_args))?;
    let ranking = rank_bench(
        &tools,
        &out,
        if quick { QUICK_RANK_RUNS } else { RANK_RUNS },
    )?;
    // bench.md ends with the micro-benchmark, run on the same machine.
    let bench_md = out.join("bench.md");
    let mut tables =
        fs::read_to_string(&bench_md).with_context(|| format!("reading {}", bench_md.display()))?;
    tables += &format!("\n## {RANK_SECTION}\n\n{ranking}");
    fs::write(&bench_md, tables).with_context(|| format!("writing {}", bench_md.display()))?;
    plot(&out, workspace)?;
    if quick {
        check_every_scenario_produced_results(&out)?;
    }
    println!(
        "xtask: results in {}: bench.json, bench.md, rank.md, {}",
        out.display(),
        PLOTS.join(", ")
    );
    Ok(())
}

/// The guest of `--vm`: the node is its root, about 2.4 GiB of MemTotal,
/// near the host bench's 2 GiB sandbox once the guest's kernel and the
/// binaries' page cache are in; QEMU then holds about as much on the host.
const VM_GUEST: vm::GuestSpec = vm::GuestSpec {
    memory_mib: 2560,
    // 20 rounds take hours under emulation: stop early with the stop file.
    limit: Duration::from_secs(12 * 3600),
    // A guest beside it would take the host's other core from the runs.
    side_by_side: false,
};

/// evictd-bench's arguments on the guest's root: every mode v2 has
/// (memcg-threshold is v1 only), earlyoom beside them.
/// Each is left out where the user's arguments name it.
const VM_BENCH_ARGS: [(&str, &str); 2] = [
    ("--node", "root"),
    ("--modes", "event,poll-10s,poll-1s,poll-100ms,psi,earlyoom"),
];

/// [`VM_BENCH_ARGS`] the user's `bench_args` do not name, then those.
fn vm_bench_args(bench_args: &[String]) -> Vec<String> {
    let named = |flag: &str| {
        bench_args
            .iter()
            .any(|arg| arg == flag || arg.starts_with(&format!("{flag}=")))
    };
    VM_BENCH_ARGS
        .iter()
        .filter(|(flag, _)| !named(flag))
        .flat_map(|(flag, value)| [flag.to_string(), value.to_string()])
        .chain(bench_args.iter().cloned())
        .collect()
}

/// `--vm`: the release tools built here, run in the guest from this
/// host's filesystem; the results come back through the run directory.
fn in_vm(args: &BenchArgs) -> Result<()> {
    let tools = tools::build(true, "the bench boots a VM and sandboxes pods in cgroups")?;
    let earlyoom = earlyoom()?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent directory")?;
    let target = crate::target_dir()?;
    for kernel in vm::asked_kernels(&args.kernel.kernel)? {
        let kernel = kernel.as_str();
        let script = |run: &Path| -> Result<String> {
            let mut line = vec![
                tools.join("evictd-bench"),
                "--evictd".into(),
                tools.join("evictd"),
                "--workload".into(),
                tools.join("evictd-workload"),
                "--out".into(),
                run.join("bench"),
                "--earlyoom".into(),
                earlyoom.clone(),
                "--stop-file".into(),
                run.join("stop"),
            ];
            if args.agent_logs.is_some() {
                line.extend(["--agent-logs".into(), run.join(GUEST_AGENT_LOGS)]);
            }
            line.extend(
                vm_bench_args(&args.bench_args)
                    .into_iter()
                    .map(PathBuf::from),
            );
            let line = line
                .iter()
                .map(|part| vm::quoted(part))
                .collect::<Result<Vec<_>>>()?;
            println!(
                "xtask: to end the bench with the rounds complete so far: touch {}",
                run.join("stop").display()
            );
            // The shell and the bench outlive the kernel's OOM killer (the
            // bench sets its own too); the pods and the agent get kubelet's
            // adjustments.
            Ok(format!(
                "echo -1000 > /proc/self/oom_score_adj
{}
",
                line.join(" ")
            ))
        };
        let Some(runs) = vm::run_script(&target, kernel, &VM_GUEST, "evictd-bench", script)? else {
            return Ok(());
        };
        for (release, run) in runs {
            let out = match &args.out {
                Some(out) => out.clone(),
                None => workspace.join("results").join(format!("v2-{kernel}")),
            };
            copy_files(&run.join("bench"), &out)
                .with_context(|| format!("the guest's results in {}", run.display()))?;
            plot(&out, workspace)?;
            println!(
                "xtask: Linux {release}: results in {}: bench.json, bench.md, {}",
                out.display(),
                PLOTS.join(", ")
            );
            if let Some(dir) = &args.agent_logs {
                let kept = copy_files(&run.join(GUEST_AGENT_LOGS), dir)?;
                println!(
                    "xtask: Linux {release}: {kept} agent logs in {}",
                    dir.display()
                );
            }
        }
    }
    Ok(())
}

/// Where the guest's bench keeps the agents' logs, in its run directory.
const GUEST_AGENT_LOGS: &str = "agent-logs";

/// Copies the files of directory `from` into `to` (made if missing); how
/// many.
fn copy_files(from: &Path, to: &Path) -> Result<usize> {
    fs::create_dir_all(to)?;
    let mut copied = 0;
    for entry in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        fs::copy(entry.path(), to.join(entry.file_name()))
            .with_context(|| format!("copying {}", entry.path().display()))?;
        copied += 1;
    }
    Ok(copied)
}

/// Debian's earlyoom, unpacked from its package into the cache (not
/// installed: its package starts the service on the host, which would
/// then kill processes here); the guest runs it from there.
fn earlyoom() -> Result<PathBuf> {
    let dir = setup::cache_dir()?.join("earlyoom");
    let binary = dir.join("usr/bin/earlyoom");
    if binary.exists() {
        return Ok(binary);
    }
    fs::create_dir_all(&dir)?;
    setup::step(
        "apt-get download earlyoom",
        Command::new("apt-get")
            .args(["download", "earlyoom"])
            .current_dir(&dir),
    )?;
    let package = fs::read_dir(&dir)?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no earlyoom package")?;
    setup::step(
        "unpack earlyoom",
        Command::new("dpkg-deb").arg("-x").arg(&package).arg(&dir),
    )?;
    fs::remove_file(&package)?;
    Ok(binary)
}

const RANK_SECTION: &str = "Ranking of 1,000 pods (micro-benchmark, `cargo xtask bench --rank`)";

/// `--rank`: the micro-benchmark alone, on a release build.
fn rank_only(args: &BenchArgs) -> Result<()> {
    let toolchain = setup::ensure()?;
    let mut cargo = toolchain.cargo_host();
    cargo.args([
        "build",
        "--release",
        "--package",
        "evictd-tools",
        "--bin",
        "evictd-rank-bench",
    ]);
    setup::step("build evictd-rank-bench", &mut cargo)?;
    let tools = crate::target_dir()?.join(crate::agent::profile_dir(true));
    let out = match args.out.clone() {
        Some(out) => out,
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("xtask has no parent directory")?
            .join("results"),
    };
    let ranking = rank_bench(&tools, &out, RANK_RUNS)?;
    println!("{RANK_SECTION}\n\n{ranking}");
    println!("xtask: {}", out.join("rank.md").display());
    Ok(())
}

/// Runs evictd-rank-bench from `tools` with `runs` rankings per signal,
/// writes its table to `out`/rank.md and returns it.
fn rank_bench(tools: &Path, out: &Path, runs: &str) -> Result<String> {
    println!("xtask: == ranking micro-benchmark");
    let output = Command::new(tools.join("evictd-rank-bench"))
        .args(["--runs", runs])
        .output()
        .context("running evictd-rank-bench")?;
    if !output.status.success() {
        bail!(
            "evictd-rank-bench failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let table = String::from_utf8(output.stdout).context("evictd-rank-bench's table")?;
    fs::create_dir_all(out)?;
    fs::write(out.join("rank.md"), &table)
        .with_context(|| format!("writing {}", out.join("rank.md").display()))?;
    Ok(table)
}

/// What bench_plot.py draws.
const PLOTS: [&str; 3] = ["memory-back.png", "pod-count.png", "reserve-sweep.png"];

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
/// for the overhead, every operation was timed and nothing was evicted. A
/// run in which the agent held evictions for pressure outside the pods is
/// reported.
fn check_every_scenario_produced_results(out: &Path) -> Result<()> {
    let results: Value = serde_json::from_slice(&fs::read(out.join("bench.json"))?)?;
    let empty = Vec::new();
    let runs = results["runs"].as_array().unwrap_or(&empty);
    let scenarios = results["scenarios"].as_array().unwrap_or(&empty);
    let mut missing = Vec::new();
    for scenario in scenarios {
        let overhead = scenario["kind"] == "overhead";
        let thrashing = scenario["kind"] == "thrashing";
        for mode in scenario["modes"].as_array().unwrap_or(&empty) {
            let evicts = mode
                .as_str()
                .is_some_and(|m| m.ends_with("+thrashing-eviction"));
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
                if thrashing {
                    // Reported, the neighbour left alone, and the hog
                    // evicted exactly when the option says so.
                    return !run["reported_us"].is_null()
                        && run["neighbour_reported"] == false
                        && run["neighbour_alive"] == true
                        && run["evictions"].as_u64() == Some(u64::from(evicts))
                        && run["killed_us"].is_null() != evicts;
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
        // Said, not failed: on a loaded machine a fork bomb's zombies can
        // outlive the kill report (reaping is timing), which the agent reads
        // as pressure outside the pods; the smoke test checks outcomes only.
        println!(
            "xtask: WARNING: {} runs looked like pressure outside the pods to the agent: {}",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_arguments_replace_the_guests_defaults_they_name() {
        let args = |line: &[&str]| line.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            vm_bench_args(&args(&["--modes", "event", "--runs", "3"])),
            args(&["--node", "root", "--modes", "event", "--runs", "3"])
        );
        assert_eq!(
            vm_bench_args(&args(&["--node=sandbox"])),
            args(&[
                "--modes",
                "event,poll-10s,poll-1s,poll-100ms,psi,earlyoom",
                "--node=sandbox"
            ])
        );
    }
}
