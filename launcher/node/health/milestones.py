"""Each training process's start, first steps and last step, copied from its progress record
(launcher.data.rankprogress) into the node's timeline events (launcher.protocol.events: ``rank-started``,
``first-step``, ``last-step``), once each: what a recovery's breakdown needs to say when training really went on
(launcher.runs.recoveries), and what an incident needs to say what it cost (launcher.runs.incidents).

The node looks every half second while its round trains (its supervision loop wakes that often anyway), until every
process has counted a first step and :data:`SOURCES_SECONDS` more have passed (a DataLoader hands out its first
batch before the optimizer's first step counts: both are kept, readers take the one counted by precedence), and
once more as the round ends: then each process's last step is recorded too, with its count of steps and the last
step number the script reported. A process writes its record once a second, so that last step is known to within a
second. Only local files are read; nothing here raises into supervision.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from launcher.data.rankprogress import SOURCES
from launcher.node.health.ranks import counted_steps, read_progress
from launcher.protocol.events import FIRST_STEP, LAST_STEP, RANK_STARTED

SOURCES_SECONDS = 10.0  # after every process's first step, how long to look for the other sources' first steps

Record = Callable[..., None]  # launcher.protocol.events.EventLog.record


class RankMilestones:
    def __init__(self, stacks_dir: str, processes: int, round_number: int | None, record: Record,
                 clock: Callable[[], float] = time.monotonic):
        self.stacks_dir = stacks_dir
        self.processes = processes
        self.round = round_number
        self.record = record
        self.clock = clock
        self._seen: set[tuple[int, str]] = set()  # (pid, "started" or a step source), each recorded once
        self._stepped: set[int] = set()  # local ranks that counted a step
        self._all_stepped_at: float | None = None

    @property
    def done(self) -> bool:
        return self._all_stepped_at is not None and self.clock() - self._all_stepped_at >= SOURCES_SECONDS

    def check(self, final: bool = False) -> None:
        """Record what is new in the processes' progress records; ``final``: the round ends, look whatever ``done``,
        and record each process's last step."""
        if self.done and not final:
            return
        try:
            progress = read_progress(self.stacks_dir)
        except Exception:  # noqa: BLE001 - a help for the timeline, never a reason to stop supervising
            return
        for local, record in sorted(progress.items()):
            self._firsts(local, record)
            if final:
                self._last(record)
        if self._all_stepped_at is None and len(self._stepped) >= self.processes:
            self._all_stepped_at = self.clock()

    def _firsts(self, local: int, record: dict[str, Any]) -> None:
        pid, rank = record["pid"], _rank(record)
        started = record.get("started_at")
        if _is_time(started) and (pid, "started") not in self._seen:
            self._seen.add((pid, "started"))
            self.record(RANK_STARTED, at=float(started), round=self.round, rank=rank)
        firsts = record.get("first_step_at") if isinstance(record.get("first_step_at"), dict) else {}
        for source in SOURCES:
            at = firsts.get(source)
            if _is_time(at) and (pid, source) not in self._seen:
                self._seen.add((pid, source))
                self._stepped.add(local)
                step = _step(record.get("first_reported")) if source == "report" else None
                self.record(FIRST_STEP, at=float(at), round=self.round, rank=rank, source=source, step=step)

    def _last(self, record: dict[str, Any]) -> None:
        at = record.get("last_step_at")
        if not _is_time(at) or (record["pid"], "last") in self._seen:
            return
        self._seen.add((record["pid"], "last"))
        steps, source = counted_steps(record)
        reported = record.get("steps", {}).get("report") if isinstance(record.get("steps"), dict) else None
        self.record(LAST_STEP, at=float(at), round=self.round, rank=_rank(record), source=source, steps=steps,
                    step=_step(reported))


def _rank(record: dict[str, Any]) -> int | None:
    return record.get("rank") if isinstance(record.get("rank"), int) else None


def _step(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _is_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
