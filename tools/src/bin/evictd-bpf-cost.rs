//! `evictd-bpf-cost AGENT WORKLOAD ROUNDS PIDS [AGENT ARGS...]` (run by
//! `cargo xtask bpf-cost`):
//! what each eBPF program costs per invocation under memory churn, measured
//! by the kernel (`kernel.bpf_stats_enabled`).
//!
//! Runs the release agent watching a private cgroup in which a workload
//! repeatedly frees and re-touches memory (crossing a threshold each round)
//! and forks children, then reads run counts and run times from the agent's
//! own metrics. PIDS says how tasks are watched: `cgroup`, the private
//! cgroup with a 40-task line it crosses each round (every fork walks the
//! task's pids cgroups), or `node`, the node as a whole (`pid.available`,
//! far from its line: a fork reads the node-wide count alone).
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use evictd_integration::{BpfStats, PrivateCgroupTree, Workload, program_stats};

const MIB: u64 = 1 << 20;

/// The agent process, stopped with SIGTERM on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: evictd-bpf-cost AGENT WORKLOAD ROUNDS cgroup|node [AGENT ARGS...]";
    let (Some(agent), Some(workload), Some(rounds), Some(pids)) =
        (args.next(), args.next(), args.next(), args.next())
    else {
        bail!(usage);
    };
    let rounds = rounds.parse().context("ROUNDS")?;
    let pids = match pids.as_str() {
        "cgroup" => PidsWatched::Cgroup,
        "node" => PidsWatched::Node,
        other => bail!("PIDS: {other:?} is neither cgroup nor node; {usage}"),
    };
    let agent_args: Vec<String> = args.collect();
    run(
        std::path::Path::new(&agent),
        std::path::Path::new(&workload),
        rounds,
        pids,
        &agent_args,
    )
}

/// How the agent watches tasks during the run.
#[derive(Clone, Copy)]
enum PidsWatched {
    /// The churning cgroup, with a line its forks cross.
    Cgroup,
    /// The node as a whole, far from its line.
    Node,
}

fn run(
    agent: &std::path::Path,
    workload: &std::path::Path,
    rounds: u32,
    pids: PidsWatched,
    agent_args: &[String],
) -> Result<()> {
    let _stats = BpfStats::on().context("turning kernel.bpf_stats_enabled on")?;
    let tree = PrivateCgroupTree::new().context("creating the private cgroup tree")?;
    tree.create("churn")?;
    let scope = tree.relative_path("churn");
    let mut child = Command::new(agent)
        .args(["--log-format", "json", "--metrics-address", "127.0.0.1:0"])
        .args(["--health-address", "127.0.0.1:0"])
        .args(["--watch-memory", &format!("{scope}=192Mi")])
        .args(match pids {
            PidsWatched::Cgroup => vec!["--watch-pids".to_owned(), format!("{scope}=40")],
            // Far from the line the PID zone would unlink the programs this
            // measures.
            PidsWatched::Node => [
                "--eviction-hard",
                "pid.available<100",
                "--precise-hooks",
                "always",
            ]
            .map(str::to_owned)
            .to_vec(),
        })
        .args(agent_args)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", agent.display()))?;
    let stdout = child.stdout.take().context("agent stdout")?;
    let agent = Agent(child);
    let mut lines = BufReader::new(stdout).lines();
    let address = loop {
        let line = lines
            .next()
            .context("agent exited before serving metrics")??;
        let value: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if value["message"] == "serving /metrics and /healthz" {
            break value["address"]
                .as_str()
                .context("address field")?
                .to_owned();
        }
    };
    // Keep draining the log so the agent never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));

    let workload_path = workload.to_str().context("workload path is not UTF-8")?;
    let mut workload = Workload::spawn_in(&tree, "churn", workload_path)?;
    let watched = match pids {
        PidsWatched::Cgroup => "tasks watched in the cgroup, a 40-task line crossed each round",
        PidsWatched::Node => {
            "tasks watched node-wide only, far from pid.available<100 (the PID hooks kept on)"
        }
    };
    println!(
        "bpf-cost: {rounds} rounds of freeing and re-touching 128 MiB across a 192 Mi threshold, 50 forks each; {watched}"
    );
    let started = Instant::now();
    workload.alloc(256 * MIB)?;
    for _ in 0..rounds {
        workload.free(128 * MIB)?;
        workload.alloc(128 * MIB)?;
        workload.fork(50)?;
        workload.reap(50)?;
    }
    let elapsed = started.elapsed();
    // One more agent check interval publishes the final counts.
    let metrics = wait_for_metrics(&address)?;
    drop(workload);
    drop(agent);

    println!("\nworkload ran {:.1}s\n", elapsed.as_secs_f64());
    println!("| program | runs | runs/s | total ms | ns per run |");
    println!("|---|---:|---:|---:|---:|");
    for (program, runs, nanos) in program_stats(&metrics) {
        let per_run = if runs == 0 {
            0.0
        } else {
            nanos as f64 / runs as f64
        };
        println!(
            "| {program} | {runs} | {:.0} | {:.1} | {per_run:.1} |",
            runs as f64 / elapsed.as_secs_f64(),
            nanos as f64 / 1e6
        );
    }
    if let Some(checks) = sample(&metrics, "evictd_kernel_memory_checks_total") {
        println!("\npage-counter checks by the memory programs: {checks}");
    }
    let count = sample(&metrics, "evictd_event_latency_seconds_count").unwrap_or(0.0);
    let sum = sample(&metrics, "evictd_event_latency_seconds_sum").unwrap_or(0.0);
    if count > 0.0 {
        println!(
            "\nring-buffer records: {count}, mean kernel-to-userspace latency {:.0} µs",
            sum / count * 1e6
        );
    }
    Ok(())
}

/// Metrics once the agent has published program counts that cover the run.
fn wait_for_metrics(address: &str) -> Result<String> {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let first = program_stats(&scrape(address)?);
    loop {
        let metrics = scrape(address)?;
        let now = program_stats(&metrics);
        if now.iter().map(|s| s.1).sum::<u64>() > first.iter().map(|s| s.1).sum::<u64>()
            || Instant::now() > deadline
        {
            return Ok(metrics);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn scrape(address: &str) -> Result<String> {
    let mut stream = TcpStream::connect(address).context("connecting to the agent's metrics")?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: evictd\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    if !response.starts_with("HTTP/1.1 200") {
        bail!(
            "metrics endpoint answered {}",
            response.lines().next().unwrap_or_default()
        );
    }
    Ok(response)
}

fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (key, value) = line.rsplit_once(' ')?;
        (key == name).then(|| value.parse().ok()).flatten()
    })
}
