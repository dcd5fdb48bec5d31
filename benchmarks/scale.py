"""A run of N simulated nodes on a local directory or loopback S3 (moto_server): the protocol's cost at scale.

Every node runs the node's real protocol code (launcher/protocol/): its status record (updates and heartbeats),
its event log, its log shipper, its health record, the registration and the decision (``await_decision``) and
the control checks, each node with its own store client. Training is a timed stand-in that writes a line a second.

N nodes do not fit as N processes here (2 cores, 24 GiB: an interpreter with s3fs loaded is ~100 MiB, 1,024 of
them 100 GiB), so ``--processes`` processes (default 16) each run N/processes nodes in threads. The processes
share the machine's cores with everything else; the figures are those of nodes on an overloaded machine.

Measured: the decision's time after the last registration (each node's), requests per node per second by phase
(rendezvous: start to decision; training; ending: the final writes) and in all, by operation; on S3 also the
HTTP requests the store saw, by billing class (through a recording proxy); each process's peak memory and the
memory per node it implies. The figures are printed as one JSON line, last.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scale.py --nodes 256 --store s3 [--train-seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from launcher.protocol.control import ControlWatch  # noqa: E402
from launcher.protocol.events import DECIDED, REGISTERED, TORCHRUN, EventLog  # noqa: E402
from launcher.protocol.health import SAMPLE_SECONDS, HealthRecord  # noqa: E402
from launcher.protocol.logship import LogShipper  # noqa: E402
from launcher.protocol.recovery import JOIN, Policy, RoundEnd  # noqa: E402
from launcher.protocol.rendezvous import (NODES_PREFIX, Decision, PollPolicy, Registration,  # noqa: E402
                                          await_decision)
from launcher.protocol.rounds import Rounds, Timing  # noqa: E402
from launcher.protocol.status import StatusRecord  # noqa: E402
from launcher.protocol.store import WorkDir  # noqa: E402
from launcher.runs.supervision import end_round_for_lost_node  # noqa: E402

HEARTBEAT_SECONDS = 10.0  # the node's (launcher.node.main imports torch-side modules: not loaded here)
PHASES = ("rendezvous", "training", "change", "ending")
START_SPREAD_SECONDS = 1.0  # nodes start at random moments within this
GROWS = "node"  # the group the nodes of --change scale are added to: node-N, node-N+1, ...
NO_LIMIT = 600.0  # round 0 of --change trains until the change ends it
SCALE_NOW = "benchmark/scale-now"  # --change scale: the moment `launcher scale` starts the new nodes


class CountingStore(WorkDir):
    """One node's store client; counts its operations, and its seconds, by the node's current phase."""

    registered_at: float | None = None

    def __init__(self, url: str):
        super().__init__(url)
        self.counts: Counter[tuple[str, str]] = Counter()
        self.seconds: Counter[str] = Counter()
        self.phase, self._since = "rendezvous", time.time()

    def enter(self, phase: str) -> float:
        """The node goes on to ``phase`` now (returned)."""
        now = time.time()
        self.seconds[self.phase] += now - self._since
        self.phase, self._since = phase, now
        return now

    def _call_heard(self, what, action, key=None):
        self.counts[(self.phase, what.split(" ", 1)[0])] += 1
        return super()._call_heard(what, action, key)

    def create(self, key: str, data: bytes) -> bool:
        created = super().create(key, data)
        if self.registered_at is None and (key.startswith(NODES_PREFIX + "/") or "/nodes/" in key):
            self.registered_at = time.time()  # its first registration: the run's, or its first round's
        return created


@dataclass
class Node:
    """One simulated node's protocol parts, each as launcher/node/main.py has them."""

    name: str
    store: CountingStore
    shipper: LogShipper
    events: EventLog
    status: StatusRecord
    health: HealthRecord
    control: ControlWatch

    @classmethod
    def start(cls, url: str, name: str) -> "Node":
        store = CountingStore(url)
        return cls(name, store, LogShipper(store, name).start(), EventLog(store, name, 0).start(),
                   StatusRecord(store, name, "scale"), HealthRecord(store, name), ControlWatch(store, name))

    def begin(self, decision: Decision, number: int = 0) -> int:
        """Holding ``decision`` (of round ``number``): what the node writes before torchrun starts; its rank."""
        self.store.enter("training")
        rank = decision.ranks[self.name]
        self.events.record(DECIDED, rank=rank, round=number)
        self.status.update(rank=rank, main=decision.main, round=number)
        self.events.record(TORCHRUN, round=number)
        self.status.update(state="running")
        return rank

    def train(self, rank: int, seconds: float, round_over: Callable[[], bool] | None = None,
              check_every: float = 0.5) -> bool:
        """The training stand-in for ``seconds``: a line a second, heartbeats, health samples, control checks and,
        in a round, the check of its end every ``check_every`` s; whether the round ended before the time was up."""
        next_heartbeat = next_line = next_check = time.monotonic()
        next_heartbeat += HEARTBEAT_SECONDS
        next_sample = time.monotonic() + SAMPLE_SECONDS
        ends = time.monotonic() + seconds
        step = 0
        while (now := time.monotonic()) < ends:
            if self.control.check() is not None:
                raise RuntimeError(f"{self.name}: unexpected stop request")
            if round_over is not None and now >= next_check:
                next_check = now + check_every
                if round_over():
                    return True
            if now >= next_line:
                step += 1
                self.shipper.add_many([("stdout", f"step {step} loss {1 / step:.4f}", rank)])
                next_line = now + 1.0
            if now >= next_heartbeat:
                self.status.heartbeat()
                next_heartbeat = now + HEARTBEAT_SECONDS
            if now >= next_sample:
                sample = {"at": time.time(), "cpu_percent": 95.0, "rss_bytes": 2 << 30,
                          "ranks": {str(rank): {"local": 0, "steps": step, "steps_per_s": 1.0}}}
                self.status.note(health=sample)
                self.health.add(sample)
                next_sample = now + SAMPLE_SECONDS
            time.sleep(min(0.5, max(0.0, ends - now)))  # the node's supervision loop wakes every 0.5 s
        return False

    def end(self) -> None:
        """Training succeeded: the final writes."""
        self.store.enter("ending")
        self.events.training_ended(0, 0, {0: time.time()})
        self.status.update(state="succeeded", exit_code=0)
        self.health.flush()
        self.events.close()
        self.shipper.close()
        self.store.enter("done")

    def report(self, **more) -> dict:
        return {"registered_at": self.store.registered_at, "seconds": dict(self.store.seconds),
                "counts": [[phase, op, n] for (phase, op), n in self.store.counts.items()], **more}


def simulate_node(url: str, name: str, names: list[str], index: int, train_seconds: float) -> dict:
    """One node's life as launcher/node/main.py lives it, with training replaced by ``train_seconds`` of lines."""
    node = Node.start(url, name)
    node.status.update(state="registering")
    node.status.update(state="waiting", address="127.0.0.1", processes=1)
    node.shipper.add("node", f"registering as 127.0.0.1:{20000 + index}; waiting for {len(names)} nodes")
    node.events.record(REGISTERED)
    policy = PollPolicy.for_store(node.store)
    policy.rng = random.Random(index)
    decision = await_decision(node.store, Registration(name, "127.0.0.1", 20000 + index), names, timeout=600,
                              policy=policy)
    decided_at = time.time()
    node.train(node.begin(decision), train_seconds)
    node.end()
    return node.report(held=[[0, decided_at]])


def simulate_member(url: str, name: str, names: list[str], index: int, train_seconds: float, change: str,
                    size: int) -> dict:
    """One node of a recovering run, in membership rounds as node/recovery/loop.py runs them, through a change
    ``train_seconds`` into round 0: with ``death``, the last node dies (its supervisor records it LOST) and the
    others form round 1 without it; with ``scale``, the nodes named after ``names`` start and join (each ends the
    latest round with a JOIN, as a node that `launcher scale` starts does). Each node trains ``train_seconds`` in
    the round after the change, then succeeds. ``size``: the run's minNodes."""
    joins, more = index >= len(names), {}
    number = 0
    if joins:  # `launcher scale` starts it now: the benchmark's own wait for that moment, not counted
        marker = WorkDir(url)
        while marker.get(SCALE_NOW) is None:
            time.sleep(0.1)
    node = Node.start(url, name)
    # minNodes: the members the change keeps (fewer members only by the settle time, as an elastic run's would)
    rounds = Rounds(node.store, names, Policy(max_restarts=8, min_nodes=size), Timing.for_store(node.store),
                    grows=GROWS)
    if joins:
        latest = rounds.latest()
        more["changed_at"] = node.store.enter("change")
        rounds.end(latest.number, RoundEnd(name, JOIN, "a new node joins the run", None, time.time()))
        number = latest.number + 1
    me = Registration(name, "127.0.0.1", 20000 + index)
    node.status.update(state="registering")
    held: dict[int, float] = {}
    while True:
        node.status.update(state="waiting", address="127.0.0.1", processes=1, round=number)
        node.events.record(REGISTERED, round=number)
        current = rounds.join(number, me, timeout=600, control=node.control)
        number = current.number
        held[number] = time.time()
        rank = node.begin(current.decision, number)

        def round_over() -> bool:
            return rounds.ended(number, current.members)

        triggers = number == 0 and index == (len(names) - 1 if change == "death" else 0)
        if triggers and not node.train(rank, train_seconds, round_over, rounds.timing.end_check):
            if change == "death":  # the node is gone; its supervisor ends the round for it
                more["changed_at"] = time.time()
                end_round_for_lost_node(node.store, name, {"round": number}, -9, "killed by the benchmark", "", None)
                node.events.close()
                node.shipper.close()
                node.store.enter("done")
                return node.report(held=sorted(held.items()), died=True, **more)
            WorkDir(url).put(SCALE_NOW, b"{}")
        seconds = NO_LIMIT if number == 0 and not joins else train_seconds
        if not node.train(rank, seconds, round_over, rounds.timing.end_check):
            break
        node.store.enter("change")
        number += 1
    node.end()
    return node.report(held=sorted(held.items()), members=current.members, **more)


def worker(args: argparse.Namespace) -> None:
    """Runs this process's share of the nodes, each in a thread, once the parent says go (a line on stdin)."""
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("ready", flush=True)
    starts_at = float(sys.stdin.readline())
    names = [f"{GROWS}-{i}" for i in range(args.nodes)]
    rng = random.Random(args.worker)
    results: dict[int, dict] = {}
    errors: list[str] = []

    def node(i: int) -> None:
        time.sleep(max(0.0, starts_at + rng.uniform(0, START_SPREAD_SECONDS) - time.time()))  # its start
        try:
            if args.change:
                size = args.nodes - 1 if args.change == "death" else args.nodes
                results[i] = simulate_member(args.url, f"{GROWS}-{i}", names, i, args.train_seconds, args.change,
                                             size)
            else:
                results[i] = simulate_node(args.url, names[i], names, i, args.train_seconds)
        except Exception as exc:  # reported to the parent, which fails the benchmark
            errors.append(f"{names[i]}: {exc!r}")

    mine = range(args.worker, args.nodes + (args.join if args.change == "scale" else 0), args.processes)
    threads = [threading.Thread(target=node, args=(i,)) for i in mine]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"baseline_kib": baseline, "nodes": results, "errors": errors}), flush=True)


def run_workers(url: str, args: argparse.Namespace, env: dict[str, str]) -> tuple[list[dict], list[float]]:
    """Start the worker processes, release them together, collect their reports and peak RSS (MiB)."""
    argv = [sys.executable, __file__, "--nodes", str(args.nodes), "--processes", str(args.processes),
            "--train-seconds", str(args.train_seconds), "--url", url, "--join", str(args.join),
            *(["--change", args.change] if args.change else [])]
    procs = [subprocess.Popen([*argv, "--worker", str(k)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                              text=True) for k in range(args.processes)]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("a worker process did not start")
        starts_at = str(time.time() + 0.2)
        for proc in procs:
            proc.stdin.write(starts_at + "\n")
            proc.stdin.flush()
        reports, peaks = [], []
        for proc in procs:
            reports.append(json.loads(proc.stdout.read()))
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            peaks.append(usage.ru_maxrss / 1024)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
    return reports, peaks


def http_classes(requests: list[tuple[str, str, str]]) -> Counter[str]:
    """The store's requests by billing class: LIST (a GET of the bucket with list-type), GET, PUT, HEAD, ..."""
    classes: Counter[str] = Counter()
    for method, path, _range in requests:
        classes["LIST" if method == "GET" and "list-type=" in path else method] += 1
    return classes


def summarise(args: argparse.Namespace, reports: list[dict], peaks: list[float], wall: float) -> dict:
    errors = [error for report in reports for error in report["errors"]]
    if errors:
        raise SystemExit(f"{len(errors)} nodes failed, first: {errors[0]}")
    nodes = [node for report in reports for node in report["nodes"].values()]
    first = [node for node in nodes if node["held"][0][0] == 0]  # the run's first nodes (not those that join)
    last_registration = max(node["registered_at"] for node in first)
    lags = sorted(node["held"][0][1] - last_registration for node in first)
    rates: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        seconds = sum(node["seconds"].get(phase, 0.0) for node in nodes)
        by_op: Counter[str] = Counter()
        for node in nodes:
            for counted_phase, op, n in node["counts"]:
                if counted_phase == phase:
                    by_op[op] += n
        if seconds:
            rates[phase] = {op: round(n / seconds, 3) for op, n in sorted(by_op.items())}
            rates[phase]["all"] = round(sum(by_op.values()) / seconds, 3)
    total_requests = sum(n for node in nodes for _phase, _op, n in node["counts"])
    total_seconds = sum(sum(node["seconds"].values()) for node in nodes)
    per_process = [len(report["nodes"]) for report in reports]
    node_kib = [(peak * 1024 - report["baseline_kib"]) / max(1, len(report["nodes"]))
                for peak, report in zip(peaks, reports)]
    return {"store": args.store, "nodes": args.nodes, "processes": args.processes, "train_seconds": args.train_seconds,
            "wall_s": round(wall, 1),
            "decided_after_last_registration_s": {"median": round(statistics.median(lags), 3),
                                                  "max": round(lags[-1], 3)},
            "rendezvous_s_median": round(statistics.median(node["seconds"]["rendezvous"] for node in first), 3),
            "requests_per_node_per_s": {**rates, "all": round(total_requests / total_seconds, 3)},
            "requests_per_node": round(total_requests / len(nodes), 1),
            "process_peak_rss_mib": {"max": round(max(peaks), 1), "nodes_per_process": max(per_process)},
            "memory_per_node_mib": round(max(node_kib) / 1024, 2),
            **({"change": change_figures(args.change, nodes)} if args.change else {})}


def change_figures(change: str, nodes: list[dict]) -> dict:
    """The membership change: from the death (its LOST record) or the first join (its JOIN record) to every node
    that trains on holding the round it trains to the end in; how many rounds that took; that round's members."""
    changed_at = min(node["changed_at"] for node in nodes if "changed_at" in node)
    on = [node for node in nodes if not node.get("died")]
    final = max(node["held"][-1][0] for node in on)
    members = next(node["members"] for node in on if node["held"][-1][0] == final)
    after = sorted(node["held"][-1][1] - changed_at for node in on)
    return {"kind": change, "final_round": final, "members": len(members),
            "every_node_in_the_final_round_s": {"median": round(statistics.median(after), 3),
                                                "max": round(after[-1], 3)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--store", choices=("local", "s3"), default="local")
    parser.add_argument("--processes", type=int, default=16, help="processes the nodes are spread over")
    parser.add_argument("--train-seconds", type=float, default=30.0, help="the training stand-in's length")
    parser.add_argument("--change", choices=("death", "scale"),
                        help="a recovering run (membership rounds) and a change after --train-seconds of round 0: "
                             "the last node dies, or --join nodes join")
    parser.add_argument("--join", type=int, default=4, help="--change scale: the nodes that join")
    parser.add_argument("--keep", metavar="DIR", help="local store: make the work dir DIR/scale and keep it")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.processes = max(1, min(args.processes, args.nodes))
    if args.worker is not None:
        worker(args)
        return
    from common import scratch_dir

    moto = proxy = None
    env = dict(os.environ)
    if args.store == "local":
        url = f"{args.keep}/scale" if args.keep else f"{scratch_dir('scale-')}/scale"
    else:
        from s3server import FaultyProxy, MotoServer

        moto = MotoServer()
        moto.make_bucket("scale")
        proxy = FaultyProxy(moto.port, failure_rate=0.0)  # forwards everything, recording each request
        env.update(moto.env(proxy.endpoint))
        url = "s3://scale/run"
    try:
        started = time.time()
        reports, peaks = run_workers(url, args, env)
        figures = summarise(args, reports, peaks, time.time() - started)
        if proxy is not None:
            figures["http_requests"] = dict(http_classes(proxy.requests))
    finally:
        if proxy:
            proxy.stop()
        if moto:
            moto.stop()
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
