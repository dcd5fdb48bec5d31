"""Rendezvous latency and cost: N simulated nodes on a local directory and on loopback S3 (moto_server).

For each trial every node is a thread with its own store client; nodes start at random moments
within one second. Measured per node: the time from the LAST node's registration until this
node holds the decision, and the store requests it made.

    .venv/bin/python benchmarks/rendezvous.py [--sizes 2 8 32 64 128] [--trials 5]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

from common import scratch_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from launcher.protocol.rendezvous import NODES_PREFIX, PollPolicy, Registration, await_decision  # noqa: E402
from launcher.protocol.store import WorkDir  # noqa: E402


class TimedStore(WorkDir):
    """Records when this node's registration was written."""

    registered_at: float | None = None

    def create(self, key: str, data: bytes) -> bool:
        created = super().create(key, data)
        if key.startswith(NODES_PREFIX + "/"):
            self.registered_at = time.monotonic()
        return created


def trial(url: str, n: int, seed: int) -> tuple[list[float], list[int]]:
    rng = random.Random(seed)
    names = [f"node-{i}" for i in range(n)]
    # One store client shared by the simulated nodes (each keeps its own request count): 64 separate
    # s3fs clients in one process cost a gigabyte and saturate its single I/O thread, which real
    # nodes, each with its own machine, do not. Every node still sends its own requests.
    stores = [TimedStore(url) for _ in names]
    stores[0].get("warm-up")
    stores[0].requests = 0
    decided: dict[int, float] = {}
    errors: list[Exception] = []

    def node(i: int, delay: float) -> None:
        time.sleep(delay)  # the simulated start delay
        try:
            policy = PollPolicy.for_store(stores[i])  # what a real node uses for this store
            policy.rng = random.Random(seed * 1000 + i)
            await_decision(stores[i], Registration(names[i], "10.0.0.1", 20000 + i), names, timeout=120,
                           policy=policy)
            decided[i] = time.monotonic()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(i, rng.uniform(0, 1.0))) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    last_registration = max(s.registered_at for s in stores)
    return [decided[i] - last_registration for i in range(n)], [s.requests for s in stores]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 32, 64, 128])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--stores", nargs="+", default=["local", "s3"])
    args = parser.parse_args()
    results = []
    moto = None
    if "s3" in args.stores:
        import os

        from s3server import MotoServer

        moto = MotoServer()
        os.environ.update(moto.env())
    try:
        for store in args.stores:
            for n in args.sizes:
                medians, worsts, requests = [], [], []
                for t in range(args.trials):
                    if store == "local":
                        url = f"{scratch_dir('rendezvous-')}/run"
                    else:  # a fresh bucket: moto lists a prefix by scanning the whole bucket
                        moto.make_bucket(f"bench-{n}-{t}")
                        url = f"s3://bench-{n}-{t}/run"
                    lags, counts = trial(url, n, seed=t)
                    lags.sort()
                    medians.append(lags[len(lags) // 2])
                    worsts.append(lags[-1])
                    requests.extend(counts)
                row = {"store": store, "nodes": n, "trials": args.trials,
                       "median_decided_after_last_registration_s": round(sorted(medians)[len(medians) // 2], 3),
                       "worst_decided_after_last_registration_s": round(max(worsts), 3),
                       "requests_per_node_median": sorted(requests)[len(requests) // 2],
                       "requests_per_node_max": max(requests)}
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if moto:
            moto.stop()
    print("\n| store | nodes | median decided after last registration | worst | requests/node (median, max) |")
    print("|---|---|---|---|---|")
    for row in results:
        print(f"| {row['store']} | {row['nodes']} | {row['median_decided_after_last_registration_s']:.3f} s | "
              f"{row['worst_decided_after_last_registration_s']:.3f} s | "
              f"{row['requests_per_node_median']}, {row['requests_per_node_max']} |")


if __name__ == "__main__":
    main()
