//! `evictd-hook-tax AGENT WORKLOAD ROUNDS` (run by `cargo xtask hook-tax`):
//! what the agent's memory hooks cost a workload far from every threshold.
//!
//! A 3.5 GiB sandbox node with `memory.available<100Mi`; a process beside
//! the pods faults in 1 GiB (touching every page), frees it (munmap),
//! faults it in again and is SIGKILLed, and the time until its cgroup holds
//! under 64 MiB is taken. Each round runs every configuration once, in
//! turn, so machine noise spreads over all of them; medians are printed:
//!
//! - `no agent`;
//! - `zone`: the default, far from the threshold, so the precise memory
//!   hooks are detached (the tool waits for the agent to say so);
//! - `always`: `--precise-hooks always`, the hooks attached;
//! - `always, returns early`: the same with `--memory-check-step 1Ti`, so
//!   the hot program only adds to its per-CPU budget and returns: the cost
//!   of a hook attached but disabled by a flag.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use evictd_integration::{Agent, SandboxNode, Workload, memory_pods};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 3584 * MIB;
const TOUCHED: u64 = 1024 * MIB;
/// The killed process's memory counts as back below this.
const BACK_BELOW: u64 = 64 * MIB;

struct Config {
    name: &'static str,
    /// `None`: no agent.
    args: Option<&'static [&'static str]>,
    /// The log line (message, state) to wait for before measuring.
    ready: Option<(&'static str, &'static str)>,
}

const CONFIGS: [Config; 4] = [
    Config {
        name: "no agent",
        args: None,
        ready: None,
    },
    Config {
        name: "zone (far: hooks detached)",
        args: Some(&[]),
        ready: Some(("precise memory hooks", "disarmed")),
    },
    Config {
        name: "always (hooks attached)",
        args: Some(&["--precise-hooks", "always"]),
        ready: None,
    },
    Config {
        name: "always, returns early (--memory-check-step 1Ti)",
        args: Some(&["--precise-hooks", "always", "--memory-check-step", "1Ti"]),
        ready: None,
    },
];

#[derive(Default)]
struct Samples {
    fault_in: Vec<Duration>,
    munmap: Vec<Duration>,
    kill_back: Vec<Duration>,
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(agent), Some(workload), Some(rounds)) = (args.next(), args.next(), args.next())
    else {
        bail!("usage: evictd-hook-tax AGENT WORKLOAD ROUNDS");
    };
    let rounds: u32 = rounds.parse().context("ROUNDS")?;
    // SAFETY: set before any thread starts; Agent::start reads it.
    unsafe { std::env::set_var("EVICTD_BIN", &agent) };
    let node = SandboxNode::new(memory_pods(), NODE_MEMORY, &workload)?;
    node.tree.create("node/tax")?;
    println!(
        "hook-tax: {rounds} rounds; per round and configuration: fault in 1 GiB, munmap it, \
         fault it in again, SIGKILL, wait until the cgroup holds < 64 MiB"
    );
    let mut samples: Vec<Samples> = CONFIGS.iter().map(|_| Samples::default()).collect();
    for round in 0..rounds {
        for (config, samples) in CONFIGS.iter().zip(&mut samples) {
            let agent = match config.args {
                Some(extra) => Some(start_agent(&node, config, extra)?),
                None => None,
            };
            measure(&node, &workload, samples)
                .with_context(|| format!("round {round}, {}", config.name))?;
            if let Some(agent) = agent {
                let (status, mut log) = agent.stop()?;
                if !status.success() {
                    bail!("the agent ({}) exited with {status}", config.name);
                }
                // Far from the threshold the zone keeps the hooks off; a
                // change while the workload ran is in the measurement.
                let moves = log.all("precise memory hooks").len();
                if config.ready.is_some() && moves > 1 {
                    println!(
                        "{}, round {round}: the memory hooks moved {} times while the workload ran",
                        config.name,
                        moves - 1
                    );
                }
            }
        }
    }
    println!("\n| configuration | fault in 1 GiB | munmap 1 GiB | SIGKILL → < 64 MiB |");
    println!("|---|---:|---:|---:|");
    for (config, samples) in CONFIGS.iter().zip(&mut samples) {
        println!(
            "| {} | {} | {} | {} |",
            config.name,
            median(&mut samples.fault_in),
            median(&mut samples.munmap),
            median(&mut samples.kill_back)
        );
    }
    println!("\n(medians of {rounds}, milliseconds)");
    Ok(())
}

fn start_agent(node: &SandboxNode, config: &Config, extra: &[&str]) -> Result<Agent> {
    let mut args = node.agent_args();
    args.extend(["--eviction-hard", "memory.available<100Mi"].map(String::from));
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent = Agent::start(&args)?;
    agent.log.expect("protection armed", &[]);
    if let Some((message, state)) = config.ready {
        let line = agent.log.expect(message, &[("state", state)]);
        if let Some(took) = line["took_us"].as_u64() {
            println!("{}: detaching the memory hooks took {took} µs", config.name);
        }
    }
    Ok(agent)
}

fn measure(node: &SandboxNode, workload: &str, samples: &mut Samples) -> Result<()> {
    let mut process = Workload::spawn_in(&node.tree, "node/tax", workload)?;
    let started = Instant::now();
    process.alloc(TOUCHED)?;
    samples.fault_in.push(started.elapsed());
    let started = Instant::now();
    process.free(TOUCHED)?;
    samples.munmap.push(started.elapsed());
    process.alloc(TOUCHED)?;
    let started = Instant::now();
    kill(Pid::from_raw(process.pid() as i32), Signal::SIGKILL)?;
    // Finer than wait_until's 5 ms steps: the interval itself is measured.
    while node.tree.memory_usage("node/tax")? >= BACK_BELOW {
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the killed process's memory did not come back within 30 s");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    samples.kill_back.push(started.elapsed());
    drop(process);
    Ok(())
}

fn median(samples: &mut [Duration]) -> String {
    if samples.is_empty() {
        return "-".into();
    }
    samples.sort();
    format!("{:.1}", samples[samples.len() / 2].as_secs_f64() * 1e3)
}
