"""The node's health sampler: a thread that, every :data:`SAMPLE_VAR` seconds from the node's registration to its
end, takes one sample (launcher.protocol.health describes it) of the node's process tree, the machine's memory,
the node's GPUs and its ranks' progress, adds it to the health record and notes it on the status record, whose
next heartbeat writes it."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from launcher.data import rankprogress
from launcher.gpus import Gpu
from launcher.node.health.gpus import GpuReader
from launcher.node.health.procfs import CpuMeter, ProcessStat, TreeReader, machine_memory, throttled_s, tree
from launcher.node.health.ranks import RankWindows, read_progress
from launcher.node.threads import usable_cores
from launcher.protocol.health import SAMPLE_SECONDS, WINDOW_SECONDS, HealthRecord, Sample
from launcher.protocol.status import StatusRecord
from launcher.protocol.store import WorkDir

SAMPLE_VAR = "LAUNCHER_HEALTH_SAMPLE"  # seconds between samples
WINDOW_VAR = "LAUNCHER_HEALTH_WINDOW"  # seconds a rank's work per step is measured over

# () -> (this round's stacks dir, where the ranks write their progress; global rank -> Unix time of its last line)
TrainingNow = Callable[[], tuple[str, Mapping[int, float]]]


def seconds_from_env(env: Mapping[str, str], name: str, default: float, say: Callable[[str], None], *,
                     minimum: float = 0.0, why: str = "") -> float:
    """A positive number of seconds from ``env[name]``; ``default`` when unset, or (said) when it is no such number;
    ``minimum`` (said, with ``why``) when it is less."""
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        say(f"{name}={text!r} is not a number of seconds above 0: using {default:g}")
        return default
    if value < minimum:
        say(f"{name}={text!r} is below {minimum:g} s{why}: using {minimum:g}")
        return minimum
    return value


class HealthSampler:
    def __init__(self, record: HealthRecord, status: StatusRecord, training_now: TrainingNow, *, cores: int,
                 gpus: GpuReader, interval: float = SAMPLE_SECONDS, window: float = WINDOW_SECONDS,
                 root: int | None = None):
        self.record = record
        self.status = status
        self.training_now = training_now
        self.cores = cores
        self.gpus = gpus
        self.interval = interval
        self.window = window
        self.processes = TreeReader(os.getpid() if root is None else root)
        self.cpu = CpuMeter()
        self.windows = RankWindows(window)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)

    def start(self) -> "HealthSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        """End sampling and write what the record holds (before the node's final status)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.record.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        """One sample, kept in the record (written when due) and noted on the status (written with it next)."""
        sample = self.sample()
        self.record.add(sample)
        self.status.note(health=sample)

    def sample(self) -> Sample:
        now, clock = time.time(), time.monotonic()
        members = self.processes.read()
        node_cpu = self.cpu.percent("node", sum(stat.cpu_s for stat in members.values()), clock)
        gpus, gpu_users = self.gpus.read()
        sample: Sample = {"at": now, "rss_bytes": sum(stat.rss_bytes for stat in members.values()),
                          **machine_memory(), "cores": self.cores, "gpus": gpus, "window_seconds": self.window}
        if node_cpu is not None:
            sample["cpu_percent"] = node_cpu
        stacks_dir, last_lines = self.training_now()
        sample["ranks"] = self._ranks(stacks_dir, last_lines, members, gpu_users, now, clock)
        self.cpu.keep({"node", *members})
        return sample

    def _ranks(self, stacks_dir: str, last_lines: Mapping[int, float], members: dict[int, ProcessStat],
               gpu_users: dict[int, int], now: float, clock: float) -> dict[str, dict[str, Any]]:
        """Per global rank, its process's CPU and memory (with its children) and its progress figures."""
        ranks = {}
        progress = read_progress(stacks_dir)
        for local, record in sorted(progress.items()):
            pid = record["pid"]
            rank = record.get("rank") if isinstance(record.get("rank"), int) else local
            figures: dict[str, Any] = {"local": local, "pid": pid}
            own = tree(members, pid)
            if own:
                cpu = self.cpu.percent(pid, sum(stat.cpu_s for stat in own), clock)
                figures.update({} if cpu is None else {"cpu_percent": cpu},
                               rss_bytes=sum(stat.rss_bytes for stat in own))
            figures.update(self.windows.figures(record, now, throttled_s(pid)))
            if rank in last_lines:
                figures["last_line_at"] = last_lines[rank]
            gpu = next((gpu_users[stat.pid] for stat in own if stat.pid in gpu_users), None)
            if gpu is not None:
                figures["gpu"] = gpu
            ranks[str(rank)] = figures
        self.windows.keep({record["pid"] for record in progress.values()})
        return ranks


def start_sampler(store: WorkDir, status: StatusRecord, node: str, incarnation: int, training_now: TrainingNow,
                  gpus: Sequence[Gpu], say: Callable[[str], None],
                  env: Mapping[str, str] = os.environ) -> HealthSampler:
    """The node's sampler, started, with the interval and window its environment asks for; ``gpus``: those the
    node was given (launcher.gpus.visible_gpus), all of the machine's where CUDA_VISIBLE_DEVICES leaves them."""
    interval = seconds_from_env(env, SAMPLE_VAR, SAMPLE_SECONDS, say, minimum=rankprogress.WRITE_SECONDS,
                                why=", how often training processes write their progress")
    window = seconds_from_env(env, WINDOW_VAR, WINDOW_SECONDS, say)
    given = None if "CUDA_VISIBLE_DEVICES" not in env else [gpu.index for gpu in gpus]
    record = HealthRecord(store, node, incarnation, interval)
    return HealthSampler(record, status, training_now, cores=usable_cores(), gpus=GpuReader(given),
                         interval=interval, window=window).start()
