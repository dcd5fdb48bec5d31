"""The client on a run of N nodes: `status`, `status --json`, `watch --no-follow`, `timeline` and `timeline -o x.svg`,
each timed to its first output and to its end, with its peak memory.

The run's work dir is a local one written by benchmarks/scale.py (every node's registration, status record,
events, log chunks and health record, by the protocol's own writers); the client's run record is written here.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scale_client.py [--sizes 64 256 1024] [--train-seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import scratch_dir

from launcher.runs import state

COMMANDS = {"status": ["status"], "status --json": ["status", "--json"], "watch --no-follow": ["watch", "--no-follow"],
            "timeline": ["timeline"], "timeline -o x.svg": ["timeline", "-o", "{dir}/x.svg"]}


def make_run(nodes: int, train_seconds: float, home: Path) -> tuple[Path, dict]:
    """A finished run of ``nodes`` simulated nodes in a work dir under ``home``, with its client record; the
    simulation's own figures."""
    work_dir = home / "wd"
    simulated = subprocess.run([sys.executable, str(Path(__file__).with_name("scale.py")), "--nodes", str(nodes),
                                "--processes", "8", "--train-seconds", str(train_seconds), "--keep", str(work_dir)],
                               check=True, stdout=subprocess.PIPE, text=True)
    os.environ["LAUNCHER_HOME"] = str(home)
    names = [f"node-{i}" for i in range(nodes)]
    return state.save(state.RunInfo(run_id="scale", backend="local", work_dir=str(work_dir), nodes=names,
                                    spec_file=str(home / "train.yaml"), spec_digest="0" * 12,
                                    created_at=time.time() - train_seconds - 5,
                                    effective_spec={"kind": "distributed", "spec": {"name": "scale"}})), \
        json.loads(simulated.stdout.splitlines()[-1])


def time_command(argv: list[str], env: dict[str, str], repeat: int) -> dict:
    """:func:`time_once` ``repeat`` times: the run with the median time to the end (a busy machine's outliers)."""
    runs = sorted((time_once(argv, env) for _ in range(repeat)), key=lambda run: run["total_s"])
    return runs[len(runs) // 2]


def time_once(argv: list[str], env: dict[str, str]) -> dict:
    """Seconds to the first byte of output and to the end, CPU seconds (user + system: on a busy machine the wall
    times mostly measure the others), peak RSS (MiB), bytes written, exit status."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    first = proc.stdout.read(1)
    first_at = time.perf_counter() - started
    rest = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"first_output_s": round(first_at, 3), "total_s": round(time.perf_counter() - started, 3),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "output_bytes": len(first) + len(rest),
            "exit": proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--train-seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command; the median is kept")
    args = parser.parse_args()
    rows = []
    for nodes in args.sizes:
        home = scratch_dir(f"scale-client-{nodes}-")
        info, simulated = make_run(nodes, args.train_seconds, home)
        print(json.dumps(simulated), flush=True)
        env = {**os.environ, "LAUNCHER_HOME": str(home), "COLUMNS": "160"}
        for label, verb in COMMANDS.items():
            argv = [sys.executable, "-m", "launcher", *[part.format(dir=home) for part in verb], str(info)]
            row = {"nodes": nodes, "command": label, **time_command(argv, env, args.repeat)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| nodes | command | first output | total | CPU | peak RSS | output |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['nodes']} | `{row['command']}` | {row['first_output_s']:.2f} s | {row['total_s']:.2f} s | "
              f"{row['cpu_s']:.2f} s | {row['peak_rss_mib']:.0f} MiB | {row['output_bytes']} B (exit {row['exit']}) |")
    print(json.dumps({"client": rows}))


if __name__ == "__main__":
    main()
