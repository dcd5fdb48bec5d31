"""A whole run of the example against TorchX's `local_cwd`, and where launcher's end goes.

The example from `launcher init`, 2 nodes x 1 process, `-- --epochs 4`, started from the shell as a user
would, alternated in one run:

- launcher: `launcher run -f train.yaml -- --epochs 4` (submit, follow the logs, exit with the result);
- launcher cold: the same with warm starts off (`--env LAUNCHER_WARM_START=0`): what they save;
- torchx:   `torchx run -s local_cwd dist.ddp -j 2x1 --script train.py -- --epochs 4` (TorchX 0.7.0 in its
            own venv; its torchrun is this venv's, first on PATH).

For each launcher run, its timeline (`launcher timeline RUN --json`) gives the end: from the last training
process's exit to `launcher run` returning, and the part of it before torchrun's exit. Medians of the pairs.

    .venv/bin/python benchmarks/end_to_end.py [--repeat 5] [--epochs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import median, scratch_dir, torchx_bin

BIN = Path(sys.executable).parent


def launcher(project: Path, home: Path, epochs: int, options: tuple[str, ...] = ()) -> tuple[float, float, float]:
    """(wall seconds, last process exit -> `launcher run` returned, last process exit -> last torchrun exit)."""
    env = {**os.environ, "LAUNCHER_HOME": str(home)}
    started = time.time()
    done = subprocess.run([str(BIN / "launcher"), "run", "-f", "train.yaml", *options, "--", "--epochs", str(epochs)],
                          cwd=project, env=env, capture_output=True, text=True)
    returned = time.time()
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = next(line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.startswith("run "))
    found = json.loads(subprocess.run([str(BIN / "launcher"), "timeline", run_id, "--json"], env=env,
                                      capture_output=True, text=True, check=True).stdout)
    last_exit = max(event["at"] for event in found["events"] if event["phase"] == "rank-exited")
    torchrun_exit = max(event["at"] for event in found["events"] if event["phase"] == "exited")
    return returned - started, returned - last_exit, torchrun_exit - last_exit


def torchx(project: Path, epochs: int) -> float:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    started = time.time()
    done = subprocess.run([str(torchx_bin()), "run", "-s", "local_cwd", "dist.ddp", "-j", "2x1", "--script",
                           "train.py", "--", "--epochs", str(epochs)], cwd=project, env=env,
                          capture_output=True, text=True)
    elapsed = time.time() - started
    assert done.returncode == 0 and "final test accuracy" in done.stdout + done.stderr, done.stdout + done.stderr
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    root = scratch_dir("end-to-end-")
    project = root / "project"
    subprocess.run([str(BIN / "launcher"), "init", "--framework", "pytorch", "--dir", str(project)], check=True,
                   capture_output=True)
    torchx_bin()
    torchx(project, 1)  # warm-up: both find their files in the page cache
    launcher(project, root / "home", 1)
    ours, cold, theirs, ends, before_torchrun_exit = [], [], [], [], []
    for _ in range(args.repeat):
        wall, end, in_torchrun = launcher(project, root / "home", args.epochs)
        ours.append(wall)
        ends.append(end)
        before_torchrun_exit.append(in_torchrun)
        cold.append(launcher(project, root / "home", args.epochs, ("--env", "LAUNCHER_WARM_START=0"))[0])
        theirs.append(torchx(project, args.epochs))
        print(f"launcher {wall:.2f} s (end {end:.3f} s), cold {cold[-1]:.2f} s, torchx {theirs[-1]:.2f} s",
              file=sys.stderr)
    print(f"| 2 nodes x 1 process, {args.epochs} epochs | median wall time |")
    print("|---|---|")
    print(f"| launcher run | {median(ours):.2f} s |")
    print(f"| launcher run, LAUNCHER_WARM_START=0 | {median(cold):.2f} s |")
    print(f"| torchx local_cwd | {median(theirs):.2f} s |")
    print(f"\nlauncher / torchx: {median(ours) / median(theirs):.2f}x (target <= 0.95x), with warm starts off "
          f"{median(cold) / median(theirs):.2f}x, {args.repeat} rounds; "
          f"the end (last training process exit -> `launcher run` returned): median {median(ends):.3f} s, "
          f"max {max(ends):.3f} s (target <= 0.3 s), of which {median(before_torchrun_exit):.3f} s before "
          f"torchrun's exit; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
