"""Display lag of `launcher run`: from a training process printing a line to `launcher run` showing it.

A 2-node local run (1 process per node, local work dir); each rank prints --lines lines at random
intervals of 0.05-0.3 s, alternately to stdout and stderr, each carrying the time it was printed.
`launcher run` follows the run in the foreground; this script reads its output as it comes and
takes each line's lag when it arrives. Also checks that every line arrives, and counts the lines
shown before a line their rank printed earlier.

    .venv/bin/python benchmarks/log_lag.py [--lines 40] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRINTS = """
import os, random, sys, time
rank = os.environ["RANK"]
for i in range({lines}):
    time.sleep(random.uniform(0.05, 0.3))
    stream = sys.stdout if i % 2 else sys.stderr
    stream.write(f"LAG rank {{rank}} line {{i}} at {{time.time():.6f}}\\n")
    stream.flush()
"""

SPEC = """kind: distributed
apiVersion: v1.0
spec:
  name: lag
  infrastructure: {kind: infrastructure, type: local}
  cluster:
    kind: pytorch
    spec: {workDir: ./wd, main: {replicas: 1}, worker: {replicas: 1}}
  runtime: {kind: python, spec: {entryPoint: prints.py}}
"""

LINE = re.compile(r"LAG rank (\d+) line (\d+) at ([\d.]+)")


def one_run(project: Path, env: dict, lines: int) -> tuple[list[float], int]:
    """Run once; the lag of every line in seconds, and how many lines came out of their rank's order."""
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "run", "-f", "train.yaml"], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    lags: list[float] = []
    seen: dict[str, list[int]] = {}
    for line in proc.stdout:
        arrived = time.time()
        found = LINE.search(line)
        if found:
            lags.append(arrived - float(found.group(3)))
            seen.setdefault(found.group(1), []).append(int(found.group(2)))
    assert proc.wait() == 0, "the run failed"
    assert {rank: sorted(numbers) for rank, numbers in seen.items()} == {
        rank: list(range(lines)) for rank in ("0", "1")}, f"lines lost: {seen}"
    return lags, sum(later < earlier for numbers in seen.values() for earlier, later in zip(numbers, numbers[1:]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=40, help="lines per rank")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    lags: list[float] = []
    disordered = 0
    with tempfile.TemporaryDirectory(prefix="lag-bench-") as tmp:
        project = Path(tmp)
        (project / "prints.py").write_text(PRINTS.format(lines=args.lines))
        (project / "train.yaml").write_text(SPEC)
        env = {**os.environ, "LAUNCHER_HOME": str(project / "home")}
        for _ in range(args.repeat):
            run_lags, run_disordered = one_run(project, env, args.lines)
            lags += run_lags
            disordered += run_disordered
    deciles = statistics.quantiles(lags, n=10)
    print(f"{len(lags)} lines ({args.lines} per rank, 2 nodes, {args.repeat} runs), print to display:")
    print(f"  median {statistics.median(lags):.3f} s, p90 {deciles[-1]:.3f} s, "
          f"min {min(lags):.3f} s, max {max(lags):.3f} s (target: median < 0.25 s)")
    print(f"  lines shown before a line their rank printed earlier: {disordered}")


if __name__ == "__main__":
    main()
