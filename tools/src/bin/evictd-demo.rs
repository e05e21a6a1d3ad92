//! `cargo xtask demo`: the whole story on this machine, no cluster needed.
//! A sandbox node cgroup (512 MiB) with pods of every QoS class, evictd in
//! event mode with kubelet's default thresholds, a memory hog, and a
//! timeline of what happened; then everything is removed.
//!
//! Usage: evictd-demo EVICTD WORKLOAD (xtask passes both binaries).
use std::{process::ExitCode, time::Instant};

use anyhow::{Context as _, Result, bail};
use evictd_integration::{Agent, STEADY_POD_MEMORY, SandboxNode, memory_pods};
use serde_json::Value;

const MIB: u64 = 1 << 20;
const NODE_MEMORY: u64 = 512 * MIB;
/// The hog's allocation step: as fast as the workload can touch pages.
const HOG_STEP: u64 = 8 * MIB;

fn main() -> ExitCode {
    match demo() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("evictd-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn demo() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(agent_binary), Some(workload_binary)) = (args.next(), args.next()) else {
        bail!("usage: evictd-demo EVICTD WORKLOAD");
    };
    // Agent::start finds the binary through EVICTD_BIN.
    // SAFETY: single-threaded here; no other thread reads the environment.
    unsafe { std::env::set_var("EVICTD_BIN", &agent_binary) };

    let mut node = SandboxNode::new(memory_pods(), NODE_MEMORY, &workload_binary)
        .context("building the sandbox node")?;
    println!(
        "sandbox node: cgroup {} with {} MiB of memory",
        node.node_cgroup(),
        NODE_MEMORY / MIB
    );
    let mut rows = Vec::new();
    for pod in node.pods.clone() {
        let held = STEADY_POD_MEMORY
            .iter()
            .find(|(n, _)| *n == pod.name)
            .map_or(0, |(_, b)| *b);
        if held > 0 {
            node.workload(&pod.name)?.alloc(held)?;
        }
        let container = &pod.metadata["containers"][0];
        let qos = if container["limits"].is_object() {
            "Guaranteed"
        } else if container["requests"].is_object() {
            "Burstable"
        } else {
            "BestEffort"
        };
        let request = container["requests"]["memory"].as_str().unwrap_or("-");
        rows.push(vec![
            pod.name.clone(),
            qos.to_owned(),
            pod.metadata["priority"].to_string(),
            request.to_owned(),
            format!("{} MiB", held / MIB),
        ]);
    }
    print!("{}", table(&POD_COLUMNS, &rows));

    let mut agent_args = node.agent_args();
    agent_args.push("--eviction-hard=memory.available<100Mi".into());
    let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
    println!("\nevictd {}", agent_args.join(" "));
    let mut agent = Agent::start(&agent_args)?;
    agent.log.expect("eBPF programs attached", &[]);
    agent
        .log
        .expect("watching scope", &[("scope", &node.node_cgroup())]);

    println!("\ntimeline (t = since the hog started)");
    let started = Instant::now();
    let stamp = |what: &str| {
        println!(
            "  t={:>7.1} ms  {what}",
            started.elapsed().as_secs_f64() * 1e3
        )
    };
    stamp(&format!(
        "hog starts allocating {} MiB at a time",
        HOG_STEP / MIB
    ));
    let mut held = 0;
    while node.workload("hog")?.alloc(HOG_STEP).is_ok() {
        held += HOG_STEP;
        if held >= NODE_MEMORY {
            bail!("the hog was never stopped");
        }
    }
    stamp(&format!("hog is gone after allocating {} MiB", held / MIB));

    let field = |line: &Value, name: &str| line[name].to_string().trim_matches('"').to_owned();
    let pressure = agent
        .log
        .expect("node condition", &[("condition", "MemoryPressure")]);
    let decided = agent.log.expect("eviction decided", &[]);
    let killed = agent.log.expect("pod killed", &[]);
    let back = agent.log.expect("memory back", &[]);
    println!("\nwhat evictd logged");
    println!(
        "  node condition {} = {}",
        field(&pressure, "condition"),
        field(&pressure, "status")
    );
    println!(
        "  eviction decided: signal {} observed {} B < threshold {} B (trigger: {}, {} µs after it)",
        field(&decided, "signal"),
        field(&decided, "observed"),
        field(&decided, "threshold"),
        field(&decided, "trigger"),
        field(&decided, "decision_us"),
    );
    println!("  ranking: {}", field(&decided, "candidates"));
    println!(
        "  victim: {} ({})",
        field(&decided, "victim"),
        field(&decided, "qos")
    );
    println!(
        "  pod killed: {} µs from the kernel event to SIGKILL; cgroup empty {} µs later",
        field(&killed, "trigger_to_kill_us"),
        field(&killed, "empty_after_us"),
    );
    println!(
        "  memory back: {} MiB freed within {} µs",
        back["freed_bytes"].as_u64().unwrap_or(0) / MIB,
        field(&back, "after_us"),
    );

    let survivors: Vec<&str> = STEADY_POD_MEMORY
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| node.alive(name))
        .collect();
    let oom_kills = node.oom_kills()?;
    println!("\noutcome");
    println!("  still running: {}", survivors.join(", "));
    println!("  kernel OOM kills in the sandbox: {oom_kills}");
    let (status, _) = agent.stop()?;
    println!("  evictd stopped ({status}); removing the sandbox");
    if oom_kills > 0 || survivors.len() != STEADY_POD_MEMORY.len() {
        bail!("the demo did not go as expected");
    }
    Ok(())
}

/// Which side of its column a cell keeps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

const POD_COLUMNS: [(&str, Align); 5] = [
    ("pod", Align::Left),
    ("QoS", Align::Left),
    ("priority", Align::Right),
    ("memory request", Align::Right),
    ("holds", Align::Right),
];

/// A table indented by two spaces, each column as wide as its widest cell
/// or header: fixed widths let a long name or priority push the rest of
/// its row out of line (and serde_json's `Value` ignores a width).
fn table(columns: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (header, _))| {
            rows.iter()
                .filter_map(|row| row.get(i))
                .map(|cell| cell.chars().count())
                .chain([header.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let headers: Vec<String> = columns
        .iter()
        .map(|(header, _)| (*header).to_owned())
        .collect();
    let mut out = String::new();
    for cells in std::iter::once(&headers).chain(rows) {
        let mut line = String::from(" ");
        for ((cell, &(_, align)), &width) in cells.iter().zip(columns).zip(&widths) {
            line.push(' ');
            match align {
                Align::Left => line.push_str(&format!("{cell:<width$}")),
                Align::Right => line.push_str(&format!("{cell:>width$}")),
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where each column lines up in `line`: a left-aligned cell's first
    /// character, a right-aligned cell's end.
    fn edges(line: &str, cells: &[&str]) -> Vec<usize> {
        let mut from = 0;
        cells
            .iter()
            .zip(POD_COLUMNS)
            .map(|(cell, (_, align))| {
                let start = from + line[from..].find(cell).expect("cell in its line");
                from = start + cell.len();
                match align {
                    Align::Left => start,
                    Align::Right => from,
                }
            })
            .collect()
    }

    #[test]
    fn header_and_rows_line_up_whatever_the_widths() {
        let rows: Vec<Vec<String>> = [
            [
                "guaranteed-long-name",
                "Guaranteed",
                "2000001000",
                "256Mi",
                "64 MiB",
            ],
            ["be", "BestEffort", "0", "-", "0 MiB"],
            ["burstable", "Burstable", "-10", "1536Mi", "128 MiB"],
        ]
        .iter()
        .map(|row| row.iter().map(|cell| (*cell).to_owned()).collect())
        .collect();
        let rendered = table(&POD_COLUMNS, &rows);
        let lines: Vec<&str> = rendered.lines().collect();
        assert_eq!(lines.len(), 1 + rows.len());
        let headers: Vec<&str> = POD_COLUMNS.iter().map(|(header, _)| *header).collect();
        let expected = edges(lines[0], &headers);
        for (line, row) in lines[1..].iter().zip(&rows) {
            let cells: Vec<&str> = row.iter().map(String::as_str).collect();
            assert_eq!(edges(line, &cells), expected, "{rendered}");
        }
        assert!(lines[0].starts_with("  pod "), "{rendered}");
    }
}
