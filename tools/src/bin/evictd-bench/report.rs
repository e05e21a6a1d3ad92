//! bench.md from bench.json: what each row means, the goals of issue 13
//! against what was measured, and one table per kind of scenario.
use std::collections::BTreeMap;

use serde_json::Value;

mod goals;

use crate::{
    MIB, NO_AGENT, ORACLE,
    runs::EXPECTED_VICTIM,
    stats::{Estimate, format_ms, interval_rank, median, median_with_ci, percentile, rank},
};

type Runs<'a> = Vec<&'a Value>;

/// The whole of bench.md.
pub fn markdown(results: &Value) -> String {
    let mut text = String::new();
    text += &format!(
        "Made by `{}` on Linux {} (cgroup {}, {} CPUs), {} round{}{}, in {:.0} min.\n\n",
        results["command"].as_str().unwrap_or_default(),
        results["kernel"].as_str().unwrap_or_default(),
        results["cgroup"].as_str().unwrap_or_default(),
        results["cpus"],
        results["rounds"],
        if results["rounds"] == 1 { "" } else { "s" },
        match results["partial_round_runs"].as_u64() {
            Some(runs) if runs > 0 => format!(
                " complete of {} planned, and {runs} runs of the next (the bench was \
                 stopped)",
                results["rounds_planned"]
            ),
            _ => String::new(),
        },
        results["wall_seconds"].as_f64().unwrap_or(0.0) / 60.0,
    );
    text += &reading_guide(results);
    text += "\n## Goals\n\n";
    text += &goals::table(results);
    text += "\n## Memory bombs: crossing → decision → memory back\n\n";
    text += &memory_table(results);
    if results["node"] == "root" {
        text += "\n### Against the floors, in the same rounds\n\nCrossing → memory back of \
                 each mode against the oracle's and against no agent's (the kernel's OOM \
                 killer) in the same round: the median of the per-round differences and of \
                 the per-round ratios, each with its 95 % interval (order statistics), over \
                 the rounds where both got the memory back (*pairs*); under emulation the \
                 times are not the host's, their ratios and differences in the same rounds \
                 are what compares. *mode never*: rounds where the floor got it back and the \
                 mode did not (the kernel's OOM killer first, or no decision).\n\n";
        text += &floors_table(results);
    }
    if !scenarios(results, "reserve").is_empty() {
        text += &format!(
            "\n## Reserve sweep: the bomb against smaller thresholds\n\n\
             The memory bomb at {} against each threshold, every mode and the oracle: how \
             many runs the kernel's OOM killer ended first (*kernel won*), how many no kill \
             ended within 30 s while the node thrashed (*stalled*: the bench killed the \
             bomb), and the least \
             memory.available the bomb's log saw (p50 over the runs; below the threshold \
             once the node crossed). Where even the oracle loses, the node never crossed: \
             the kernel ran out of memory (its own, which kubelet's working set leaves out, \
             and the free pages it keeps) before memory.available got that low.\n\n",
            scenarios(results, "reserve")
                .first()
                .and_then(|s| s["rate"].as_u64())
                .map_or("max rate".to_owned(), |rate| match rate {
                    0 => "max rate".to_owned(),
                    rate => format!("{} MiB/s", rate / MIB),
                })
        );
        text += &reserve_table(results);
    }
    if let Some(failed) = results["failed_runs"].as_array().filter(|f| !f.is_empty()) {
        text += "\n## Failed runs\n\nRuns that ended in an error (left out of every table).\n\n\
                 | round | scenario | mode | error |\n|---:|---|---|---|\n";
        for run in failed {
            text += &format!(
                "| {} | {} | {} | {} |\n",
                run["round"],
                run["scenario"].as_str().unwrap_or_default(),
                run["mode"].as_str().unwrap_or_default(),
                run["error"].as_str().unwrap_or_default().replace('|', "/"),
            );
        }
    }
    text += "\n### Where decided → memory back goes\n\nThe agent's kill, phase by phase \
             (its `pod killed` line), each from the previous: the kill future starts; on cgroup \
             v1 the pod's freezer reports `FROZEN`; the first SIGKILL; the first round's \
             `process_mrelease` calls return (the memory reaped); the cgroup holds no \
             process; the node's page counter is back (the bench's instrument). The last \
             column, from the SIGKILL too: the frozen pod thawed, once its reapers were seen \
             unmapping (at most 3 ms). A phase a run did not have (no freezer, v2's \
             `cgroup.kill`) is left out.\n\n";
    text += &kill_phases_table(results);
    text += "\n### Slow freezes\n\nThe kills whose pod was still freezing a millisecond after \
             the agent asked, with the tasks the freezer waited on then (the agent's `pod \
             killed` line: pid, state, the kernel function it waited in). A task stops on its \
             way back to user mode, so one blocked in the kernel holds the freeze, and the \
             kill, as long.\n\n";
    text += &slow_freezes_table(results);
    text += "\n### The zone's lead\n\nHow long before the crossing event mode's precise \
             memory hooks went on (their last attach before the decision, from the agent's \
             `precise memory hooks` line): the zone's width over the rate, less the far \
             trigger's wake-up and the engine run that attached them. The smallest leads \
             matter: a crossing before the attach is seen only by the engine's look right \
             after it. Runs whose hooks did not move (attached for good, or another mode) \
             are left out.\n\n";
    text += &zone_lead_table(results);
    text += "\n## Fork bomb\n\nTimes from the crossing of `pid.available` in the bomb's log (a record per \
             fork); *bomb's cgroup empty*: the agent's `pod killed`. *beside a busy pod*: web, of \
             the bomb's priority, holds 60% of the tasks below the line in processes started \
             before the fork-rate window, so kubelet's order (`event+kubelet`, the default) \
             takes it first (a wrong victim); `event+fork-rate` is `--pid-ranking fork-rate`.\n\n";
    text += &fork_bomb_table(results);
    if !scenarios(results, "thrashing").is_empty() {
        text += "\n## A pod thrashing at its own limit\n\nThe hog limited to what it holds plus \
                 the room for file pages, cycling through a cold file 9/8 of the room; web, \
                 limited the same way, through one half of it; no threshold near. Times from \
                 the hog's first pass: *reported*, the agent's `pod thrashing at its memory \
                 limit` (two readings of the pods' counters, 10 s apart, once it thrashes); \
                 *killed*, its `pod killed`. `event` is the default (reported, kept, two more \
                 readings watched); `event+thrashing-eviction` evicts. *false positives*: runs \
                 that reported or evicted web.\n\n";
        text += &thrashing_table(results);
    }
    text += "\n## Decision latency against pod count\n\nThe memory bomb with the five pods \
             above and small ones (1 MiB each, every QoS class) up to the count. *woken → \
             decided*: the agent's `eviction decided` from the trigger that woke its deciding \
             run (in event mode the kernel record; *woken by* says which).\n\n";
    text += &pods_table(results);
    text += "\n### Where woken → decided goes\n\nEach phase from the agent's `eviction decided` \
             line, p50 / p90 / p99 over the runs: *to the run*: from the trigger to the engine \
             run (the wake-up, the kernel's records read); *node read*: the node's signals; \
             *pods listed*: every pod with the usage it ranks by (for memory, its bytes \
             charged: one read of the kernel's cgroup iterator in event mode, one read per \
             pod in the other modes or without the iterator); *rankings*: every ranking the decision made; *exact \
             reads*: the working set of the pods the decision turned on (*read*: how many, \
             p50); *rest*: woken → decided less these (the engine, metrics, tripwires).\n\n";
    text += &decision_phases_table(results);
    text += &format!(
        "\nThe {SLOWEST_SHOWN} slowest decisions of each pod count, with their longest phase and \
         where the deciding thread was over its engine run (from the node read to the \
         decision): *on CPU* working; *off CPU* the rest of that time, in which *preempted* \
         counts its involuntary context switches (waiting for a CPU) and *blocked* its \
         voluntary ones (a lock, I/O). Time off the CPU with neither is time the hypervisor \
         took from the guest (steal), which a guest's task clock does not count.\n\n"
    );
    text += &slowest_decisions_table(results);
    text += "\n## Workload overhead\n\n";
    text += &overhead_table(results);
    text += "\n## Idle agent, no pressure\n\n";
    text += &idle_table(results);
    text += "\n## BPF programs of event mode, over every event-mode run\n\n";
    text += &bpf_table(results);
    text
}

fn reading_guide(results: &Value) -> String {
    let n = results["rounds"].as_u64().unwrap_or(0) as usize;
    let ranks = if n > 0 {
        format!(
            " With n = {n}: p50 is the {} smallest, p90 the {}, p99 the {}{}.",
            ordinal(rank(n, 0.5)),
            ordinal(rank(n, 0.9)),
            ordinal(rank(n, 0.99)),
            if rank(n, 0.99) == n {
                " — the largest run (p99 is the maximum whenever n < 100)"
            } else {
                ""
            }
        )
    } else {
        String::new()
    };
    let root = if results["node"] == "root" {
        "**The node is the machine's root** (a VM guest under software emulation: times \
         are not the host's): `--node-cgroup /`, the pods in the root's `kubepods`, \
         capacity its MemTotal, and in this run the crossing, memory back and the bomb's \
         log are on the machine's working set as kubelet computes it on the v2 root (anon + \
         file − inactive_file), read from /proc/vmstat (`nr_anon_pages + nr_file_pages − \
         nr_inactive_file`: the same page states as the root's memory.stat, without its \
         flush lag) every 64 KiB by the bomb and every ms by the bench. *no agent* \
         (`none`): nothing stops the bomb but the kernel's global OOM killer (the pods \
         carry kubelet's oom_score_adj per QoS class, the agent and earlyoom the \
         system-node-critical −997, the bench −1000); its *memory back* is the kernel's. \
         *earlyoom*: Debian's earlyoom 1.7 with `-M <threshold in KiB>`: it polls \
         MemAvailable (not kubelet's working set) and SIGTERMs the process of highest \
         oom_score, knowing no pods; its *decided* is when the bench read its kill line. \
         *kernel won* counts /proc/vmstat's machine-wide oom_kill.\n\n"
    } else {
        ""
    };
    format!(
        "{root}Every time is in ms from the node's real threshold crossing: its page counter \
         past capacity − threshold + inactive file, as the bomb's own log (a reading every \
         64 KiB, on tmpfs) or the kernel (an eventfd threshold the bench arms, before the \
         agent's kill) first reports it. \
         *noticed*: what woke the agent's deciding run (kernel record, timer tick, \
         notification); *decided*: its `eviction decided` line; *memory back*: the kernel \
         reports the node's page counter down to its level before the bomb plus 5 % of what \
         the bomb held at the crossing (a cgroup v1 eventfd threshold the bench arms, read by \
         a real-time thread; v2: read every ms), the same instrument for every row; \
         *decided → memory back* is the difference within each run. The **oracle** row runs \
         no agent: the bench SIGKILLs the bomb (pidfd, then process_mrelease) as soon as it \
         reads the crossing record in the bomb's log, the kernel's own floor; its *noticed* \
         is when it read that record and *decided* its SIGKILL.\n\n\
         Each row has n runs (one per round; the modes of a scenario run in an order \
         rotated every round). Percentiles are nearest rank: pq is the ⌈q·n⌉-th smallest \
         of the n.{ranks} A run that never got there (the kernel's OOM killer or pids.max \
         first, or no decision) ranks above every other and shows as `never`; a run in \
         which the agent decided although neither the log nor the kernel saw the node \
         cross (the bomb frozen before its next reading or record) has nothing to measure \
         from: it is left out of n and counted in *decided, no crossing*. *kernel won*: \
         a kernel OOM kill in the node (memory) or a fork refused at pids.max; *wrong \
         victim*: a pod other than the bomb killed or lost; both are counted over every \
         run, those without a crossing included.\n"
    )
}

/// 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The scenarios of one kind, as bench.json lists them.
fn scenarios<'a>(results: &'a Value, kind: &str) -> Vec<&'a Value> {
    results["scenarios"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"] == kind)
        .collect()
}

fn modes(scenario: &Value) -> Vec<&str> {
    scenario["modes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// Every entry of bench.json's `runs` (its `round` and `run`) of one
/// scenario and mode.
fn entries<'a>(results: &'a Value, scenario: &Value, mode: &str) -> Vec<&'a Value> {
    results["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["scenario"] == scenario["name"] && r["mode"] == mode)
        .collect()
}

/// Every `run` object of one scenario and mode.
fn all_runs<'a>(results: &'a Value, scenario: &Value, mode: &str) -> Runs<'a> {
    entries(results, scenario, mode)
        .into_iter()
        .map(|r| &r["run"])
        .collect()
}

/// Whether `run` has a crossing to measure from: every run has but those
/// in which the agent decided before the node crossed.
fn has_crossing(run: &Value) -> bool {
    run["decided_without_crossing"] != true
}

/// The runs of one scenario and mode that have a crossing to measure from.
fn runs<'a>(results: &'a Value, scenario: &Value, mode: &str) -> Runs<'a> {
    all_runs(results, scenario, mode)
        .into_iter()
        .filter(|r| has_crossing(r))
        .collect()
}

fn field(runs: &Runs, name: &str) -> Vec<Option<f64>> {
    runs.iter().map(|r| r[name].as_f64()).collect()
}

fn decided_to_back(runs: &Runs) -> Vec<Option<f64>> {
    runs.iter()
        .map(|r| Some(r["back_us"].as_f64()? - r["decided_us"].as_f64()?))
        .collect()
}

/// p50 / p90 / p99; a p99 that is the largest of the runs (fewer than
/// 100) says so.
fn triple(values: &[Option<f64>]) -> String {
    let p = |q| format_ms(percentile(values, q));
    let n = values.len();
    let largest = n > 0 && rank(n, 0.99) == n;
    format!(
        "{} / {} / {}{}",
        p(0.5),
        p(0.9),
        p(0.99),
        if largest { " (max)" } else { "" }
    )
}

fn kernel_won(runs: &Runs) -> usize {
    runs.iter()
        .filter(|r| r["kernel_kills"].as_u64().unwrap_or(0) > 0)
        .count()
}

fn wrong_victim(runs: &Runs) -> usize {
    runs.iter()
        .filter(|r| {
            r["lost_pods"].as_array().is_some_and(|l| !l.is_empty())
                || r["victims"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v != EXPECTED_VICTIM))
        })
        .count()
}

/// Mean agent CPU per run and peak RSS; `–` for rows without an agent.
fn agent_cost(mode: &str, runs: &Runs) -> String {
    if mode == ORACLE || mode == NO_AGENT || runs.is_empty() {
        return "– | –".to_owned();
    }
    let cpu = runs
        .iter()
        .filter_map(|r| r["agent_cpu_ms"].as_f64())
        .sum::<f64>()
        / runs.len() as f64;
    let rss = runs
        .iter()
        .filter_map(|r| r["agent_peak_rss_bytes"].as_f64())
        .fold(0.0, f64::max);
    format!("{cpu:.1} | {:.1}", rss / MIB as f64)
}

/// The agent's own `memory back` line (from the crossing) and the bytes it
/// says were freed; `–` for the oracle.
fn agent_memory_back(mode: &str, runs: &Runs) -> String {
    if mode == ORACLE {
        return "–".to_owned();
    }
    let freed: Vec<f64> = runs
        .iter()
        .filter_map(|r| r["agent_freed_bytes"].as_f64())
        .map(|bytes| bytes / MIB as f64)
        .collect();
    format!(
        "{}, {}",
        triple(&field(runs, "agent_back_us")),
        median(&freed).map_or("–".to_owned(), |mib| format!("{mib:.0}"))
    )
}

fn memory_table(results: &Value) -> String {
    let mut text = "| scenario | mode | n | noticed p50 / p90 / p99 | decided p50 / p90 / p99 | decided → memory back p50 / p90 / p99 | crossing → memory back p50 / p90 / p99 | agent's `memory back` p50 / p90 / p99, freed p50 (MiB) | kernel won | wrong victim | decided, no crossing | agent CPU per run (ms) | peak RSS (MiB) |\n\
                    |---|---|---:|---|---|---|---|---|---:|---:|---:|---:|---:|\n"
        .to_owned();
    for scenario in scenarios(results, "memory") {
        for mode in modes(scenario) {
            let every = all_runs(results, scenario, mode);
            if every.is_empty() {
                continue;
            }
            let these = runs(results, scenario, mode);
            let (n, all) = (these.len(), every.len());
            text += &format!(
                "| {} | {} | {n} | {} | {} | {} | {} | {} | {}/{all} | {}/{all} | {} | {} |\n",
                scenario["name"].as_str().unwrap_or_default(),
                mode,
                triple(&field(&these, "noticed_us")),
                triple(&field(&these, "decided_us")),
                triple(&decided_to_back(&these)),
                triple(&field(&these, "back_us")),
                agent_memory_back(mode, &these),
                kernel_won(&every),
                wrong_victim(&every),
                all - n,
                agent_cost(mode, &every),
            );
        }
    }
    text
}

/// Crossing → memory back of each mode against a floor's, paired by
/// round: differences (ms) and ratios, with their intervals.
fn floors_table(results: &Value) -> String {
    let mut text = "| scenario | mode | against | pairs | difference (ms) median (95 % interval) | ratio median (95 % interval) | mode never |\n\
                    |---|---|---|---:|---|---|---:|\n"
        .to_owned();
    let back = |run: &Value| run["back_us"].as_f64();
    let estimate = |values: &[f64], decimals: usize| {
        median_with_ci(values).map_or("–".to_owned(), |e| match e.ci95 {
            Some((low, high)) => format!(
                "{:+.decimals$} ({low:+.decimals$} … {high:+.decimals$})",
                e.median
            ),
            None => format!("{:+.decimals$}", e.median),
        })
    };
    for scenario in scenarios(results, "memory") {
        for mode in modes(scenario)
            .into_iter()
            .filter(|m| *m != ORACLE && *m != NO_AGENT)
        {
            for floor in [ORACLE, NO_AGENT] {
                let differences = paired(results, scenario, (mode, floor), |run, other| {
                    Some((back(run)? - back(other)?) / 1e3)
                });
                let ratios: Vec<f64> = paired(results, scenario, (mode, floor), |run, other| {
                    Some(back(run)? / back(other)?)
                });
                let never = paired(results, scenario, (mode, floor), |run, other| {
                    (back(run).is_none() && back(other).is_some()).then_some(1.0)
                })
                .len();
                text += &format!(
                    "| {} | {mode} | {} | {} | {} | {} | {never} |\n",
                    scenario["name"].as_str().unwrap_or_default(),
                    if floor == ORACLE {
                        "oracle"
                    } else {
                        "no agent"
                    },
                    differences.len(),
                    estimate(&differences, 1),
                    estimate(&ratios, 2).replace('+', ""),
                );
            }
        }
    }
    text
}

fn reserve_table(results: &Value) -> String {
    let mut text = "| threshold (MiB) | mode | runs | kernel won | stalled | wrong victim | decided, no crossing | decided p50 (ms) | crossing → memory back p50 (ms) | least memory.available p50 (MiB) |\n\
                    |---:|---|---:|---:|---:|---:|---:|---|---|---:|\n"
        .to_owned();
    for scenario in scenarios(results, "reserve") {
        for mode in modes(scenario) {
            let every = all_runs(results, scenario, mode);
            if every.is_empty() {
                continue;
            }
            let these = runs(results, scenario, mode);
            let lowest: Vec<f64> = every
                .iter()
                .filter_map(|r| r["lowest_available_logged"].as_f64())
                .map(|bytes| bytes / MIB as f64)
                .collect();
            text += &format!(
                "| {} | {mode} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                scenario["threshold"].as_u64().unwrap_or(0) / MIB,
                every.len(),
                kernel_won(&every),
                every.iter().filter(|r| r["stalled"] == true).count(),
                wrong_victim(&every),
                every.len() - these.len(),
                format_ms(percentile(&field(&these, "decided_us"), 0.5)),
                format_ms(percentile(&field(&these, "back_us"), 0.5)),
                median(&lowest).map_or("–".to_owned(), |mib| format!("{mib:.0}")),
            );
        }
    }
    text
}

fn kill_phases_table(results: &Value) -> String {
    let mut text = "| scenario | mode | n | decided → kill starts | → frozen | → SIGKILL | → memory reaped | → cgroup empty | memory back − SIGKILL | SIGKILL → thawed |\n\
                    |---|---|---:|---|---|---|---|---|---|---|\n"
        .to_owned();
    let between = |runs: &Runs, from: &str, to: &str| -> Vec<Option<f64>> {
        runs.iter()
            .map(|r| Some(r[to].as_f64()? - r[from].as_f64()?))
            .collect()
    };
    for scenario in scenarios(results, "memory") {
        for mode in modes(scenario) {
            let these = runs(results, scenario, mode);
            if these.is_empty() || mode == "oracle" {
                continue;
            }
            // Without a freezer the SIGKILL follows the start directly.
            let frozen_or_start =
                |r: &Value| r["frozen_us"].as_f64().or(r["kill_started_us"].as_f64());
            let to_sigkill: Vec<Option<f64>> = these
                .iter()
                .map(|r| Some(r["sigkill_us"].as_f64()? - frozen_or_start(r)?))
                .collect();
            text += &format!(
                "| {} | {mode} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                scenario["name"].as_str().unwrap_or_default(),
                these.len(),
                triple(&between(&these, "decided_us", "kill_started_us")),
                triple(&between(&these, "kill_started_us", "frozen_us")),
                triple(&to_sigkill),
                triple(&between(&these, "sigkill_us", "released_us")),
                triple(&between(&these, "released_us", "empty_us")),
                triple(&between(&these, "sigkill_us", "back_us")),
                triple(&between(&these, "sigkill_us", "thawed_us")),
            );
        }
    }
    text
}

fn slow_freezes_table(results: &Value) -> String {
    let mut rows = String::new();
    for scenario in scenarios(results, "memory") {
        for mode in modes(scenario) {
            for entry in entries(results, scenario, mode) {
                let run = &entry["run"];
                let Some(holdouts) = run["freeze_holdouts"].as_str() else {
                    continue;
                };
                let frozen = run["frozen_us"]
                    .as_f64()
                    .zip(run["kill_started_us"].as_f64())
                    .map(|(frozen, started)| frozen - started);
                rows += &format!(
                    "| {} | {mode} | {} | {} | {holdouts} |\n",
                    scenario["name"].as_str().unwrap_or_default(),
                    entry["round"],
                    format_optional_ms(frozen),
                );
            }
        }
    }
    if rows.is_empty() {
        return "None.\n".to_owned();
    }
    "| scenario | mode | round | kill starts → frozen | tasks the freezer waited on |\n\
     |---|---|---:|---:|---|\n"
        .to_owned()
        + &rows
}

fn zone_lead_table(results: &Value) -> String {
    let mut text = "| scenario | mode | n | attached before the crossing min / p10 / p50 (ms) | attached after the crossing |\n\
                    |---|---|---:|---|---:|\n"
        .to_owned();
    for scenario in scenarios(results, "memory")
        .into_iter()
        .chain(scenarios(results, "pods"))
    {
        for mode in modes(scenario) {
            let leads: Vec<Option<f64>> = runs(results, scenario, mode)
                .iter()
                .filter_map(|r| r["hooks_attached_us"].as_f64())
                .map(|attached| Some(-attached))
                .collect();
            if leads.is_empty() {
                continue;
            }
            let late = leads.iter().flatten().filter(|&&lead| lead < 0.0).count();
            text += &format!(
                "| {} | {mode} | {} | {} / {} / {} | {late} |\n",
                scenario["name"].as_str().unwrap_or_default(),
                leads.len(),
                format_ms(percentile(&leads, 0.0)),
                format_ms(percentile(&leads, 0.1)),
                format_ms(percentile(&leads, 0.5)),
            );
        }
    }
    text
}

fn fork_bomb_table(results: &Value) -> String {
    let mut text = "| scenario | mode | n | noticed p50 / p90 / p99 | decided p50 / p90 / p99 | bomb's cgroup empty p50 / p90 / p99 | kernel won | wrong victim | decided, no crossing | agent CPU per run (ms) | peak RSS (MiB) |\n\
                    |---|---|---:|---|---|---|---:|---:|---:|---:|---:|\n"
        .to_owned();
    for scenario in scenarios(results, "fork-bomb") {
        let name = scenario["name"].as_str().unwrap_or_default();
        for mode in modes(scenario) {
            let every = all_runs(results, scenario, mode);
            if every.is_empty() {
                continue;
            }
            let these = runs(results, scenario, mode);
            let (n, all) = (these.len(), every.len());
            text += &format!(
                "| {name} | {mode} | {n} | {} | {} | {} | {}/{all} | {}/{all} | {} | {} |\n",
                triple(&field(&these, "noticed_us")),
                triple(&field(&these, "decided_us")),
                triple(&field(&these, "killed_us")),
                kernel_won(&every),
                wrong_victim(&every),
                all - n,
                agent_cost(mode, &every),
            );
        }
    }
    text
}

fn thrashing_table(results: &Value) -> String {
    let mut text = "| mode | n | reported (ms) p50 / p90 / p99 | killed (ms) p50 / p90 / p99 | refaulted, % of file pages (p50) | evictions | false positives |\n\
                    |---|---:|---|---|---:|---:|---:|\n"
        .to_owned();
    for scenario in scenarios(results, "thrashing") {
        for mode in modes(scenario) {
            let every = all_runs(results, scenario, mode);
            if every.is_empty() {
                continue;
            }
            let refaulted = percentile(&field(&every, "refaulted_percent"), 0.5);
            let evictions: u64 = every.iter().filter_map(|r| r["evictions"].as_u64()).sum();
            let false_positives = every
                .iter()
                .filter(|r| r["neighbour_reported"] == true || r["neighbour_alive"] == false)
                .count();
            text += &format!(
                "| {mode} | {} | {} | {} | {} | {evictions} | {false_positives}/{} |\n",
                every.len(),
                triple(&field(&every, "reported_us")),
                triple(&field(&every, "killed_us")),
                refaulted.map_or("-".to_owned(), |p| format!("{p:.0}")),
                every.len(),
            );
        }
    }
    text
}

/// What woke the deciding runs, most frequent first: `kernel 19, close-watch 1`.
fn woken_by(runs: &Runs) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for run in runs {
        *counts
            .entry(run["trigger"].as_str().unwrap_or("no decision"))
            .or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    counts
        .iter()
        .map(|(trigger, count)| format!("{trigger} {count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pods_table(results: &Value) -> String {
    let mut text = "| pods | mode | n | woken by | woken → decided p50 / p90 / p99 | crossing → decided p50 / p90 / p99 | crossing → memory back p50 / p90 / p99 | kernel won | wrong victim | decided, no crossing | agent CPU per run (ms) |\n\
                    |---:|---|---:|---|---|---|---|---:|---:|---:|---:|\n"
        .to_owned();
    for scenario in scenarios(results, "pods") {
        for mode in modes(scenario) {
            let every = all_runs(results, scenario, mode);
            if every.is_empty() {
                continue;
            }
            let these = runs(results, scenario, mode);
            let (n, all) = (these.len(), every.len());
            let cost = agent_cost(mode, &every);
            let cpu = cost.split(" | ").next().unwrap_or_default();
            text += &format!(
                "| {} | {mode} | {n} | {} | {} | {} | {} | {}/{all} | {}/{all} | {} | {cpu} |\n",
                scenario["pods"],
                woken_by(&these),
                triple(&field(&these, "decision_us")),
                triple(&field(&these, "decided_us")),
                triple(&field(&these, "back_us")),
                kernel_won(&every),
                wrong_victim(&every),
                all - n,
            );
        }
    }
    text
}

/// The phases of a decision the agent's `eviction decided` line times, and
/// what bench.md calls them.
const PHASES: [(&str, &str); 5] = [
    ("woken_to_run_us", "to the run"),
    ("observe_us", "node read"),
    ("list_us", "pods listed"),
    ("rank_us", "rankings"),
    ("exact_read_us", "exact reads"),
];

/// Decisions per pod count in the table of the slowest.
const SLOWEST_SHOWN: usize = 3;

fn decision_phases_table(results: &Value) -> String {
    let mut text = "| pods | mode | n | to the run | node read | pods listed | rankings | exact reads | read | rest | woken → decided |\n\
                    |---:|---|---:|---|---|---|---|---|---:|---|---|\n"
        .to_owned();
    for scenario in scenarios(results, "pods") {
        for mode in modes(scenario) {
            let these: Runs = runs(results, scenario, mode)
                .into_iter()
                .filter(|r| r["list_us"].is_number())
                .collect();
            if these.is_empty() {
                continue;
            }
            let rest: Vec<Option<f64>> = these
                .iter()
                .map(|r| {
                    let phases: Option<f64> = PHASES.iter().map(|(p, _)| r[*p].as_f64()).sum();
                    Some(r["decision_us"].as_f64()? - phases?)
                })
                .collect();
            let phases: Vec<String> = PHASES
                .iter()
                .map(|(phase, _)| triple(&field(&these, phase)))
                .collect();
            text += &format!(
                "| {} | {mode} | {} | {} | {} | {} | {} |\n",
                scenario["pods"],
                these.len(),
                phases.join(" | "),
                format_count(percentile(&field(&these, "exact_reads"), 0.5)),
                triple(&rest),
                triple(&field(&these, "decision_us")),
            );
        }
    }
    text
}

fn slowest_decisions_table(results: &Value) -> String {
    let mut text = "| pods | mode | woken → decided | longest phase | on CPU | off CPU | preempted | blocked |\n\
                    |---:|---|---:|---|---:|---:|---:|---:|\n"
        .to_owned();
    let count =
        |run: &Value, name: &str| run[name].as_u64().map_or("-".to_owned(), |n| n.to_string());
    for scenario in scenarios(results, "pods") {
        for mode in modes(scenario) {
            let mut these: Vec<(f64, &Value)> = runs(results, scenario, mode)
                .into_iter()
                .filter(|r| r["list_us"].is_number())
                .filter_map(|r| Some((r["decision_us"].as_f64()?, r)))
                .collect();
            these.sort_by(|a, b| b.0.total_cmp(&a.0));
            for (decision_us, run) in these.into_iter().take(SLOWEST_SHOWN) {
                let longest = PHASES
                    .iter()
                    .filter_map(|(phase, name)| Some((run[*phase].as_f64()?, name)))
                    .max_by(|a, b| a.0.total_cmp(&b.0))
                    .map_or("-".to_owned(), |(us, name)| {
                        format!("{name} {}", format_ms(Some(us)))
                    });
                text += &format!(
                    "| {} | {mode} | {} | {longest} | {} | {} | {} | {} |\n",
                    scenario["pods"],
                    format_ms(Some(decision_us)),
                    format_optional_ms(run["run_on_cpu_us"].as_f64()),
                    format_optional_ms(run["run_off_cpu_us"].as_f64()),
                    count(run, "run_preempted"),
                    count(run, "run_blocked"),
                );
            }
        }
    }
    text
}

/// A time an older agent's line did not carry is `-`, not `never`.
fn format_optional_ms(us: Option<f64>) -> String {
    us.map_or("-".to_owned(), |us| format_ms(Some(us)))
}

fn format_count(count: Option<f64>) -> String {
    count.map_or("-".to_owned(), |count| format!("{count:.0}"))
}

/// The overhead operations, as bench.json names their durations.
const OPERATIONS: [(&str, &str); 4] = [
    ("fault_ns", "page faults"),
    ("unmap_ns", "munmap"),
    ("kill_ns", "SIGKILL → reaped"),
    ("fork_ns", "fork → exit → reaped"),
];

/// Every duration of one operation over the runs, in ms.
fn durations(runs: &Runs, operation: &str) -> Vec<f64> {
    runs.iter()
        .flat_map(|r| r[operation].as_array().cloned().unwrap_or_default())
        .filter_map(|ns| ns.as_f64())
        .map(|ns| ns / 1e6)
        .collect()
}

/// The runs of one scenario and mode that have a crossing to measure
/// from, by round.
fn runs_by_round<'a>(results: &'a Value, scenario: &Value, mode: &str) -> BTreeMap<u64, &'a Value> {
    entries(results, scenario, mode)
        .into_iter()
        .filter(|r| has_crossing(&r["run"]))
        .filter_map(|r| Some((r["round"].as_u64()?, &r["run"])))
        .collect()
}

/// `compare` of a mode's run and another mode's run of the same round,
/// over the rounds both have a value in. Pairing takes out what moves
/// from round to round (the machine's load, where the sandbox landed),
/// which the spread of either mode alone carries into their difference.
fn paired(
    results: &Value,
    scenario: &Value,
    (mode, other): (&str, &str),
    compare: impl Fn(&Value, &Value) -> Option<f64>,
) -> Vec<f64> {
    let others = runs_by_round(results, scenario, other);
    runs_by_round(results, scenario, mode)
        .into_iter()
        .filter_map(|(round, run)| compare(run, others.get(&round)?))
        .collect()
}

/// A mode's slowdown against the floor in %: per round, the median of its
/// operations over the floor's median in the same round; the median of
/// those over the rounds, with its 95 % interval.
fn slowdown(results: &Value, scenario: &Value, mode: &str, operation: &str) -> Option<Estimate> {
    let per_round = paired(results, scenario, (mode, NO_AGENT), |run, floor| {
        let run = median(&durations(&vec![run], operation))?;
        let floor = median(&durations(&vec![floor], operation))?;
        Some((run / floor - 1.0) * 100.0)
    });
    median_with_ci(&per_round)
}

/// "+3.1 % (−0.4 … +6.0)": a slowdown and its 95 % interval.
fn format_slowdown(slowdown: Option<Estimate>) -> String {
    slowdown.map_or("–".to_owned(), |s| match s.ci95 {
        Some((low, high)) => format!("{:+.1} % ({low:+.1} … {high:+.1})", s.median),
        None => format!("{:+.1} %", s.median),
    })
}

fn overhead_table(results: &Value) -> String {
    let bytes = results["overhead_bytes"].as_u64().unwrap_or(0);
    let forks = results["overhead_forks"].as_u64().unwrap_or(0);
    let pid_threshold = results["pid_threshold"].as_u64().unwrap_or(0);
    let rounds = results["rounds"].as_u64().unwrap_or(0) as usize;
    let interval = match interval_rank(rounds) {
        Some(k) => format!(
            "order statistics: the {} to {} of {rounds} rounds",
            ordinal(k),
            ordinal(rounds + 1 - k)
        ),
        None => format!("none: {rounds} rounds are too few for one"),
    };
    let mut text = format!(
        "Each memory operation on {} MiB in 4 KiB pages, each fork operation {forks} \
         children forked, exiting at once and reaped one after another; the agent watches \
         `memory.available` and `pid.available` (below {pid_threshold} tasks), both far \
         from their lines unless said; the `none` row (no agent: the floor, \
         measured in the same rounds) gives the median time and throughput. Every other \
         row gives its slowdown paired by round: in each round, the median of the mode's \
         operations over the median of the floor's, then the median of those ratios over \
         the rounds, and in brackets its 95 % confidence interval ({interval}), which shows how much of a difference is the machine's \
         noise. n: operations of each kind (runs × repetitions). *close to the threshold*: the node's available memory between \
         threshold + 32 MiB and threshold + {} MiB throughout, never below the threshold. \
         `kernel.bpf_stats_enabled` is off, as on a node (on, it adds two clock reads to \
         every program run).\n\n\
         | condition | mode | n | page faults | munmap | SIGKILL → reaped | fork → exit → reaped | agent CPU per run (ms) | evictions |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
        bytes / MIB,
        (bytes + 32 * MIB) / MIB,
    );
    for scenario in scenarios(results, "overhead") {
        let condition = if scenario["near"] == true {
            "close to the threshold"
        } else {
            "far from thresholds"
        };
        for mode in modes(scenario) {
            let these = runs(results, scenario, mode);
            if these.is_empty() {
                continue;
            }
            let n = durations(&these, "fault_ns").len();
            let cells: Vec<String> = OPERATIONS
                .iter()
                .map(|(operation, _)| {
                    if mode == NO_AGENT {
                        median(&durations(&these, operation)).map_or("–".to_owned(), |ms| {
                            if *operation == "fork_ns" {
                                format!("{ms:.1} ms ({:.0} forks/s)", forks as f64 / (ms / 1e3))
                            } else {
                                format!(
                                    "{ms:.1} ms ({:.2} GiB/s)",
                                    bytes as f64 / (1u64 << 30) as f64 / (ms / 1e3)
                                )
                            }
                        })
                    } else {
                        format_slowdown(slowdown(results, scenario, mode, operation))
                    }
                })
                .collect();
            let cpu: Vec<f64> = these
                .iter()
                .filter_map(|r| r["agent_cpu_ms"].as_f64())
                .collect();
            let agent = |value: Option<f64>, format: &dyn Fn(f64) -> String| {
                if mode == NO_AGENT {
                    "–".to_owned()
                } else {
                    value.map_or("–".to_owned(), format)
                }
            };
            let evictions: u64 = these.iter().filter_map(|r| r["evictions"].as_u64()).sum();
            text += &format!(
                "| {condition} | {mode} | {n} | {} | {} | {} | {} | {} | {evictions} |\n",
                cells[0],
                cells[1],
                cells[2],
                cells[3],
                agent(median(&cpu), &|ms| format!("{ms:.1}")),
            );
        }
    }
    text
}

fn idle_table(results: &Value) -> String {
    let mut text =
        "| mode | CPU (% of a core) | RSS (MiB) | peak RSS (MiB) |\n|---|---:|---:|---:|\n"
            .to_owned();
    if let Some(idle) = results["idle"].as_object() {
        for (mode, measured) in idle {
            let mib = |field: &str| measured[field].as_f64().unwrap_or(f64::NAN) / MIB as f64;
            text += &format!(
                "| {mode} | {:.3} | {:.1} | {:.1} |\n",
                measured["cpu_percent"].as_f64().unwrap_or(f64::NAN),
                mib("rss_bytes"),
                mib("peak_rss_bytes"),
            );
        }
    }
    text
}

fn bpf_table(results: &Value) -> String {
    let mut totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for run in results["runs"].as_array().into_iter().flatten() {
        if run["mode"] != "event" {
            continue;
        }
        for entry in run["run"]["bpf"].as_array().into_iter().flatten() {
            if let (Some(program), Some(count), Some(nanos)) =
                (entry[0].as_str(), entry[1].as_u64(), entry[2].as_u64())
            {
                let total = totals.entry(program.to_owned()).or_default();
                total.0 += count;
                total.1 += nanos;
            }
        }
    }
    let mut text = "| program | runs | ns per run |\n|---|---:|---:|\n".to_owned();
    for (program, (count, nanos)) in totals.into_iter().filter(|(_, (c, _))| *c > 0) {
        text += &format!(
            "| {program} | {count} | {:.1} |\n",
            nanos as f64 / count as f64
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ranks_are_spelled_as_english_ordinals() {
        let spelled: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 18, 20, 21, 22, 99, 101]
            .into_iter()
            .map(ordinal)
            .collect();
        assert_eq!(
            spelled,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "18th", "20th", "21st", "22nd",
                "99th", "101st"
            ]
        );
    }

    #[test]
    fn a_p99_resting_on_fewer_than_100_runs_is_called_the_maximum() {
        let five: Vec<Option<f64>> = (1..=5).map(|ms| Some(f64::from(ms) * 1e3)).collect();
        assert_eq!(triple(&five), "3.00 / 5.00 / 5.00 (max)");
        let hundred: Vec<Option<f64>> = (1..=100).map(|ms| Some(f64::from(ms) * 1e3)).collect();
        assert_eq!(triple(&hundred), "50 / 90 / 99");
    }

    #[test]
    fn only_kills_that_waited_on_a_task_are_listed_as_slow_freezes() {
        let slow = json!({"kill_started_us": 800.0, "frozen_us": 15_800.0,
            "freeze_holdouts": "4242 D vma_prepare"});
        let quick = json!({"kill_started_us": 800.0, "frozen_us": 1_300.0});
        let results = json!({
            "scenarios": [{"name": "memory, max rate", "kind": "memory", "modes": ["event"]}],
            "runs": [
                {"scenario": "memory, max rate", "mode": "event", "round": 3, "run": quick},
                {"scenario": "memory, max rate", "mode": "event", "round": 7, "run": slow},
            ],
        });
        let table = slow_freezes_table(&results);
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(
            rows,
            ["| memory, max rate | event | 7 | 15 | 4242 D vma_prepare |"],
            "{table}"
        );
        let none = json!({"scenarios": results["scenarios"], "runs": [
            {"scenario": "memory, max rate", "mode": "event", "round": 3, "run": quick},
        ]});
        assert_eq!(slow_freezes_table(&none), "None.\n");
    }

    #[test]
    fn decided_to_memory_back_is_taken_within_each_run() {
        let back = json!({"back_us": 130_000.0, "decided_us": 30_000.0});
        let lost = json!({"back_us": null, "decided_us": 30_000.0});
        let runs: Runs = vec![&back, &lost];
        assert_eq!(decided_to_back(&runs), [Some(100_000.0), None]);
    }

    #[test]
    fn the_rest_of_a_decision_is_what_its_phases_leave_and_old_logs_get_no_row() {
        let phased = json!({
            "decision_us": 2_000.0, "woken_to_run_us": 100.0, "observe_us": 200.0,
            "list_us": 1_000.0, "rank_us": 300.0, "exact_read_us": 250.0, "exact_reads": 1,
        });
        let results = json!({
            "scenarios": [
                {"name": "250 pods", "kind": "pods", "pods": 250, "modes": ["event", "poll"]},
            ],
            "runs": [
                {"scenario": "250 pods", "mode": "event", "run": phased},
                // An agent whose line has no phases.
                {"scenario": "250 pods", "mode": "poll", "run": {"decision_us": 9_000.0}},
            ],
        });
        let table = decision_phases_table(&results);
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(rows.len(), 1, "{table}");
        let cells: Vec<&str> = rows[0].split(" | ").collect();
        assert_eq!(cells[..3], ["| 250", "event", "1"]);
        assert_eq!(cells[8], "1", "exact reads");
        assert!(cells[9].starts_with("0.15 / "), "rest: {}", cells[9]);
    }

    #[test]
    fn the_slowest_decisions_come_first_with_their_longest_phase_and_time_off_the_cpu() {
        let run = |decision: f64, list: f64, off: Option<f64>| {
            json!({
                "decision_us": decision, "woken_to_run_us": 100.0, "observe_us": 200.0,
                "list_us": list, "rank_us": 50.0, "exact_read_us": 100.0,
                "run_on_cpu_us": 400.0, "run_off_cpu_us": off,
                "run_preempted": off.map(|_| 0), "run_blocked": off.map(|_| 1),
            })
        };
        let results = json!({
            "scenarios": [{"name": "100 pods", "kind": "pods", "pods": 100, "modes": ["event"]}],
            "runs": [
                {"scenario": "100 pods", "mode": "event", "run": run(900.0, 300.0, Some(0.0))},
                {"scenario": "100 pods", "mode": "event", "run": run(2_400.0, 1_500.0, Some(1_100.0))},
                {"scenario": "100 pods", "mode": "event", "run": run(700.0, 250.0, Some(0.0))},
                // An older agent's line: no thread usage.
                {"scenario": "100 pods", "mode": "event", "run": run(1_000.0, 400.0, None)},
            ],
        });
        let table = slowest_decisions_table(&results);
        let rows: Vec<Vec<&str>> = table
            .lines()
            .skip(2)
            .map(|row| row.split(" | ").collect())
            .collect();
        assert_eq!(rows.len(), SLOWEST_SHOWN, "{table}");
        assert_eq!(
            rows[0],
            [
                "| 100",
                "event",
                "2.40",
                "pods listed 1.50",
                "0.40",
                "1.10",
                "0",
                "1 |"
            ]
        );
        assert_eq!(
            rows[1][2..],
            ["1.00", "pods listed 0.40", "0.40", "-", "-", "- |"]
        );
        assert_eq!(rows[2][2], "0.90");
    }

    #[test]
    fn the_zones_lead_counts_an_attach_after_the_crossing_and_skips_runs_without_one() {
        let run = |attached: Option<f64>| json!({ "hooks_attached_us": attached });
        let results = json!({
            "scenarios": [{"name": "memory, max rate", "kind": "memory", "modes": ["event", "oracle"]}],
            "runs": [
                {"scenario": "memory, max rate", "mode": "event", "run": run(Some(-30_000.0))},
                {"scenario": "memory, max rate", "mode": "event", "run": run(Some(-12_000.0))},
                {"scenario": "memory, max rate", "mode": "event", "run": run(Some(2_000.0))},
                {"scenario": "memory, max rate", "mode": "event", "run": run(None)},
                {"scenario": "memory, max rate", "mode": "oracle", "run": run(None)},
            ],
        });
        let table = zone_lead_table(&results);
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(
            rows,
            ["| memory, max rate | event | 3 | -2.00 / -2.00 / 12 | 1 |"],
            "{table}"
        );
    }

    #[test]
    fn a_fork_bomb_run_without_a_crossing_keeps_its_row_and_its_victims() {
        let results = json!({
            "scenarios": [{"name": "fork bomb", "kind": "fork-bomb", "modes": ["event"]}],
            "runs": [{"scenario": "fork bomb", "mode": "event", "run": {
                "decided_without_crossing": true,
                "kernel_kills": 0,
                "victims": ["default/quiet"],
                "lost_pods": [],
                "agent_cpu_ms": 10.0,
                "agent_peak_rss_bytes": 0,
            }}],
        });
        let table = fork_bomb_table(&results);
        let row = table.lines().nth(2).expect("a row for event mode");
        let cells: Vec<&str> = row.split(" | ").collect();
        // scenario, mode, n, three timings, kernel won, wrong victim, no
        // crossing.
        assert_eq!(cells[..3], ["| fork bomb", "event", "0"]);
        assert_eq!(cells[6..9], ["0/1", "1/1", "1"]);
    }
}
