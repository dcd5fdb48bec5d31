"""What run health costs (issue 39): the node's sampler in CPU, a rank's progress writer in CPU, and the requests
a node makes on an object store with the sampler on against off.

1. Sampler CPU: this process stands in for a node with 4 training processes below it (each a real process with
   launcher's rank hooks, reporting a step every 10 ms, so its progress file changes every second); it takes
   --samples samples back to back (procfs tree, memory, GPUs as this machine has them, the 4 ranks' progress)
   and divides its CPU time by them; as a share of one core at the default interval.
2. Rank writer CPU: one progress write (what each rank's writer thread does at most once a second), timed here.
3. Requests, simulated: an hour of a node's store writes (a sample every 5 s, a heartbeat every 10 s) into a
   store that counts them and behaves as an object store (health records paced as on S3), sampler on and off.
4. Requests, real (--s3-seconds > 0): a 1-node run of 2 processes on moto_server's S3 through the tests'
   recording proxy, training for that long with the default interval; its requests per second in all (the
   `launcher run` that follows it goes through the proxy too) and on health/ keys, the only ones the sampler adds
   (its samples ride on the status heartbeats, written anyway).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/health.py [--samples 200] [--s3-seconds 120]

The figures come as one JSON line, last.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from common import REPO, scratch_dir

sys.path.insert(0, str(REPO / "tests"))

import launcher.protocol.health as health_record  # noqa: E402
from launcher.data import rankprogress  # noqa: E402
from launcher.node.diagnosis.stacks import HOOKS_DIR  # noqa: E402
from launcher.node.health.gpus import GpuReader  # noqa: E402
from launcher.node.health.sampler import HealthSampler  # noqa: E402
from launcher.protocol.status import StatusRecord  # noqa: E402

RANKS = 4
REPORTING = "import time, launcher.data\nfor step in range(10**9):\n    launcher.data.report(step, loss=1.0)\n" \
            "    time.sleep(0.01)\n"
HEARTBEAT_SECONDS = 10.0  # launcher.node.main.HEARTBEAT_SECONDS (not imported: the node program's imports)
TRAINS = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
end = time.time() + {seconds}
while True:
    done = torch.tensor([float(time.time() >= end)])
    dist.all_reduce(done)
    if done.item():
        break
    optimizer.zero_grad(); model(torch.randn(32, 64)).sum().backward(); optimizer.step(); time.sleep(0.02)
dist.destroy_process_group()
"""


def sampler_cpu(samples: int, scratch: Path) -> dict:
    stacks = scratch / "stacks"
    stacks.mkdir()
    ranks = []
    for local in range(RANKS):
        env = {**os.environ, "LAUNCHER_STACKS_DIR": str(stacks), "LOCAL_RANK": str(local), "RANK": str(local),
               "PYTHONPATH": f"{HOOKS_DIR}{os.pathsep}{REPO}"}
        ranks.append(subprocess.Popen([sys.executable, "-c", REPORTING], env=env))
    try:
        while len(list(stacks.glob("*.progress"))) < RANKS:
            time.sleep(0.05)  # their writers announce nothing but their files
        store = CountingStore()
        sampler = HealthSampler(health_record.HealthRecord(store, "bench"), StatusRecord(store, "bench", "bench"),
                                lambda: (str(stacks), {}), cores=os.cpu_count() or 1, gpus=GpuReader())
        sampler.sample()
        started = time.process_time()
        for _ in range(samples):
            sample = sampler.sample()
        cpu = (time.process_time() - started) / samples
    finally:
        for process in ranks:
            process.kill()
            process.wait()
    assert len(sample["ranks"]) == RANKS, sample
    return {"sampler_cpu_ms_per_sample": round(cpu * 1000, 3),
            "sampler_core_percent_at_5s": round(cpu / health_record.SAMPLE_SECONDS * 100, 4),
            "gpu_source": sampler.gpus.source}


def writer_cpu(scratch: Path, writes: int = 2000) -> dict:
    path = str(scratch / "0.progress")
    rankprogress.counters.metrics = {f"m{i}": float(i) for i in range(4)}
    started = time.process_time()
    for version in range(writes):
        rankprogress.counters.version = version + 1
        rankprogress._write(path, version)
    cpu = (time.process_time() - started) / writes
    return {"rank_writer_cpu_ms_per_write": round(cpu * 1000, 3),
            "rank_writer_core_percent": round(cpu / rankprogress.WRITE_SECONDS * 100, 4)}


class CountingStore:
    """Stands in for an object store (``is_local`` False: health records written at most every 30 s) and counts
    the writes per top-level prefix (status, health)."""

    is_local = False

    def __init__(self) -> None:
        self.puts: collections.Counter[str] = collections.Counter()

    def put(self, key: str, data: bytes) -> None:
        self.puts[key.split("/")[0]] += 1


def simulated_hour(with_health: bool) -> collections.Counter:
    clock = [0.0]
    real_time = health_record.time
    health_record.time = SimpleNamespace(monotonic=lambda: clock[0])  # the record paces its writes by this clock
    try:
        store = CountingStore()
        status = StatusRecord(store, "bench", "bench")
        sampler = HealthSampler(health_record.HealthRecord(store, "bench"), status, lambda: ("", {}), cores=1,
                                gpus=GpuReader(allowed=[]))
        ticks = sorted([(t * health_record.SAMPLE_SECONDS, "sample") for t in range(1, 721) if with_health]
                       + [(t * HEARTBEAT_SECONDS, "heartbeat") for t in range(1, 361)])
        for at, what in ticks:
            clock[0] = at
            sampler.tick() if what == "sample" else status.heartbeat()
        if with_health:
            sampler.record.flush()  # as the node does before its final status
        status.update(state="succeeded")
    finally:
        health_record.time = real_time
    return store.puts


def s3_requests(seconds: int, scratch: Path) -> dict:
    from s3server import FaultyProxy, MotoServer

    moto = MotoServer()
    proxy = FaultyProxy(moto.port, failure_rate=0.0)
    try:
        moto.make_bucket("bench")
        project = scratch / "project"
        project.mkdir()
        (project / "job.py").write_text(TRAINS.format(seconds=seconds))
        (project / "train.yaml").write_text(
            "kind: distributed\napiVersion: v1.0\nspec:\n  name: h\n"
            "  infrastructure: {kind: infrastructure, type: local}\n"
            "  cluster: {kind: pytorch, spec: {workDir: 's3://bench/runs', processesPerNode: 2, "
            "main: {replicas: 1}, worker: {replicas: 0}}}\n"
            "  runtime: {kind: python, spec: {entryPoint: job.py}}\n")
        env = {**os.environ, **moto.env(proxy.endpoint), "PYTHONPATH": str(REPO),
               "LAUNCHER_HOME": str(scratch / "home")}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "launcher", "run", "-f", "train.yaml"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=seconds + 300)
        elapsed = time.monotonic() - started
        assert done.returncode == 0, done.stdout + done.stderr
        requests = list(proxy.requests)
    finally:
        proxy.stop()
        moto.stop()
    health = [path for _, path, _ in requests if "/health/" in path]
    return {"s3_run_seconds": round(elapsed, 1), "s3_requests": len(requests), "s3_health_requests": len(health),
            "s3_requests_per_node_s": round(len(requests) / elapsed, 3),
            "s3_health_requests_per_node_s": round(len(health) / elapsed, 4),
            "s3_requests_per_node_s_without_health": round((len(requests) - len(health)) / elapsed, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--s3-seconds", type=int, default=120, help="0: no run on S3")
    args = parser.parse_args()
    scratch = scratch_dir("health-bench-")
    figures = {**sampler_cpu(args.samples, scratch), **writer_cpu(scratch)}
    on, off = simulated_hour(True), simulated_hour(False)
    print(f"simulated hour, writes by prefix: health on {dict(on)}, off {dict(off)}", file=sys.stderr)
    figures.update({"hour_writes_on": sum(on.values()), "hour_writes_off": sum(off.values()),
                    "hour_extra_writes_per_s": round((sum(on.values()) - sum(off.values())) / 3600, 4)})
    if args.s3_seconds:
        figures.update(s3_requests(args.s3_seconds, scratch))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
