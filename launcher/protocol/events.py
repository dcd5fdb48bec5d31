"""A node's phases with their times, kept in the work dir for ``launcher timeline``.

Only the phases no other record holds the time of are recorded here; the rest (submitted, rounds
ended, deaths, final states, scale requests) come from the run's own records
(:mod:`launcher.runs.timeline`). Layout under ``{work dir}/{run id}/``::

  events/{node}/{incarnation:03d}.{seq:04d}.json   a batch of one node process's events, written once:
                                                   {"node", "incarnation", "events": [{"phase", "at", ...}]}
  events/scale.{at:.6f}.json                       a `launcher scale` request, written once

``record`` never blocks the caller (the rank-log reader must never stop reading): a thread writes what is
pending as one object, at most one per ``interval`` (as log chunks: 0.1 s on a local work dir, 2 s on
object stores), so a node makes a handful of requests per round. ``close`` writes what is left, before the
node's final status. An event that could not be written is tried again with the next batch; the timeline is a
help, so a store error never fails a node.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from launcher.protocol.logship import LOCAL_INTERVAL, STORE_INTERVAL
from launcher.procinfo import start_time
from launcher.protocol.store import StoreError, WorkDir

EVENTS_PREFIX = "events"
SCALE_PREFIX = "scale."  # run-level records directly under events/: `launcher scale` requests

STARTED = "started"  # the node process started (from /proc, so it covers the interpreter's start and imports)
REGISTERED = "registered"  # it registered and waits for the decision (of a round, in recovering runs)
DECIDED = "decided"  # it learned the decision: its rank, the main
RESTORED = "restored"  # it restored the newest outputs (checkpoints) before training
TORCHRUN = "torchrun"  # torchrun started
RANK_STARTED = "rank-started"  # a training process (``rank``) is about to run the script's first line (its hooks ran
#   with a rank: at its interpreter's start, or, warm, once handed its rank), as its progress record says
FIRST_LINE = "first-line"  # a training process (``rank``) wrote its first line
FIRST_STEP = "first-step"  # a training process (``rank``) counted its first step (``source``: who counted it)
LAST_STEP = "last-step"  # a training process's last counted step (``steps``: how many it counted, ``step``: the last
#   number it reported), recorded as its round ends
LAST_LINE = "last-line"  # a training process's last line (recorded once torchrun exited)
RANK_EXITED = "rank-exited"  # a training process ended (``rank``): its output pipe closed
EXITED = "exited"  # torchrun exited (``code``): training ended, or the node stopped it
SYNCED = "synced"  # the node's final outputs sync ended (``failed``: whether it failed)
NODE_PHASES = (STARTED, REGISTERED, DECIDED, RESTORED, TORCHRUN, RANK_STARTED, FIRST_LINE, FIRST_STEP, LAST_STEP,
               LAST_LINE, RANK_EXITED, EXITED, SYNCED)


def batch_key(node: str, incarnation: int, seq: int) -> str:
    return f"{EVENTS_PREFIX}/{node}/{incarnation:03d}.{seq:04d}.json"


def scale_key(at: float) -> str:
    return f"{EVENTS_PREFIX}/{SCALE_PREFIX}{at:.6f}.json"


def process_start_time() -> float:
    """When this process started (Unix time), from /proc; now where /proc cannot say."""
    started = start_time(os.getpid())
    return time.time() if started is None else started


class EventLog:
    def __init__(self, store: WorkDir, node: str, incarnation: int, interval: float | None = None):
        self.store = store
        self.node = node
        self.incarnation = incarnation
        self.interval = interval if interval is not None else LOCAL_INTERVAL if store.is_local else STORE_INTERVAL
        self._pending: list[dict[str, Any]] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._arrived = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-events", daemon=True)
        self.record(STARTED, at=process_start_time(), pid=os.getpid())

    def start(self) -> "EventLog":
        self._thread.start()
        return self

    def record(self, phase: str, at: float | None = None, **fields: Any) -> None:
        """Note ``phase`` as of ``at`` (default: now), with ``fields`` (round, rank, code, ...)."""
        event = {"phase": phase, "at": time.time() if at is None else at,
                 **{name: value for name, value in fields.items() if value is not None}}
        with self._lock:
            self._pending.append(event)
        self._arrived.set()

    def first_line(self, round_number: int | None):
        """A callback for :class:`launcher.node.torchrun.ranklogs.RankLogs`: a rank's first line in this round."""
        return lambda rank, at: self.record(FIRST_LINE, at=at, round=round_number, rank=rank)

    def rank_exited(self, round_number: int | None):
        """A callback for :class:`launcher.node.torchrun.ranklogs.RankLogs`: a rank's process ended in this round."""
        return lambda rank, at: self.record(RANK_EXITED, at=at, round=round_number, rank=rank)

    def training_ended(self, round_number: int | None, code: int, last_lines: dict[int, float]) -> None:
        """torchrun exited with ``code``; ``last_lines``: each rank's last line's time."""
        for rank, at in sorted(last_lines.items()):
            self.record(LAST_LINE, at=at, round=round_number, rank=rank)
        self.record(EXITED, round=round_number, code=code)

    def close(self) -> None:
        """Write what is pending (the node ends); the thread stops."""
        self._closed.set()
        self._arrived.set()
        if self._thread.is_alive():
            self._thread.join()
        self._write()

    def _run(self) -> None:
        while not self._closed.is_set():
            self._arrived.wait()
            self._arrived.clear()
            if self._closed.is_set():
                return
            self._write()
            self._closed.wait(self.interval)

    def _write(self) -> None:
        with self._write_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch:
                return
            body = {"node": self.node, "incarnation": self.incarnation, "events": batch}
            try:
                self.store.put(batch_key(self.node, self.incarnation, self._seq), json.dumps(body).encode())
            except StoreError:
                with self._lock:  # kept for the next batch, in order
                    self._pending[:0] = batch
                return
            self._seq += 1
