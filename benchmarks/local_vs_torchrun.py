"""The local backend against plain torchrun for the same N-node job on loopback (2 by default).

Plain: N `torchrun --nnodes N --node-rank R --master-addr 127.0.0.1` processes started by hand.
Launcher: `launcher run -f train.yaml --nodes N` (foreground: submit, follow the logs, exit with the result).
Both train the example from `launcher init` for the same epochs; alternated in one run.
Reports total wall time and training throughput (samples/s from the script's own log lines,
epochs after the first, summed over the two ranks).

    .venv/bin/python benchmarks/local_vs_torchrun.py [--repeat 5] [--epochs 6] [--nodes 8]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from common import median, scratch_dir

THROUGHPUT = re.compile(r"rank (\d+): epoch (\d+)/\d+ .* samples_per_s ([\d.]+)")


def throughput(log: str) -> float:
    """Mean over epochs (after the first) of the summed samples/s of all ranks."""
    per_epoch: dict[int, float] = {}
    for _, epoch, rate in THROUGHPUT.findall(log):
        if int(epoch) > 1:
            per_epoch[int(epoch)] = per_epoch.get(int(epoch), 0.0) + float(rate)
    return sum(per_epoch.values()) / max(len(per_epoch), 1)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def plain_torchrun(project: Path, epochs: int, nodes: int) -> tuple[float, str]:
    port = str(free_port())
    started = time.perf_counter()
    procs = []
    for rank in range(nodes):
        env = {**os.environ, "LAUNCHER_OUTPUTS_DIR": str(scratch_dir(f"plain-rank{rank}-"))}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(rank),
             "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
             "train.py", "--epochs", str(epochs)],
            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate()[0] for p in procs]
    elapsed = time.perf_counter() - started
    assert all(p.returncode == 0 for p in procs), outputs
    return elapsed, "\n".join(outputs)


def launcher_run(project: Path, epochs: int, home: Path, nodes: int,
                 options: tuple[str, ...] = ()) -> tuple[float, str]:
    """``options``: more of `launcher run`'s (``--env NAME=VALUE``)."""
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("launcher")), "run", "-f", "train.yaml", "--nodes",
                           str(nodes), *options],
                          cwd=project, env={**os.environ, "LAUNCHER_HOME": str(home)},
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stdout + done.stderr
    return elapsed, done.stdout


def example_project(root: Path, epochs: int) -> Path:
    """`launcher init`'s example in ``root``/project, training ``epochs`` epochs."""
    project = root / "project"
    subprocess.run([str(Path(sys.executable).with_name("launcher")), "init", "--framework", "pytorch", "--dir",
                    str(project)], check=True, capture_output=True)
    spec = project / "train.yaml"
    spec.write_text(spec.read_text().replace("        - 8\n", f"        - {epochs}\n"))
    return project


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    root = scratch_dir("local-vs-torchrun-")
    project = example_project(root, args.epochs)
    results: dict[str, list[tuple[float, float]]] = {"plain torchrun": [], "launcher run": []}
    for _ in range(args.repeat):
        wall, log = plain_torchrun(project, args.epochs, args.nodes)
        results["plain torchrun"].append((wall, throughput(log)))
        wall, log = launcher_run(project, args.epochs, root / "home", args.nodes)
        results["launcher run"].append((wall, throughput(log)))
    summary = {name: (median([w for w, _ in rows]), median([t for _, t in rows])) for name, rows in results.items()}
    print(f"| {args.nodes} nodes x 1 process, example job | median total wall time | median throughput (samples/s) |")
    print("|---|---|---|")
    for name, (wall, rate) in summary.items():
        print(f"| {name} | {wall:.2f} s | {rate:.0f} |")
    plain, ours = summary["plain torchrun"], summary["launcher run"]
    print(f"\nlauncher run - plain torchrun: {ours[0] - plain[0]:+.2f} s, {ours[0] / plain[0]:.2f}x (targets: <= +1 s "
          f"on 2 nodes, <= 1.1x on 8); throughput ratio {ours[1] / plain[1]:.3f} (target >= 0.97); {args.repeat} runs "
          f"each, {args.epochs} epochs, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
