"""A chaos soak: a seeded schedule of faults injected into a recovering run of a real DDP job, and what each cost.

The run: ``--nodes`` local nodes (elastic, minNodes 2) training ``benchmarks/chaos_job.py`` (ElasticLoader, a
checkpoint every 20 steps of 0.05 s, each checkpoint with the ids its steps trained: the ledger). While it trains,
a fault comes every ``60 / --rate`` seconds on average (exponential gaps, from ``--seed``), each drawn from
``--faults``:

- ``kill-node``: SIGKILL of a worker node's process and every process under it (torchrun, its training processes);
- ``kill-main``: the same for the node of rank 0 (at least a third of the node kills, whatever is drawn);
- ``kill-rank``: SIGKILL of one training process only;
- ``hang-rank``: SIGSTOP of one training process (a hang: ``hangTimeout`` must notice it);
- ``freeze-node``: SIGSTOP of a node's process and every process under it (frozen, not dead: its peers' hang watch
  names it, its supervisor kills it once it used no CPU and wrote no status for 30 s);
- ``throttle-rank``: one training process held to a fiftieth of a core by a cgroup CPU quota for 40 s (root and cgroup
  v1's CPU controller only): the run must go on, slower, and name it a straggler (``noticed``: the ``straggler:``
  line of ``launcher watch``);
- ``kill-replacement``: a worker node killed, then its replacement killed while it joins;
- ``double``: two nodes killed within a second.

For every fault it measures from the log and the work dir: when the run noticed it (the round's first end record),
when it trained again (rank 0's first step of a later round) and the steps recomputed (the last step trained in
the round the fault ended, less the step the next round resumed at). For the run: every epoch's ledger holds each
id exactly once (duplicated and skipped ids are counted), no round had two ranks 0, the verdict (succeeded while
restarts last), no process of the run left after it, and ETTR: the seconds of the steps that were committed over
the run's wall time, beside the ETTR and incidents ``launcher status`` reports for the run (``launcher_ettr``). Prints
a line per fault, then one JSON line last.

    .venv/bin/python benchmarks/chaos.py [--nodes 4] [--duration 300] [--rate 6] [--seed 1] [--faults LIST]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common import REPO, scratch_dir

sys.path.insert(0, str(REPO / "tests"))
from clirun import run_id_from  # noqa: E402
from cluster import write_spec  # noqa: E402

LAUNCHER = [sys.executable, "-m", "launcher"]
FAULTS = ("kill-node", "kill-main", "kill-rank", "hang-rank", "freeze-node", "throttle-rank", "kill-replacement",
          "double")
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")  # cgroup v1's CPU controller, where throttle-rank makes a group
HANGS = ("hang-rank", "freeze-node")  # faults only a hang watch can notice
THROTTLE_SECONDS, THROTTLE_SHARE = 40.0, 0.02  # throttle-rank: a fiftieth of a core for this long
JOB = (Path(__file__).parent / "chaos_job.py").read_text()
STEP_S, EVERY, N, BATCH = 0.05, 20, 3000, 8
STEP = re.compile(r"^chaos: round (\d+) step (\d+)$")
RESUMES = re.compile(r"^chaos: round (\d+) rank (\d+) of (\d+) on (\S+) resumes at step (\d+) pid (\d+)$")


class Log:
    """The run's log lines in its work dir, read as they come (each chunk file from where the last read ended)."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.offsets = run_dir, {}
        self.lines: list[tuple[float, str, str]] = []  # (time, node, text)

    def read(self) -> list[tuple[float, str, str]]:
        new = []
        for chunk in sorted(self.run_dir.glob("logs/*/*.jsonl")):
            with chunk.open("rb") as handle:
                handle.seek(self.offsets.get(chunk, 0))
                data = handle.read()
            complete = data[:data.rfind(b"\n") + 1]
            self.offsets[chunk] = self.offsets.get(chunk, 0) + len(complete)
            for raw in complete.splitlines():
                record = json.loads(raw)
                new.append((record["t"], chunk.parent.name, record["m"]))
        self.lines.extend(sorted(new))
        return new


@dataclass
class Fault:
    kind: str
    at: float  # Unix time it was injected
    victims: list[str]
    round: int  # the round training when it came
    noticed_s: float | None = None
    trained_again_s: float | None = None
    recomputed_steps: int | None = None


@dataclass
class Run:
    """The run under test: its processes, its log, its rounds."""
    run_id: str
    home: Path
    run_dir: Path
    log: Log = field(init=False)

    def __post_init__(self) -> None:
        self.log = Log(self.run_dir)

    def members(self) -> tuple[int, dict[int, tuple[str, int]]]:
        """The newest round that has started training and its ranks: rank -> (node, training pid)."""
        self.log.read()
        ranks: dict[int, dict[int, tuple[str, int]]] = {}
        for _, _, text in self.log.lines:
            found = RESUMES.match(text)
            if found:
                ranks.setdefault(int(found[1]), {})[int(found[2])] = (found[4], int(found[6]))
        decided = [int(path.stem) for path in (self.run_dir / "rounds").glob("*.json")]
        latest = max(decided, default=-1)
        # its ranks once each has said so in the log (the log may lag the work dir's rounds): a fault aims at the
        # round that trains now, never at one that ended already
        return latest, ranks.get(latest, {}) if latest == max(ranks, default=-1) else {}

    def node_pid(self, node: str) -> int:
        return json.loads((self.home / "runs" / self.run_id / "processes.json").read_text())["nodes"][node]["pid"]

    def ended(self, number: int) -> float | None:
        """When the first end of round ``number`` was recorded (by the node or supervisor that saw it)."""
        times = []
        for record in (self.run_dir / "rounds" / f"{number:05d}" / "end").glob("*.json"):
            try:
                times.append(float(json.loads(record.read_text()).get("at") or 0))
            except (OSError, ValueError):
                continue
        return min((t for t in times if t > 0), default=None)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it, from /proc (parents first)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        found.append(current)
        queue.extend(children.get(current, []))
    return found


def signal_all(pids: list[int], number: int) -> int:
    """How many of ``pids`` were there to get it."""
    sent = 0
    for pid in pids:
        try:
            os.kill(pid, number)
            sent += 1
        except ProcessLookupError:
            pass
    return sent


def of_the_run(run_id: str) -> list[int]:
    """Processes whose environment names the run: what must be gone once it ended."""
    marker = f"LAUNCHER_RUN_ID={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def throttle(pid: int, name: str) -> None:
    """Hold ``pid`` to THROTTLE_SHARE of a core for THROTTLE_SECONDS, in a cgroup of its own, then let it go."""
    group = CPU_CGROUPS / name
    group.mkdir()
    period = int((group / "cpu.cfs_period_us").read_text())
    (group / "cpu.cfs_quota_us").write_text(str(int(period * THROTTLE_SHARE)))
    try:
        (group / "cgroup.procs").write_text(str(pid))
    except OSError:  # it ended meanwhile
        pass

    def release() -> None:
        time.sleep(THROTTLE_SECONDS)  # the fault's own length, not a wait on the run
        for task in (group / "cgroup.procs").read_text().split():
            try:
                (CPU_CGROUPS / "cgroup.procs").write_text(task)
            except OSError:
                pass
        group.rmdir()

    threading.Thread(target=release, daemon=False).start()


class Injector:
    def __init__(self, run: Run, rng: random.Random):
        self.run, self.rng, self.node_kills, self.main_kills = run, rng, 0, 0

    def inject(self, kind: str) -> Fault | None:
        number, ranks = self.run.members()
        if not ranks:
            return None
        main = ranks.get(0, (None, 0))[0]
        workers = sorted({node for node, _ in ranks.values() if node != main})
        if kind in ("kill-node", "kill-main"):
            self.node_kills += 1
            if kind == "kill-main" or not workers or self.main_kills * 3 < self.node_kills:
                kind, victims = "kill-main", [main]
                self.main_kills += 1
            else:
                victims = [self.rng.choice(workers)]
        elif kind == "double":
            victims = self.rng.sample(sorted({node for node, _ in ranks.values()}), 2)
        elif kind == "kill-replacement":
            victims = [self.rng.choice(workers or [main])]
        elif kind == "freeze-node":
            victims = [self.rng.choice(sorted({node for node, _ in ranks.values()}))]
        elif kind == "throttle-rank" and not os.access(CPU_CGROUPS, os.W_OK):
            return None  # not root, or no cgroup v1 CPU controller here: said once, at the start
        else:
            rank = self.rng.choice(sorted(ranks))
            victims = [f"{ranks[rank][0]} rank {rank}"]
        at = time.time()
        if kind == "throttle-rank":
            rank = int(victims[0].rsplit(" ", 1)[1])
            throttle(ranks[rank][1], f"chaos-{os.getpid()}-{at:.0f}")
        elif kind in ("kill-rank", "hang-rank"):
            pid = ranks[int(victims[0].rsplit(" ", 1)[1])][1]
            if not signal_all([pid], signal.SIGKILL if kind == "kill-rank" else signal.SIGSTOP):
                return None  # it ended meanwhile: no fault was injected
        elif kind == "freeze-node":
            signal_all(descendants(self.run.node_pid(victims[0])), signal.SIGSTOP)
        else:
            for index, node in enumerate(victims):
                if index:
                    time.sleep(self.rng.uniform(0.1, 0.9))  # the second of two faults within a second
                old = self.run.node_pid(node)
                signal_all(descendants(old), signal.SIGKILL)
                if kind == "kill-replacement":
                    self._kill_replacement(node, old)
        return Fault(kind, at, victims, number)

    def _kill_replacement(self, node: str, old: int, timeout: float = 30) -> None:
        """Kill ``node``'s replacement once its supervisor started it, while it joins the next round."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pid = self.run.node_pid(node)
            except (OSError, KeyError, ValueError):
                pid = old
            if pid != old:
                time.sleep(self.rng.uniform(0.0, 0.5))  # somewhere in its start or its join
                signal_all(descendants(pid), signal.SIGKILL)
                return
            time.sleep(0.05)  # the supervisor's record is the only sign of a replacement


class Follow:
    """``launcher watch``'s lines as they come, each with when it came: what a user of the run sees, and when."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line))

    def finish(self, timeout: float) -> str:
        self.proc.wait(timeout=timeout)
        self.thread.join(timeout=10)
        return "".join(line for _, line in self.lines)


def measure(run: Run, fault: Fault, seen: list[tuple[float, str]]) -> None:
    """The fault's costs from what the run recorded after it (a throttled rank: when ``watch`` named it a
    straggler; it ends no round)."""
    if fault.kind == "throttle-rank":
        rank = fault.victims[0].rsplit(" ", 1)[1]
        fault.noticed_s = next((t - fault.at for t, line in seen
                                if t > fault.at and f"straggler: rank {rank} " in line), None)
        return
    fault.noticed_s = None if (ended := run.ended(fault.round)) is None else max(0.0, ended - fault.at)
    last_step, resumed, again = None, None, None
    for t, _, text in run.log.lines:
        step = STEP.match(text)
        if step and int(step[1]) == fault.round:
            last_step = int(step[2])
        elif step and int(step[1]) > fault.round and t > fault.at and again is None:
            again = t
        resume = RESUMES.match(text)
        if resume and int(resume[1]) > fault.round and int(resume[2]) == 0 and resumed is None:
            resumed = int(resume[5])
    fault.trained_again_s = None if again is None else again - fault.at
    fault.recomputed_steps = None if last_step is None or resumed is None else max(0, last_step - resumed)


def ledger_check(run_dir: Path) -> dict:
    ledgers = sorted(run_dir.glob("outputs/*/ledger.json"), key=lambda path: path.stat().st_mtime)
    if not ledgers:
        return {"ledger": "missing"}
    ledger = json.loads(ledgers[-1].read_text())
    duplicated = skipped = 0
    for ids in ledger["epochs"].values():
        counts = [0] * ledger["n"]
        for index in ids:
            counts[index] += 1
        duplicated += sum(count - 1 for count in counts if count > 1)
        skipped += counts.count(0)
    return {"epochs": len(ledger["epochs"]), "duplicated": duplicated, "skipped": skipped,
            "counted_s": ledger["counted_s"]}


def split_rounds(run: Run) -> int:
    """Rounds in which two processes said they were the same rank, or ranks disagreed on the world size."""
    seen: dict[int, list[tuple[int, int]]] = {}
    for _, _, text in run.log.lines:
        found = RESUMES.match(text)
        if found:
            seen.setdefault(int(found[1]), []).append((int(found[2]), int(found[3])))
    return sum(1 for ranks in seen.values() if len({rank for rank, _ in ranks}) < len(ranks)
               or len({world for _, world in ranks}) > 1)


def soak(options: argparse.Namespace) -> dict:
    rng = random.Random(options.seed)
    if options.keep:
        directory, home = Path(tempfile.mkdtemp(prefix="chaos-")), Path(tempfile.mkdtemp(prefix="chaos-home-"))
        print(f"chaos: keeping the run in {directory} and LAUNCHER_HOME {home}", file=sys.stderr)
    else:
        directory, home = scratch_dir("chaos-"), scratch_dir("chaos-home-")
    env = {**os.environ, "LAUNCHER_HOME": str(home)}
    steps_per_s = 1 / (STEP_S + 0.01)
    epoch_steps = N / (options.nodes * BATCH)
    epochs = max(2, round(options.duration * steps_per_s / epoch_steps))
    cluster = {"elastic": {"minNodes": 2, "maxNodes": options.nodes, "maxRestarts": options.max_restarts},
               "recovery": {"retryOn": ["lost", "failure"]}, "hangTimeout": f"{options.hang_timeout}s"}
    spec = write_spec(directory, JOB, nodes=options.nodes, extra_cluster=cluster,
                      env=[{"name": "CHAOS_EPOCHS", "value": str(epochs)},
                           # the job's DistributedDataParallel imports it: warm, a rank's start is 2 s shorter here
                           {"name": "LAUNCHER_WARM_IMPORTS", "value": "torch._dynamo"}])
    begun = time.time()
    started = subprocess.run([*LAUNCHER, "run", "-f", str(spec), "--detach"], cwd=directory, env=env,
                             capture_output=True, text=True)
    if started.returncode:
        raise SystemExit(f"chaos: the run did not start:\n{started.stdout}{started.stderr}")
    run = Run(run_id_from(started.stdout), home, directory / "wd" / run_id_from(started.stdout))
    watch = subprocess.Popen([*LAUNCHER, "watch", run.run_id], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    follow = Follow(watch)
    injector, faults = Injector(run, rng), []
    kinds = options.faults.split(",")
    next_at, kind = time.time() + options.warmup, None
    while watch.poll() is None and time.time() - begun < options.duration and len(faults) < options.max_faults:
        if time.time() >= next_at:
            kind = kind or rng.choice(kinds)  # the drawn kind waits for a round to aim at
            fault = injector.inject(kind)
            if fault:  # else no round trains now, or its target ended: the fault comes at the next look
                faults.append(fault)
                print(f"fault {len(faults)}: {fault.kind} of {', '.join(fault.victims)} in round {fault.round}",
                      file=sys.stderr)
                next_at, kind = time.time() + rng.expovariate(options.rate / 60), None
        time.sleep(0.2)  # a fault schedule, not a wait on the run
    output = follow.finish(timeout=options.duration * 4 + 600)
    wall = time.time() - begun
    run.log.read()
    for fault in faults:
        measure(run, fault, follow.lines)
    time.sleep(2)  # the run ended: what is left of it after its supervisor's own grace is left behind
    left = {pid: _command(pid) for pid in of_the_run(run.run_id)}
    signal_all(list(left), signal.SIGKILL)
    ledger = ledger_check(run.run_dir)
    status = subprocess.run([*LAUNCHER, "status", run.run_id, "--json"], env=env, capture_output=True, text=True)
    costs = (json.loads(status.stdout).get("costs") if status.stdout.strip() else None) or {}
    noticed = [f.noticed_s for f in faults if f.noticed_s is not None]
    again = [f.trained_again_s for f in faults if f.trained_again_s is not None]
    result = {
        "benchmark": "chaos", "backend": "local", "nodes": options.nodes, "seed": options.seed,
        "rate_per_min": options.rate, "faults": len(faults), "exit": watch.returncode, "wall_s": round(wall, 1),
        "ettr": round(ledger.get("counted_s", 0) / wall, 4), "launcher_ettr": costs.get("ettr"),
        "launcher_incidents": len(costs.get("incidents") or []), "launcher_cost_s": costs.get("cost_s"), **ledger, "split_rounds": split_rounds(run),
        "left_running": len(left), "left": sorted(left.values()), "unnoticed": sum(1 for f in faults if f.noticed_s is None),
        "never_trained_again": sum(1 for f in faults if f.trained_again_s is None and f.kind != "throttle-rank"),
        "noticed_s_median": round(statistics.median(noticed), 2) if noticed else None,
        "noticed_s_max": round(max(noticed), 2) if noticed else None,
        "trained_again_s_median": round(statistics.median(again), 2) if again else None,
        "trained_again_s_p90": round(statistics.quantiles(again, n=10)[-1], 2) if len(again) >= 2 else None,
        "recomputed_steps": sum(f.recomputed_steps or 0 for f in faults),
        "hang_noticed_s_p99": _p99([f.noticed_s for f in faults if f.kind in HANGS and f.noticed_s is not None]),
        "by_kind": {kind: {"faults": len(group), "noticed_s_median": _median([f.noticed_s for f in group]),
                           "trained_again_s_median": _median([f.trained_again_s for f in group])}
                    for kind in sorted({f.kind for f in faults})
                    for group in [[f for f in faults if f.kind == kind]]},
        "fault_list": [asdict(fault) for fault in faults],
    }
    if watch.returncode:
        result["closing"] = output[output.rfind("\nrun "):].strip().splitlines()[:12]  # the summary: why it failed
    return result


def _median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return round(statistics.median(known), 2) if known else None


def _p99(values: list[float]) -> float | None:
    return round(statistics.quantiles(values, n=100)[-1], 2) if len(values) >= 2 else (values[0] if values else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--duration", type=float, default=300, help="seconds of faults (the run trains about this long)")
    parser.add_argument("--rate", type=float, default=6, help="faults a minute, on average")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of: {', '.join(FAULTS)}")
    parser.add_argument("--max-faults", type=int, default=10_000)
    parser.add_argument("--max-restarts", type=int, default=1000)
    parser.add_argument("--hang-timeout", type=int, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the run's directory and LAUNCHER_HOME")
    parser.add_argument("--warmup", type=float, default=8, help="seconds before the first fault")
    options = parser.parse_args()
    if "throttle-rank" in options.faults.split(",") and not os.access(CPU_CGROUPS, os.W_OK):
        print(f"chaos: {CPU_CGROUPS} cannot be written here (root and cgroup v1's CPU controller are needed): no "
              "throttle-rank faults", file=sys.stderr)
    unknown = set(options.faults.split(",")) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}; choose from {', '.join(FAULTS)}")
    result = soak(options)
    for index, fault in enumerate(result["fault_list"], 1):
        print(f"{index:4d} {fault['kind']:<16} {', '.join(fault['victims']):<28} round {fault['round']:<4} noticed "
              f"{fault['noticed_s'] if fault['noticed_s'] is None else round(fault['noticed_s'], 2)} s, trained "
              f"again {fault['trained_again_s'] if fault['trained_again_s'] is None else round(fault['trained_again_s'], 2)}"
              f" s, {fault['recomputed_steps']} steps recomputed")
    print(json.dumps({key: value for key, value in result.items() if key != "fault_list"}))


if __name__ == "__main__":
    main()
