"""Threads per training process: the example's training speed with launcher's default against hand-tuned
``OMP_NUM_THREADS=1`` and against every process taking every core (what the default was before the node gave
each process its share, issue 37), alternated in one run.

Each variant is `launcher run -f train.yaml --nodes N` of the example from `launcher init` (N nodes x 1 process
on this machine). Reports the median over runs of the training throughput (samples/s from the script's own
lines, epochs after the first, summed over the ranks) and of the whole run's wall time.

    .venv/bin/python benchmarks/threads.py [--repeat 3] [--epochs 6] [--nodes 2]
"""

from __future__ import annotations

import argparse
import os

from common import median, scratch_dir
from local_vs_torchrun import example_project, launcher_run, throughput


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    root = scratch_dir("threads-")
    project = example_project(root, args.epochs)
    cores = len(os.sched_getaffinity(0))
    variants = {
        "launcher's default": (),
        "hand-tuned OMP_NUM_THREADS=1": ("--env", "OMP_NUM_THREADS=1"),
        f"OMP_NUM_THREADS={cores} (every core, as before)": ("--env", f"OMP_NUM_THREADS={cores}"),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, options in variants.items():
            wall, log = launcher_run(project, args.epochs, root / "home", args.nodes, options)
            results[name].append((wall, throughput(log)))
    print(f"| {args.nodes} nodes x 1 process on {cores} cores | median throughput (samples/s) | "
          "median wall time |")
    print("|---|---|---|")
    summary = {name: (median([t for _, t in rows]), median([w for w, _ in rows])) for name, rows in results.items()}
    for name, (rate, wall) in summary.items():
        print(f"| {name} | {rate:.0f} | {wall:.2f} s |")
    default, tuned = summary["launcher's default"][0], summary["hand-tuned OMP_NUM_THREADS=1"][0]
    print(f"\nhand-tuned / default throughput: {tuned / default:.2f}x (target <= 1.1x); {args.repeat} runs each, "
          f"{args.epochs} epochs, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
