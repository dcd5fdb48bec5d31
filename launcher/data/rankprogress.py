"""A training process's progress, for its node's health sampler (launcher.node.health): steps (by who counted
them), samples, seconds spent waiting for data and the process's CPU time, written by a daemon thread at most
once a second, when they changed, to ``{LAUNCHER_STACKS_DIR}/{LOCAL_RANK}.progress`` (one JSON object, replaced
atomically).

Steps are counted by whoever can: :func:`report` (the script says), torch's optimizers (a global post-step hook,
registered once the script has imported ``torch.optim``; this module never imports torch) or the DataLoaders (one
step per batch, with its samples and the time the script waited for it, once it has imported
``torch.utils.data``). Readers take the first of those that counted anything, in that order.

Each record also says when the process became this rank's training process (``started_at``: its hooks ran with a
rank, just before the script's first line; a warm interpreter's once it was handed its rank) and when each source
counted its first step (``first_step_at``), when any last counted one (``last_step_at``) and the first step number the
script reported (``first_reported``: where it resumed), for the node's timeline events (a recovery's "first step",
what an incident cost: :mod:`launcher.runs.incidents`).

Standard library only: the rank hooks (``sitecustomize``) load this file under its own module name before the
script runs, without importing launcher's package. Outside launcher (no stacks dir or local rank in the
environment) nothing is counted or written. Nothing here raises into training.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import threading
import time
from typing import Any

PROGRESS_SUFFIX = ".progress"
WRITE_SECONDS = 1.0
MAX_METRICS = 16
MAX_METRIC_NAME = 64
SOURCES = ("report", "optimizer", "loader")  # the precedence of step counts, first wins


def progress_path(env: Any = None) -> str | None:
    """Where this process's progress goes; None outside launcher's training processes."""
    env = os.environ if env is None else env
    directory, local_rank = env.get("LAUNCHER_STACKS_DIR"), env.get("LOCAL_RANK")
    if not directory or local_rank is None or not local_rank.isdigit():
        return None
    return os.path.join(directory, local_rank + PROGRESS_SUFFIX)


class Counters:
    """What the process did so far; every change bumps ``version``, so the writer writes only what is new."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: dict[str, int] = {}
        self.samples = 0
        self.data_wait_s = 0.0
        self.data_cpu_s = 0.0
        self.metrics: dict[str, float] = {}
        self.first_step_at: dict[str, float] = {}  # source -> when it counted its first step (Unix time)
        self.last_step_at: float | None = None  # when any source last counted a step
        self.first_reported: int | None = None  # the first step number the script reported: where it resumed
        self.started_at: float | None = None  # when this process became a rank's training process
        self.version = 0

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"steps": dict(self.steps), "samples": self.samples, "data_wait_s": round(self.data_wait_s, 6),
                    "data_cpu_s": round(self.data_cpu_s, 6),
                    "metrics": dict(self.metrics), "first_step_at": dict(self.first_step_at),
                    "last_step_at": self.last_step_at, "first_reported": self.first_reported,
                    "started_at": self.started_at}


counters = Counters()
_writer: threading.Thread | None = None
_start_lock = threading.Lock()


def report(step: int, **metrics: float) -> None:
    """The training loop is at ``step``; ``metrics`` (numbers: a loss, a learning rate) go with it. Counts before
    an optimizer's or a loader's do. A no-op outside launcher; never raises."""
    try:
        if progress_path() is None:
            return
        start()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            return
        with counters.lock:
            counters.steps["report"] = step
            if step > 0:
                now = time.time()
                counters.first_step_at.setdefault("report", now)
                counters.last_step_at = now
                if counters.first_reported is None:
                    counters.first_reported = step
            for name, value in metrics.items():
                name = str(name)[:MAX_METRIC_NAME]
                if name not in counters.metrics and len(counters.metrics) >= MAX_METRICS:
                    continue
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    counters.metrics[name] = float(value)
            counters.version += 1
    except Exception:  # noqa: BLE001 - progress is never worth a failed step
        return


def count(source: str, samples: int = 0, waited: float = 0.0, waited_cpu: float = 0.0) -> None:
    """One step counted by ``source`` ("optimizer", "loader"), with the samples it took, the seconds it waited
    for them, and the CPU seconds of those its own thread spent making them (a loader without workers)."""
    with counters.lock:
        counters.steps[source] = counters.steps.get(source, 0) + 1
        now = counters.last_step_at = time.time()
        counters.first_step_at.setdefault(source, now)
        counters.samples += samples
        counters.data_wait_s += waited
        counters.data_cpu_s += waited_cpu
        counters.version += 1


def _optimizer_stepped(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
    count("optimizer")


def _hook_optimizers() -> bool:
    """Count every optimizer step, once the script has imported torch.optim (True when hooked)."""
    module = sys.modules.get("torch.optim.optimizer")
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is None:  # not imported (yet), or still being imported
        return False
    register(_optimizer_stepped)
    return True


def hook_loaders() -> bool:
    """Count every batch any DataLoader hands the script, its samples and the wait for it, once the script has
    imported torch.utils.data (True when hooked). torch has no public hook for this: the iterator class every
    DataLoader (ElasticLoader too) returns is wrapped, and left alone where torch no longer has it."""
    module = sys.modules.get("torch.utils.data.dataloader")
    iterator = getattr(module, "_BaseDataLoaderIter", None)
    if iterator is None:
        return False
    original = iterator.__next__
    if getattr(original, "launcher_counts", False):
        return True

    def counted_next(self: Any) -> Any:
        asked, cpu = time.perf_counter(), time.thread_time()
        batch = original(self)
        count("loader", batch_samples(batch), time.perf_counter() - asked, time.thread_time() - cpu)
        return batch

    counted_next.launcher_counts = True  # type: ignore[attr-defined]
    iterator.__next__ = counted_next
    return True


def batch_samples(batch: Any) -> int:
    """How many samples ``batch`` holds: the first dimension of its first tensor (in a tuple, list or dict)."""
    for _ in range(8):  # nested no deeper than that in practice
        shape = getattr(batch, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else 1
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)) and batch:
            if not hasattr(batch[0], "shape") and not isinstance(batch[0], (list, tuple, dict)):
                return len(batch)  # a batch of plain values (collated ints and floats are tensors)
            batch = batch[0]
        else:
            return 0
    return 0


def start() -> None:
    """Start the writer, once, where this is a training process of launcher's (else nothing)."""
    global _writer
    path = progress_path()
    if path is None:
        return
    with _start_lock:
        if _writer is not None:
            return
        with counters.lock:
            counters.started_at = time.time()
            counters.version += 1
        _writer = threading.Thread(target=_write_while_alive, args=(path,), name="launcher-progress", daemon=True)
        _writer.start()
    atexit.register(_write, path, -1)  # the last steps, when the script ends between two writes


HOOK_SECONDS = 0.05  # how often, until both are hooked, to look whether the script has imported torch.optim and
HOOK_WINDOW = 120.0  # torch.utils.data, for this long from the start: a step before its hook is a step uncounted


def _write_while_alive(path: str) -> None:
    optimizers = loaders = False
    written = -1
    begun = time.monotonic()
    next_write = begun
    while True:
        try:
            optimizers = optimizers or _hook_optimizers()
            loaders = loaders or hook_loaders()
            if time.monotonic() >= next_write:
                written = _write(path, written)
                next_write = time.monotonic() + WRITE_SECONDS
        except Exception:  # noqa: BLE001 - a full disk, a removed directory: no progress, training goes on
            pass
        looking = not (optimizers and loaders) and time.monotonic() - begun < HOOK_WINDOW
        time.sleep(HOOK_SECONDS if looking else max(0.0, next_write - time.monotonic()))


def _write(path: str, written: int) -> int:
    """Write the counters if they changed since version ``written``; the version now written."""
    version = counters.version
    if version == written:
        return written
    record = {"pid": os.getpid(), "rank": _int_env("RANK"), "at": time.time(), "cpu_s": time.process_time(),
              **counters.snapshot()}
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w") as handle:
            json.dump(record, handle)
        os.replace(temporary, path)
    except OSError:
        return written
    return version


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None
