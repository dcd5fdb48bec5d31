"""What launcher.data writes to the run's work dir, for `launcher data` and `status` to read: each attempt's
plan and each rank's progress. Training relies on none of it (the checkpoint is the record it resumes from),
so the writing happens off the training thread: a rank's progress is sampled at most every ``interval``
seconds and written when it changed, and a slow store (S3 at some ms per write) never slows a step.
"""

from __future__ import annotations

import atexit
import json
import threading
import warnings
from typing import Any, Callable

from launcher.protocol.store import WorkDir

Snapshot = Callable[[], dict[str, Any]]


def attempt_prefix(epoch: int, attempt: str) -> str:
    return f"data/{epoch:05d}/{attempt}"


def plan_key(epoch: int, attempt: str) -> str:
    return f"{attempt_prefix(epoch, attempt)}/plan.json"


def progress_key(epoch: int, attempt: str, rank: int) -> str:
    return f"{attempt_prefix(epoch, attempt)}/progress/{rank}.json"


def plan_record(*, size: int, shard_size: int, world: int, remaining: list, batch_size: int | None,
                steps: int | None) -> dict[str, Any]:
    """An attempt's split of an epoch: ``remaining`` (the untrained positions at its start) among ``world`` ranks."""
    return {"size": size, "shard_size": shard_size, "world": world, "remaining": [list(r) for r in remaining],
            "batch_size": batch_size, "steps": steps}


def progress_record(consumed: int, of: int, *, final: bool) -> dict[str, Any]:
    """A rank's count of consumed samples of its stretch. ``final``: written when the rank's epoch was over (the
    loop ran out, left early or failed), so exact; otherwise a sample taken while it trained, which may lag
    behind the loop by one writer pass, or more if the process was stopped before its next pass."""
    record: dict[str, Any] = {"consumed": consumed, "of": of}
    if final:
        record["final"] = True
    return record


class Recorder:
    """One background writer per sampler, writing every ``interval`` seconds what came in: ``create`` an
    object once (create-if-absent: the plan), ``watch`` a live record sampled then, until ``unwatch`` hands
    over its last value; ``flush`` writes everything now and waits for it."""

    def __init__(self, store: WorkDir, *, interval: float = 0.5):
        self.store = store
        self.interval = interval
        self._creates: dict[str, dict[str, Any]] = {}
        self._watches: dict[str, Snapshot] = {}
        self._finals: dict[str, dict[str, Any]] = {}
        self._written: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._passes = threading.Condition(self._lock)
        self._asked = 0  # flush() requests
        self._served = 0  # the newest request a completed pass of writes started after
        self._failures: list[str] = []
        self._thread: threading.Thread | None = None

    def create(self, key: str, record: dict[str, Any]) -> None:
        with self._lock:
            self._creates[key] = record
        self._start()

    def watch(self, key: str, snapshot: Snapshot) -> None:
        with self._lock:
            self._watches[key] = snapshot
        self._start()

    def unwatch(self, key: str) -> None:
        with self._lock:
            snapshot = self._watches.pop(key, None)
            if snapshot is not None:
                self._finals[key] = snapshot()

    def flush(self, timeout: float = 30.0) -> None:
        """Write what is pending and the watched records' values now; warn once about failed writes."""
        with self._lock:
            if self._thread is not None:
                self._asked += 1
                wanted = self._asked
                self._wake.set()
                self._passes.wait_for(lambda: self._served >= wanted, timeout)
            failures, self._failures = self._failures, []
        if failures:  # progress only: training resumes from the checkpoint, never from these
            warnings.warn(f"launcher.data: {len(failures)} progress records were not written to the work dir "
                          f"(`launcher data` shows older progress): {failures[0]}", stacklevel=2)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._write, name="launcher-data-records", daemon=True)
        self._thread.start()
        atexit.register(self.flush, 10.0)  # the last epoch's final progress, even without epochs()

    def _due(self) -> tuple[int, list[tuple[str, bool, dict[str, Any]]]]:
        """What a pass writes, in this order: the records whose last value came in (an epoch that ended), the new
        plans, the live records. A reader that finds a later epoch's record may take the earlier epoch as
        passed, so its final counts go first; a key watched again after its final value takes the newer one."""
        with self._lock:
            asked = self._asked
            finals = [(key, value) for key, value in self._finals.items() if key not in self._watches]
            creates = [(key, True, record) for key, record in self._creates.items()]
            live = [(key, snapshot()) for key, snapshot in self._watches.items()]
            self._creates, self._finals = {}, {}

        def changed(values: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, bool, dict[str, Any]]]:
            return [(key, False, value) for key, value in values if self._written.get(key) != value]

        return asked, changed(finals) + creates + changed(live)

    def _create(self, key: str, data: bytes, record: dict[str, Any]) -> None:
        if self.store.create(key, data):
            return
        other = self.store.get_record(key)  # the same plan from another rank, or another sampler's
        if other.get("size") != record.get("size"):
            raise RuntimeError(f"another ElasticSampler (of {other.get('size')} samples, not {record.get('size')}) "
                               f"records its progress in this run; pass records=False to all but one")

    def _write(self) -> None:
        while True:
            self._wake.clear()  # before reading what is due: a request made from here on gets another pass
            asked, due = self._due()
            for key, create_only, record in due:
                data = json.dumps(record, separators=(",", ":")).encode()
                try:
                    if create_only:
                        self._create(key, data, record)
                    else:
                        self.store.put(key, data)
                    self._written[key] = record
                except Exception as exc:  # noqa: BLE001 - reported by flush(), never raised into training
                    with self._lock:
                        self._failures.append(f"{key}: {exc}")
            with self._lock:
                self._served = asked
                self._passes.notify_all()
            # One pass per interval, whatever comes in meanwhile (epochs of a few ms each end and begin many
            # times): the training thread only ever hands over values, and flush() asks for a pass at once.
            self._wake.wait(self.interval)
