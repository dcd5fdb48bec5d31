"""Each epoch's progress as the work dir records it (for `launcher data` and `status`): in the newest attempt,
shards (``shard_size`` consecutive positions of the epoch's order) fully trained (done), partly trained (in
flight) and not started (left)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from launcher.data.intervals import Interval
from launcher.data.plan import Plan
from launcher.data.records import plan_key, progress_key
from launcher.node.store import WorkDir


@dataclass
class EpochProgress:
    epoch: int
    attempt: str
    shards: int
    done: int
    in_flight: int
    left: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _attempt_order(name: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in name.split("."))
    except ValueError:
        return None


def read_progress(store: WorkDir, *, latest_only: bool = False) -> list[EpochProgress]:
    """Every recorded epoch's progress, oldest first; with ``latest_only`` only the newest epoch's."""
    epochs = sorted(int(name) for name in store.list("data") if name.isdigit())
    found = []
    for epoch in epochs[-1:] if latest_only else epochs:
        attempts = [a for a in store.list(f"data/{epoch:05d}") if _attempt_order(a) is not None]
        if attempts:
            progress = _attempt_progress(store, epoch, max(attempts, key=_attempt_order))
            if progress is not None:
                found.append(progress)
    return found


def _attempt_progress(store: WorkDir, epoch: int, attempt: str) -> EpochProgress | None:
    record = store.get_record(plan_key(epoch, attempt))
    if not record:
        return None
    size, shard_size = int(record["size"]), int(record["shard_size"])
    plan = Plan([(int(low), int(high)) for low, high in record["remaining"]], int(record["world"]), size)
    consumed = [int(store.get_record(progress_key(epoch, attempt, rank)).get("consumed", 0))
                for rank in range(plan.world)]
    return count_shards(plan.done(consumed), size, shard_size, epoch, attempt)


def count_shards(trained: list[Interval], size: int, shard_size: int, epoch: int, attempt: str) -> EpochProgress:
    shards = -(-size // shard_size)
    per_shard = [0] * shards
    for low, high in trained:
        position = low
        while position < high:
            shard = position // shard_size
            end = min(high, (shard + 1) * shard_size)
            per_shard[shard] += end - position
            position = end
    lengths = [min(shard_size, size - k * shard_size) for k in range(shards)]
    done = sum(1 for got, length in zip(per_shard, lengths) if got == length)
    in_flight = sum(1 for got, length in zip(per_shard, lengths) if 0 < got < length)
    return EpochProgress(epoch, attempt, shards, done, in_flight, shards - done - in_flight)
