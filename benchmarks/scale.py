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
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from launcher.protocol.control import ControlWatch  # noqa: E402
from launcher.protocol.events import DECIDED, REGISTERED, TORCHRUN, EventLog  # noqa: E402
from launcher.protocol.health import SAMPLE_SECONDS, HealthRecord  # noqa: E402
from launcher.protocol.logship import LogShipper  # noqa: E402
from launcher.protocol.rendezvous import NODES_PREFIX, PollPolicy, Registration, await_decision  # noqa: E402
from launcher.protocol.status import StatusRecord  # noqa: E402
from launcher.protocol.store import WorkDir  # noqa: E402

HEARTBEAT_SECONDS = 10.0  # the node's (launcher.node.main imports torch-side modules: not loaded here)
PHASES = ("rendezvous", "training", "ending")
START_SPREAD_SECONDS = 1.0  # nodes start at random moments within this


class CountingStore(WorkDir):
    """One node's store client; counts its operations by the node's current phase and the operation's kind."""

    phase = "rendezvous"
    registered_at: float | None = None

    def __init__(self, url: str):
        super().__init__(url)
        self.counts: Counter[tuple[str, str]] = Counter()

    def _call_heard(self, what, action, key=None):
        self.counts[(self.phase, what.split(" ", 1)[0])] += 1
        return super()._call_heard(what, action, key)

    def create(self, key: str, data: bytes) -> bool:
        created = super().create(key, data)
        if key.startswith(NODES_PREFIX + "/"):
            self.registered_at = time.time()
        return created


def simulate_node(url: str, name: str, names: list[str], index: int, train_seconds: float) -> dict:
    """One node's life as launcher/node/main.py lives it, with training replaced by ``train_seconds`` of lines."""
    store = CountingStore(url)
    shipper = LogShipper(store, name).start()
    events = EventLog(store, name, 0).start()
    status = StatusRecord(store, name, "scale")
    health = HealthRecord(store, name)
    control = ControlWatch(store, name)
    phase_started = {"rendezvous": time.time()}
    status.update(state="registering")
    status.update(state="waiting", address="127.0.0.1", processes=1)
    shipper.add("node", f"registering as 127.0.0.1:{20000 + index}; waiting for {len(names)} nodes")
    events.record(REGISTERED)
    policy = PollPolicy.for_store(store)
    policy.rng = random.Random(index)
    decision = await_decision(store, Registration(name, "127.0.0.1", 20000 + index), names, timeout=600,
                              policy=policy)
    decided_at = time.time()
    store.phase, phase_started["training"] = "training", decided_at
    rank = decision.ranks[name]
    events.record(DECIDED, rank=rank)
    status.update(rank=rank, main=decision.main)
    events.record(TORCHRUN, round=0)
    status.update(state="running")
    next_heartbeat = next_line = time.monotonic()
    next_heartbeat += HEARTBEAT_SECONDS
    next_sample = time.monotonic() + SAMPLE_SECONDS
    ends = time.monotonic() + train_seconds
    step = 0
    while (now := time.monotonic()) < ends:
        if control.check() is not None:
            raise RuntimeError(f"{name}: unexpected stop request")
        if now >= next_line:
            step += 1
            shipper.add_many([("stdout", f"step {step} loss {1 / step:.4f}", rank)])
            next_line = now + 1.0
        if now >= next_heartbeat:
            status.heartbeat()
            next_heartbeat = now + HEARTBEAT_SECONDS
        if now >= next_sample:
            sample = {"at": time.time(), "cpu_percent": 95.0, "rss_bytes": 2 << 30,
                      "ranks": {str(rank): {"local": 0, "steps": step, "steps_per_s": 1.0}}}
            status.note(health=sample)
            health.add(sample)
            next_sample = now + SAMPLE_SECONDS
        time.sleep(min(0.5, max(0.0, ends - now)))  # the node's supervision loop wakes every 0.5 s
    store.phase, phase_started["ending"] = "ending", time.time()
    events.training_ended(0, 0, {0: time.time()})
    status.update(state="succeeded", exit_code=0)
    health.flush()
    events.close()
    shipper.close()
    ended_at = time.time()
    seconds = {"rendezvous": decided_at - phase_started["rendezvous"],
               "training": phase_started["ending"] - decided_at, "ending": ended_at - phase_started["ending"]}
    return {"registered_at": store.registered_at, "decided_at": decided_at, "seconds": seconds,
            "counts": [[phase, op, n] for (phase, op), n in store.counts.items()]}


def worker(args: argparse.Namespace) -> None:
    """Runs this process's share of the nodes, each in a thread, once the parent says go (a line on stdin)."""
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("ready", flush=True)
    starts_at = float(sys.stdin.readline())
    names = [f"node-{i}" for i in range(args.nodes)]
    rng = random.Random(args.worker)
    results: dict[int, dict] = {}
    errors: list[str] = []

    def node(i: int) -> None:
        time.sleep(max(0.0, starts_at + rng.uniform(0, START_SPREAD_SECONDS) - time.time()))  # its start
        try:
            results[i] = simulate_node(args.url, names[i], names, i, args.train_seconds)
        except Exception as exc:  # reported to the parent, which fails the benchmark
            errors.append(f"{names[i]}: {exc!r}")

    mine = range(args.worker, args.nodes, args.processes)
    threads = [threading.Thread(target=node, args=(i,)) for i in mine]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"baseline_kib": baseline, "nodes": results, "errors": errors}), flush=True)


def run_workers(url: str, args: argparse.Namespace, env: dict[str, str]) -> tuple[list[dict], list[float]]:
    """Start the worker processes, release them together, collect their reports and peak RSS (MiB)."""
    argv = [sys.executable, __file__, "--nodes", str(args.nodes), "--processes", str(args.processes),
            "--train-seconds", str(args.train_seconds), "--url", url]
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
    last_registration = max(node["registered_at"] for node in nodes)
    lags = sorted(node["decided_at"] - last_registration for node in nodes)
    rates: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        seconds = sum(node["seconds"][phase] for node in nodes)
        by_op: Counter[str] = Counter()
        for node in nodes:
            for counted_phase, op, n in node["counts"]:
                if counted_phase == phase:
                    by_op[op] += n
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
            "rendezvous_s_median": round(statistics.median(node["seconds"]["rendezvous"] for node in nodes), 3),
            "requests_per_node_per_s": {**rates, "all": round(total_requests / total_seconds, 3)},
            "requests_per_node": round(total_requests / len(nodes), 1),
            "process_peak_rss_mib": {"max": round(max(peaks), 1), "nodes_per_process": max(per_process)},
            "memory_per_node_mib": round(max(node_kib) / 1024, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--store", choices=("local", "s3"), default="local")
    parser.add_argument("--processes", type=int, default=16, help="processes the nodes are spread over")
    parser.add_argument("--train-seconds", type=float, default=30.0, help="the training stand-in's length")
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
