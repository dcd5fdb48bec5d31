"""Dry-run speed and memory: `launcher run --dry-run --backend oci` on the seed 004 spec against
`torchx run --dryrun -s local_cwd dist.ddp -j 3x1 --script train.py` (torchx 0.7.0 in its own venv).

Whole processes, alternated in one run; reports median wall time, peak RSS and the ratio. Both run with
their bytecode cached, as installed packages do (PYTHONDONTWRITEBYTECODE is dropped for them, so the
warm-up run writes launcher's): otherwise only launcher, run from this checkout, compiles on every run.

    .venv/bin/python benchmarks/dryrun_vs_torchx.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common import REPO, median, scratch_dir, timed_process, torchx_bin

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    torchx = torchx_bin()
    launcher = Path(sys.executable).with_name("launcher")
    workdir = scratch_dir("dryrun-vs-torchx-")
    (workdir / "train.py").write_text("print('hello')\n")
    commands = {
        "launcher": [str(launcher), "run", "-f", str(REPO / "tests/specs/seed004_train.yaml"), "--dry-run",
                     "--backend", "oci"],
        "torchx": [str(torchx), "run", "--dryrun", "-s", "local_cwd", "dist.ddp", "-j", "3x1", "--script",
                   "train.py"],
    }
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    for argv in commands.values():  # warm the page cache and write the bytecode once
        timed_process(argv, cwd=workdir, env=env)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeat):
        for name, argv in commands.items():
            wall, rss, status = timed_process(argv, cwd=workdir, env=env)
            assert status == 0, f"{name} failed"
            samples[name].append((wall, rss))
    rows = {name: (median([w for w, _ in s]), max(r for _, r in s)) for name, s in samples.items()}
    print("| command | median wall time | peak RSS |\n|---|---|---|")
    for name, (wall, rss) in rows.items():
        print(f"| {name} | {wall * 1000:.0f} ms | {rss:.1f} MiB |")
    ratio = rows["launcher"][0] / rows["torchx"][0]
    print(f"\nlauncher / torchx wall time: {ratio:.2f}x (target <= 0.8x); launcher peak RSS "
          f"{rows['launcher'][1]:.1f} MiB (target <= 30 MiB); {args.repeat} runs each")


if __name__ == "__main__":
    main()
