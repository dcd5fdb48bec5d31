"""How long a recovering run stops training when a node dies, on the local or docker backend, against a
whole-run restart.

A 3-node elastic run (minNodes 2, maxRestarts 3) of a small DDP-style job (gloo, one all-reduce and a
checkpoint per 0.3 s epoch) is started with `launcher run --detach`; at epoch 8 the node process of
a worker (then, separately, of the main) is killed with SIGKILL (docker: `docker kill` of its container;
the nodes run the test base image of tests/dockerenv.py with this checkout and the job mounted, as
tests/test_recovery_docker.py does). From the run's log records in the work dir (each line carries
the time it was written):

- back: from the kill to the first line of a survivor's training in the next round (its checkpoint loaded);
- joined: from the kill to the first line of the replacement's training.

For comparison, "restart": a new run of the same spec, from `launcher run` to its first epoch line,
what a retry of the whole run costs before it trains again (not counting the epochs it repeats).

The kill comes 2.4 s into round 0's training: `--spare-after 10` (LAUNCHER_SPARE_AFTER) measures a round
killed before its node started the next round's spare torchrun, whose survivors start torchrun cold.

    .venv/bin/python benchmarks/recovery.py [--repeats 3] [--backend docker] [--timeline] [--spare-after S]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, median, scratch_dir

sys.path.insert(0, str(REPO / "tests"))
from clirun import run_id_from  # noqa: E402
from cluster import write_spec  # noqa: E402
from test_recovery import ELASTIC, JOB  # noqa: E402
from test_recovery_docker import docker_spec  # noqa: E402

LAUNCHER = [sys.executable, "-m", "launcher"]


def log_lines(run_dir: Path) -> list[tuple[float, str, str]]:
    """(time, node, text) of every line the run's nodes shipped, in time order."""
    lines = []
    for chunk in run_dir.glob("logs/*/*.jsonl"):
        for raw in chunk.read_text().splitlines():
            record = json.loads(raw)
            lines.append((record["t"], chunk.parent.name, record["m"]))
    return sorted(lines)


def wait_for_line(run_dir: Path, text: str, timeout: float = 180) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [t for t, _, line in log_lines(run_dir) if text in line]
        if found:
            return found[0]
        time.sleep(0.1)  # the benchmark polls the work dir like `launcher watch`
    raise TimeoutError(text)


class Setup:
    """The backend's spec of the benchmark's run, and how it kills a node."""

    def __init__(self, backend: str, home: Path, show_timeline: bool = False, spare_after: float | None = None):
        self.backend, self.home, self.show_timeline = backend, home, show_timeline
        self.options = [] if spare_after is None else ["--env", f"LAUNCHER_SPARE_AFTER={spare_after:g}"]
        self.image = None
        if backend == "docker":
            from dockerenv import ensure_base_image

            self.image = ensure_base_image()

    def spec(self, directory: Path) -> Path:
        if self.image:
            return docker_spec(directory, self.image, 3, ELASTIC)
        return write_spec(directory, JOB, nodes=3, extra_cluster=ELASTIC)

    def kill(self, run_id: str, node: str) -> None:
        if self.image:
            subprocess.run(["docker", "kill", f"{run_id}-{node}"], capture_output=True, check=True)
            return
        pid = json.loads((self.home / "runs" / run_id / "processes.json").read_text())["nodes"][node]["pid"]
        os.kill(pid, signal.SIGKILL)


def one(victim: str, setup: Setup) -> tuple[float, float]:
    directory = scratch_dir("bench-recovery-")
    env = {**os.environ, "LAUNCHER_HOME": str(setup.home)}
    started = subprocess.run([*LAUNCHER, "run", "-f", str(setup.spec(directory)), "--detach", *setup.options],
                             cwd=directory, env=env, capture_output=True, text=True, check=True)
    run_id = run_id_from(started.stdout)
    run_dir = directory / "wd" / run_id
    wait_for_line(run_dir, "rank 0: epoch 8")
    killed = time.time()
    setup.kill(run_id, victim)
    subprocess.run([*LAUNCHER, "watch", run_id], env=env, capture_output=True, timeout=300)
    if setup.show_timeline:  # where the recovery's seconds went, phase by phase
        shown = subprocess.run([*LAUNCHER, "timeline", run_id], env=env, capture_output=True, text=True)
        print(f"killed {victim} at {killed - json.loads((run_dir / 'run.json').read_text())['created_at']:.2f} s "
              f"from submit\n{shown.stdout}", file=sys.stderr)
    after = [(t, node, line) for t, node, line in log_lines(run_dir) if t > killed]
    back = next(t for t, node, line in after if node != victim and "resuming after epoch" in line)
    joined = next(t for t, node, line in after if node == victim and "resuming after epoch" in line)
    return back - killed, joined - killed


def whole_restart(setup: Setup) -> float:
    directory = scratch_dir("bench-restart-")
    env = {**os.environ, "LAUNCHER_HOME": str(setup.home)}
    spec = setup.spec(directory)
    begun = time.time()
    started = subprocess.run([*LAUNCHER, "run", "-f", str(spec), "--detach"], cwd=directory, env=env,
                             capture_output=True, text=True, check=True)
    run_id = run_id_from(started.stdout)
    first = wait_for_line(directory / "wd" / run_id, "rank 0: epoch 1")
    subprocess.run([*LAUNCHER, "cancel", run_id, "--grace", "5"], env=env, capture_output=True)
    return first - begun


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", choices=("local", "docker"), default="local")
    parser.add_argument("--timeline", action="store_true", help="print each recovered run's timeline (stderr)")
    parser.add_argument("--spare-after", type=float, help="LAUNCHER_SPARE_AFTER of the nodes (default: theirs, 0 s)")
    options = parser.parse_args()
    repeats = options.repeats
    setup = Setup(options.backend, scratch_dir("bench-recovery-home-"), options.timeline, options.spare_after)
    results = {victim: [one(victim, setup) for _ in range(repeats)] for victim in ("t-worker-1", "t-main")}
    restarts = [whole_restart(setup) for _ in range(repeats)]
    spare = "default" if options.spare_after is None else f"{options.spare_after:g} s"
    print(f"{options.backend} backend, 3 nodes (elastic, min 2), spare after: {spare}, {repeats} runs each, median "
          "seconds after SIGKILL:")
    for victim, timings in results.items():
        print(f"  {victim:<11} training again on the survivors: {median([b for b, _ in timings]):5.2f} s "
              f"(runs: {', '.join(f'{b:.2f}' for b, _ in timings)}); replacement training: "
              f"{median([j for _, j in timings]):5.2f} s")
    print(f"  whole-run restart, from `launcher run` to its first epoch: {median(restarts):5.2f} s "
          f"(runs: {', '.join(f'{r:.2f}' for r in restarts)})")


if __name__ == "__main__":
    main()
