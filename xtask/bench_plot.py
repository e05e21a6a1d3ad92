"""Draws the bench's plots from bench.json (cargo xtask bench runs this).

memory-back.png: one panel per memory scenario; per mode, every run's time
from the node's real threshold crossing until the memory is back, on a log
scale, its median (black bar) and p99 (red tick); the oracle's median (no
agent: the bench kills at the crossing, the kernel's floor) is drawn across
the panel. A run without memory back by the agent (the kernel OOM killer
struck first, or no decision) is an x at the top; a run decided before the
bench saw a crossing is left out, as in the tables.

pod-count.png: event mode's time from the trigger that woke its deciding
run to the decision, against the pods on the node: every run (filled when
the trigger was the kernel record, hollow for a timer), the median and the
p99, with the goal where the issue sets one.

reserve-sweep.png: the reserve sweep, runs the kernel's OOM killer ended
first against the threshold, one line per mode.

Usage: python3 bench_plot.py RESULTS_DIR
"""

import json
import math
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NEVER_MS = 1e5
# Issue 13's goals for woken → decided p99, by pod count.
DECISION_GOALS_MS = {100: 2.0, 250: 5.0}


def nearest_rank(values, q):
    """The q quantile of the sorted values, nearest rank (as bench.md)."""
    ordered = sorted(values)
    return ordered[min(max(math.ceil(q * len(ordered)), 1), len(ordered)) - 1]


def command(results):
    """The cargo xtask command equivalent to the bench's own command line."""
    words = results["command"].split()[1:]
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("--evictd", "--workload", "--out", "--earlyoom", "--stop-file"):
            skip = True
        else:
            kept.append(word)
    xtask = "cargo xtask bench --vm" if results.get("node") == "root" else "cargo xtask bench"
    return xtask + (" -- " + " ".join(kept) if kept else "")


def subtitle(results, width):
    """The command and the machine, wrapped to `width` characters."""
    text = (
        f"{command(results)} — Linux {results['kernel']} ({results['cgroup']}, "
        f"{results['cpus']} CPUs), {results['rounds']} "
        f"round{'' if results['rounds'] == 1 else 's'}"
    )
    return textwrap.fill(text, width)


def runs_of(results, scenario, mode):
    return [
        r["run"] for r in results["runs"]
        if r["scenario"] == scenario["name"] and r["mode"] == mode
    ]


def memory_back(results, out):
    scenarios = [s for s in results["scenarios"] if s["kind"] == "memory"]
    if not scenarios:
        return
    fig, axes = plt.subplots(
        1, len(scenarios), figsize=(max(6.4, 4.4 * len(scenarios)), 5.2), sharey=True,
        squeeze=False,
    )
    lowest = NEVER_MS
    for axis, scenario in zip(axes[0], scenarios):
        modes = scenario["modes"]
        for position, mode in enumerate(modes):
            # As in the tables: a run decided before the bench saw a
            # crossing has nothing to measure from, and is not a "never".
            runs = [r for r in runs_of(results, scenario, mode)
                    if not r["decided_without_crossing"]]
            back = [r["back_us"] / 1e3 for r in runs if r["back_us"] is not None]
            lowest = min([lowest] + back)
            never = len(runs) - len(back)
            offsets = [position + 0.25 * ((i % 5) - 2) / 2 for i in range(len(back))]
            color = "tab:green" if mode == "oracle" else "tab:blue"
            axis.scatter(offsets, back, s=14, alpha=0.6, color=color)
            if back:
                axis.hlines(nearest_rank(back, 0.5), position - 0.3, position + 0.3, colors="black")
                if not never:
                    axis.hlines(nearest_rank(back, 0.99), position - 0.15, position + 0.15,
                                colors="red")
                if mode == "oracle":
                    floor = nearest_rank(back, 0.5)
                    axis.axhline(floor, color="tab:green", linestyle="--", linewidth=1)
                    # The goal: event within 10 ms of the floor (p50); on
                    # a machine's root under emulation within 15 % of it.
                    on_root = results.get("node") == "root"
                    band = floor * 0.15 if on_root else 10
                    label = "+15 %" if on_root else "+10 ms"
                    axis.axhspan(floor, floor + band, color="tab:green", alpha=0.15)
                    axis.annotate(f"oracle floor (p50) {floor:.0f} ms; band: {label}",
                                  (-0.45, floor), textcoords="offset points", xytext=(0, -10),
                                  ha="left", fontsize=7, color="tab:green")
            if never:
                axis.scatter([position], [NEVER_MS], marker="x", color="red", s=40)
                axis.annotate(f"{never} never", (position, NEVER_MS), textcoords="offset points",
                              xytext=(0, 6), ha="center", fontsize=7, color="red")
        axis.set_yscale("log")
        axis.set_xticks(range(len(modes)))
        axis.set_xticklabels(modes, rotation=45, ha="right", fontsize=8)
        axis.set_title(scenario["name"], fontsize=10)
        axis.grid(axis="y", which="both", alpha=0.25)
    axes[0][0].set_ylim(max(lowest / 2, 1), NEVER_MS * 3)
    axes[0][0].set_ylabel("threshold crossed → memory back (ms, log)")
    width = max(70, 40 * len(scenarios))
    fig.suptitle(
        textwrap.fill(
            "crossing → memory back per mode; black: median, red: p99, "
            "x: no memory back (the kernel OOM killer first)", width)
        + "\n" + subtitle(results, width),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out / "memory-back.png", dpi=110)


def pod_count(results, out):
    scenarios = [s for s in results["scenarios"] if s["kind"] == "pods"]
    if not scenarios:
        return
    fig, axis = plt.subplots(figsize=(6.4, 4.6))
    counts, medians, tails = [], [], []
    for scenario in scenarios:
        count = scenario["pods"]
        runs = runs_of(results, scenario, "event")
        timed = [r for r in runs if r["decision_us"] is not None]
        decided = [max(r["decision_us"] / 1e3, 0.01) for r in timed]
        if not decided:
            continue
        jitter = [count * (1 + 0.04 * ((i % 5) - 2)) for i in range(len(decided))]
        # Filled: woken by a kernel record; hollow: by anything else (the
        # resync timer, a close watch), which the table counts per trigger.
        kernel = [r["trigger"] == "kernel" for r in timed]
        axis.scatter([x for x, k in zip(jitter, kernel) if k],
                     [y for y, k in zip(decided, kernel) if k],
                     s=12, alpha=0.5, color="tab:blue")
        axis.scatter([x for x, k in zip(jitter, kernel) if not k],
                     [y for y, k in zip(decided, kernel) if not k],
                     s=12, alpha=0.7, facecolors="none", edgecolors="tab:blue")
        counts.append(count)
        medians.append(nearest_rank(decided, 0.5))
        tails.append(nearest_rank(decided, 0.99))
        if count in DECISION_GOALS_MS:
            goal = DECISION_GOALS_MS[count]
            axis.hlines(goal, count * 0.8, count * 1.25, colors="red", linestyles="dotted")
            axis.annotate(f"goal p99 ≤ {goal:g} ms", (count * 0.8, goal), fontsize=7,
                          color="red", va="bottom")
    if not counts:
        # Every run was decided before the bench saw a crossing (a smoke
        # run of one round can be): nothing to draw, as the table says.
        plt.close(fig)
        print("pod-count.png: no run with a crossing to measure from; not drawn")
        return
    axis.plot(counts, medians, "o-", color="black", label="median")
    axis.plot(counts, tails, "s--", color="tab:red", label="p99")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlim(min(counts) * 0.6, max(counts) * 1.6)
    low, high = axis.get_ylim()
    goals = [g for c, g in DECISION_GOALS_MS.items() if c in counts]
    axis.set_ylim(min([low] + [g / 2 for g in goals]), max([high] + [g * 2 for g in goals]))
    axis.set_xticks(counts)
    axis.set_xticklabels([str(c) for c in counts])
    axis.set_xlabel("pods on the node")
    axis.set_ylabel("woken → eviction decided (ms, log)")
    axis.grid(which="both", alpha=0.25)
    axis.legend(fontsize=8)
    fig.suptitle(textwrap.fill("event mode: decision latency against pod count (filled: woken "
                               "by the kernel record, hollow: by a timer)", 80)
                 + "\n" + subtitle(results, 80), fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "pod-count.png", dpi=110)


def reserve_sweep(results, out):
    """Runs the kernel's OOM killer ended first against the threshold, one
    line per mode (the reserve sweep)."""
    scenarios = sorted((s for s in results["scenarios"] if s["kind"] == "reserve"),
                       key=lambda s: s["threshold"])
    if not scenarios:
        return
    fig, axis = plt.subplots(figsize=(7.2, 4.8))
    thresholds = [s["threshold"] / 2**20 for s in scenarios]
    modes = list(dict.fromkeys(m for s in scenarios for m in s["modes"]))
    for index, mode in enumerate(modes):
        lost, totals = [], []
        for scenario in scenarios:
            runs = runs_of(results, scenario, mode)
            # Lost: the kernel's OOM killer first, or nothing at all
            # before the deadline (stalled).
            lost.append(sum(1 for r in runs if r["kernel_kills"] > 0 or r.get("stalled")))
            totals.append(len(runs))
        style = "--" if mode == "oracle" else "-"
        # Modes that lose alike would hide each other: a small offset each.
        offset = (index - len(modes) / 2) * 0.04
        axis.plot(thresholds, [count + offset for count in lost], style, marker="o",
                  label=f"{mode} (of {max(totals)} runs)")
    axis.set_xscale("log")
    # Only the thresholds run, not the log scale's own minor labels.
    axis.minorticks_off()
    axis.set_xticks(thresholds)
    axis.set_xticklabels([f"{t:.0f}" for t in thresholds])
    axis.set_xlabel("--threshold: memory.available below (MiB, log)")
    # From none to every run, whatever was lost: a sweep no mode lost a run
    # of must not zoom into the offsets.
    most = max(len(runs_of(results, s, m)) for s in scenarios for m in modes)
    axis.set_ylim(-0.5, most + 0.5)
    axis.yaxis.get_major_locator().set_params(integer=True)
    axis.set_ylabel("runs lost: kernel OOM kill, or none within 30 s")
    axis.grid(alpha=0.25)
    axis.legend(fontsize=8)
    width = 80
    rate = scenarios[0]["rate"]
    fig.suptitle(
        textwrap.fill(
            "reserve sweep: kernel OOM kills per mode against the threshold, the bomb at "
            + ("max rate" if rate == 0 else f"{rate // 2**20} MiB/s"), width)
        + "\n" + subtitle(results, width),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out / "reserve-sweep.png", dpi=110)


def main(results_dir: Path) -> None:
    results = json.loads((results_dir / "bench.json").read_text())
    memory_back(results, results_dir)
    reserve_sweep(results, results_dir)
    pod_count(results, results_dir)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
