"""Each rank's figures from the progress its process writes (launcher.data.rankprogress): steps and samples and
their rates over the last interval, and its own work per step over a window.

Work per step is the rank's CPU time and time waiting for data per step, not the time it waits for the other
ranks in collectives: in synchronous training every rank steps as fast as the slowest, so only this tells which
one holds the others back.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.data.rankprogress import PROGRESS_SUFFIX, SOURCES


@dataclass(frozen=True)
class Snapshot:
    at: float  # when the sampler read it (Unix time)
    steps: int
    samples: int
    cpu_s: float
    data_wait_s: float
    data_cpu_s: float  # of cpu_s, spent making batches (a loader without workers): counted as the wait, not twice
    throttled_s: float | None = None  # its cgroup's time held back by a CPU quota (procfs.throttled_s), so far


def read_progress(stacks_dir: str) -> dict[int, dict[str, Any]]:
    """local rank -> its latest progress record, for the processes that wrote one."""
    found = {}
    try:
        paths = list(Path(stacks_dir).glob(f"*{PROGRESS_SUFFIX}")) if stacks_dir else []
    except OSError:
        return {}
    for path in paths:
        local = path.name.removesuffix(PROGRESS_SUFFIX)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):  # gone with its round
            continue
        if local.isdigit() and isinstance(record, dict) and isinstance(record.get("pid"), int):
            found[int(local)] = record
    return found


def counted_steps(record: dict[str, Any]) -> tuple[int, str | None]:
    """(steps, who counted them): the first source by precedence that counted any."""
    steps = record.get("steps") if isinstance(record.get("steps"), dict) else {}
    for source in SOURCES:
        value = steps.get(source)
        if isinstance(value, int) and value > 0:
            return value, source
    return 0, None


class RankWindows:
    """Per rank process, its snapshots over the last ``window`` seconds (and one before: the window's start)."""

    def __init__(self, window: float):
        self.window = window
        self._snapshots: dict[int, collections.deque[Snapshot]] = {}  # pid -> oldest first

    def figures(self, record: dict[str, Any], now: float, throttled_s: float | None = None) -> dict[str, Any]:
        """The progress figures of one rank's ``record`` read at ``now`` (``throttled_s``: its cgroup's)."""
        steps, source = counted_steps(record)
        snapshot = Snapshot(now, steps, _int(record.get("samples")), _float(record.get("cpu_s")),
                            _float(record.get("data_wait_s")), _float(record.get("data_cpu_s")), throttled_s)
        history = self._snapshots.setdefault(record["pid"], collections.deque())
        previous = history[-1] if history else None
        if previous is not None and previous.steps == 0:  # its first steps: what came before was its start, not work
            history.clear()
        history.append(snapshot)
        while len(history) > 2 and history[1].at <= now - self.window:  # the newest one at least a window old
            history.popleft()
        figures: dict[str, Any] = {"steps": steps, "samples": snapshot.samples, "step_source": source,
                                   "metrics": record.get("metrics") or {}}
        if previous is not None and now > previous.at:
            elapsed = now - previous.at
            figures["steps_per_s"] = round(max(0, steps - previous.steps) / elapsed, 3)
            if snapshot.samples:  # something counts them (a DataLoader); else unknown, not 0
                figures["samples_per_s"] = round(max(0, snapshot.samples - previous.samples) / elapsed, 3)
        start = history[0]
        window_s = now - start.at
        if window_s > 0:
            waited = max(0.0, snapshot.data_wait_s - start.data_wait_s)
            figures["window_s"] = round(window_s, 1)
            figures["data_wait_fraction"] = round(min(1.0, waited / window_s), 3)
            if snapshot.throttled_s is not None and start.throttled_s is not None:
                held = max(0.0, snapshot.throttled_s - start.throttled_s)
                figures["throttled_fraction"] = round(min(1.0, held / window_s), 3)
            if steps > start.steps:
                computed = (snapshot.cpu_s - start.cpu_s) - (snapshot.data_cpu_s - start.data_cpu_s)
                work = max(0.0, computed) + waited
                figures["work_per_step_s"] = round(work / (steps - start.steps), 6)
        return figures

    def keep(self, pids: set[int]) -> None:
        """Forget the processes not in ``pids`` (ended, or of an earlier round)."""
        for pid in set(self._snapshots) - pids:
            del self._snapshots[pid]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
