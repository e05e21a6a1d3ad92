"""Draws bench.png from bench.json (cargo xtask bench runs this).

One panel per scenario; per mode, every run's time from the node's real
threshold crossing to the agent's decision, on a log scale. A run the agent
never decided (the kernel OOM killer or pids.max got there first) is drawn
as an x at the top of its panel.

Usage: python3 bench_plot.py RESULTS_DIR
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(results_dir: Path) -> None:
    results = json.loads((results_dir / "bench.json").read_text())
    scenarios = results["scenarios"]
    modes = results["modes"]
    fig, axes = plt.subplots(
        1, len(scenarios), figsize=(4.2 * len(scenarios), 4.8), sharey=True, squeeze=False
    )
    never_ms = 1e5
    for axis, scenario in zip(axes[0], scenarios):
        for position, mode in enumerate(modes):
            runs = [
                r["run"] for r in results["runs"]
                if r["scenario"] == scenario and r["mode"] == mode
            ]
            decided = [r["decided_us"] / 1e3 for r in runs if r["decided_us"] is not None]
            # A decision can precede the logged crossing by less than the
            # log's resolution; clip at 10 µs to keep it on a log axis.
            decided = [max(ms, 0.01) for ms in decided]
            never = len(runs) - len(decided)
            offsets = [position + 0.25 * ((i % 5) - 2) / 2 for i in range(len(decided))]
            axis.scatter(offsets, decided, s=14, alpha=0.7)
            if decided:
                median = sorted(decided)[len(decided) // 2]
                axis.hlines(median, position - 0.3, position + 0.3, colors="black")
            if never:
                axis.scatter([position], [never_ms], marker="x", color="red", s=40)
                axis.annotate(f"{never} never", (position, never_ms), textcoords="offset points",
                              xytext=(0, 6), ha="center", fontsize=7, color="red")
        axis.set_yscale("log")
        axis.set_ylim(0.005, never_ms * 3)
        axis.set_xticks(range(len(modes)))
        axis.set_xticklabels(modes, rotation=45, ha="right", fontsize=8)
        axis.set_title(scenario, fontsize=10)
        axis.grid(axis="y", which="major", alpha=0.3)
    axes[0][0].set_ylabel("threshold crossed → agent decided (ms, log)")
    fig.suptitle(
        f"evictd bench on Linux {results['kernel']} ({results['cgroup']}, {results['cpus']} CPUs): "
        "x = kernel won, never decided",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(results_dir / "bench.png", dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
