//! `cargo xtask fuzz`: every cargo-fuzz target in `fuzz/` for a bounded
//! time each, then one line per target (executions, corpus, outcome).
//! Installs cargo-fuzz when missing. The agent is built without its eBPF
//! programs (AYA_BUILD_SKIP=1): the targets exercise only what userspace
//! reads (the ring buffer's records arrive as bytes).
use std::{
    collections::VecDeque,
    fs,
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::setup::{self, Toolchain};

/// cargo-fuzz release known to work with the toolchains here.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Every target in fuzz/Cargo.toml, with the dictionary that helps it.
const TARGETS: [(&str, Option<&str>); 11] = [
    ("quantity", None),
    ("duration", None),
    ("watch", None),
    ("threshold_flags", Some("thresholds.dict")),
    ("kubelet_config", Some("thresholds.dict")),
    ("simulate", Some("simulate.dict")),
    ("cgroupfs", Some("cgroupfs.dict")),
    ("cri", None),
    ("pod", Some("pod.dict")),
    ("state_files", Some("state.dict")),
    ("ring_buffer", None),
];

/// How the targets are built: the entry points need the `libfuzzer`
/// feature; the code under test is safe Rust, so no sanitizer (twice the
/// executions), but debug assertions, so integer overflow is a crash.
const FUZZ_BUILD: [&str; 5] = [
    "--features",
    "libfuzzer",
    "--sanitizer",
    "none",
    "--debug-assertions",
];

/// A slow input is a finding too: parsing a flag or a snapshot must never
/// take seconds.
const INPUT_TIMEOUT_SECONDS: u32 = 10;
/// Memory one fuzzing process may use.
const RSS_LIMIT_MB: u32 = 2048;
/// Lines of libFuzzer's output kept to show when a target fails.
const TAIL_LINES: usize = 60;

/// What one bounded run did.
struct Run {
    target: &'static str,
    seconds: f64,
    executions: Option<u64>,
    corpus: Option<String>,
    crashed: bool,
}

#[derive(Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Targets to run; all when none is named.
    targets: Vec<String>,
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    let (seconds, only) = (args.seconds, &args.targets);
    let targets: Vec<_> = TARGETS
        .iter()
        .filter(|(name, _)| only.is_empty() || only.iter().any(|o| o == name))
        .collect();
    if let Some(unknown) = only
        .iter()
        .find(|o| !TARGETS.iter().any(|(name, _)| name == o))
    {
        bail!(
            "no fuzz target {unknown:?}; targets: {}",
            TARGETS.map(|(name, _)| name).join(", ")
        );
    }
    let toolchain = setup::unstable_toolchain()?;
    // The fuzz crate builds the agent's library, and with it the CRI API.
    setup::ensure_protoc()?;
    ensure_cargo_fuzz(&toolchain)?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent directory")?
        .to_owned();
    setup::step(
        "build the fuzz targets",
        cargo_fuzz(&toolchain, &root)
            .args(["build"])
            .args(FUZZ_BUILD),
    )?;
    let mut runs = Vec::new();
    for (target, dict) in targets {
        runs.push(run_target(&toolchain, &root, target, *dict, seconds)?);
    }
    println!("\n| target | seconds | executions | corpus (inputs/bytes) | result |");
    println!("|---|---:|---:|---|---|");
    for run in &runs {
        println!(
            "| {} | {:.0} | {} | {} | {} |",
            run.target,
            run.seconds,
            run.executions
                .map_or_else(|| "?".to_owned(), |n| n.to_string()),
            run.corpus.as_deref().unwrap_or("?"),
            if run.crashed {
                "FAILED (see fuzz/artifacts)"
            } else {
                "no failure"
            },
        );
    }
    if runs.iter().any(|run| run.crashed) {
        bail!("a fuzz target failed; the input is in fuzz/artifacts/<target>/");
    }
    Ok(())
}

fn ensure_cargo_fuzz(toolchain: &Toolchain) -> Result<()> {
    let installed = Command::new("cargo-fuzz")
        .arg("--version")
        .env("PATH", toolchain.path())
        .output()
        .is_ok_and(|out| out.status.success());
    if installed {
        return Ok(());
    }
    setup::step(
        &format!("install cargo-fuzz {CARGO_FUZZ_VERSION} (about a minute)"),
        Command::new(env!("CARGO")).args([
            "install",
            "cargo-fuzz",
            "--version",
            CARGO_FUZZ_VERSION,
            "--locked",
        ]),
    )
}

/// `cargo fuzz` from the workspace root, building the agent without its
/// eBPF programs.
fn cargo_fuzz(toolchain: &Toolchain, root: &Path) -> Command {
    let mut cargo = toolchain.cargo_unstable();
    cargo
        .current_dir(root)
        .arg("fuzz")
        .env("AYA_BUILD_SKIP", "1")
        .env_remove("EVICTD_REQUIRE_EBPF");
    cargo
}

fn run_target(
    toolchain: &Toolchain,
    root: &Path,
    target: &'static str,
    dict: Option<&str>,
    seconds: u64,
) -> Result<Run> {
    let corpus = root.join("fuzz/corpus").join(target);
    fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let mut command = cargo_fuzz(toolchain, root);
    command
        .arg("run")
        .args(FUZZ_BUILD)
        .arg(target)
        .arg(&corpus)
        .arg(root.join("fuzz/seeds").join(target))
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECONDS}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg("-print_final_stats=1");
    if let Some(dict) = dict {
        command.arg(format!(
            "-dict={}",
            root.join("fuzz/dicts").join(dict).display()
        ));
    }
    println!("xtask: == fuzz {target} for {seconds}s");
    let started = Instant::now();
    let mut child = command
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    let stderr = child.stderr.take().context("cargo fuzz stderr")?;
    let mut run = Run {
        target,
        seconds: 0.0,
        executions: None,
        corpus: None,
        crashed: false,
    };
    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if let Some(count) = line.strip_prefix("stat::number_of_executed_units:") {
            run.executions = count.trim().parse().ok();
        }
        let done = line.starts_with('#') && line.contains("DONE");
        if done {
            run.corpus = line
                .split_whitespace()
                .skip_while(|word| *word != "corp:")
                .nth(1)
                .map(str::to_owned);
        }
        if done || line.starts_with("stat::") || line.starts_with("==") {
            println!("  {line}");
        }
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    let status = child.wait().context("waiting for cargo fuzz")?;
    run.seconds = started.elapsed().as_secs_f64();
    run.crashed = !status.success();
    if run.crashed {
        for line in &tail {
            eprintln!("  {line}");
        }
    }
    Ok(run)
}
