"""Each epoch's progress as the work dir records it (for `launcher data` and `status`): in the newest attempt,
shards (``shard_size`` consecutive positions of the epoch's order) fully trained (done), partly trained (in
flight) and not started (left).

The records are written off the training thread, once per writer pass, so an attempt that is stopped (a node
lost, a membership change) can leave a rank's count behind what its loop had consumed, or an epoch unrecorded
altogether. What came after says more: a record of a later epoch by the same attempt or a newer one means the
lineage went past this epoch (epochs are trained in order, and a rank begins the next one only when every rank
consumed its stretch of this one), so a rank's count that was not final is taken as its whole stretch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from launcher.data.intervals import Interval
from launcher.data.plan import Plan
from launcher.data.records import plan_key, progress_key
from launcher.protocol.store import WorkDir

UNKNOWN_ATTEMPT = "-"  # an epoch that no attempt got to record, known done from what came after it


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
    if latest_only:
        epochs = epochs[-1:]
    found: dict[int, EpochProgress] = {}
    unplanned: list[tuple[int, str]] = []  # epochs known done whose newest attempt recorded no plan
    recorded: set[int] = set()
    shape: tuple[int, int] | None = None  # (size, shard_size): one sampler, the same in every epoch
    later: tuple[int, ...] | None = None  # the newest attempt that recorded an epoch after the one at hand
    for epoch in reversed(epochs):
        attempts = sorted((a for a in store.list(f"data/{epoch:05d}") if _attempt_order(a) is not None),
                          key=_attempt_order, reverse=True)
        if not attempts:
            continue
        recorded.add(epoch)
        newest = _attempt_order(attempts[0])
        passed = later is not None and later >= newest
        for attempt in attempts:
            record = store.get_record(plan_key(epoch, attempt))
            if record:
                shape = int(record["size"]), int(record["shard_size"])
            if record and (attempt == attempts[0] or not passed):
                # The newest attempt's plan, or an older one's while the newest has recorded none yet (it just
                # began, or it was stopped first) and nothing says the lineage went past this epoch.
                found[epoch] = _attempt_progress(store, epoch, attempt, record, passed=passed)
                break
            if passed and shape is not None:
                break
        if passed and epoch not in found:  # the attempt that trained it was stopped before it recorded its plan
            unplanned.append((epoch, attempts[0]))
        later = newest if later is None else max(later, newest)
    if shape is not None:
        size, shard_size = shape
        shards = -(-size // shard_size)
        for epoch, attempt in unplanned:
            found[epoch] = EpochProgress(epoch, attempt, shards, shards, 0, 0)
        if found:  # an epoch between recorded ones that no attempt got to record at all
            for epoch in set(range(min(found), max(found))) - recorded:
                found[epoch] = EpochProgress(epoch, UNKNOWN_ATTEMPT, shards, shards, 0, 0)
    return [found[epoch] for epoch in sorted(found)]


def _attempt_progress(store: WorkDir, epoch: int, attempt: str, record: dict[str, Any], *,
                      passed: bool) -> EpochProgress:
    """``passed``: the lineage went on past this epoch, so a rank whose count is not final consumed its stretch."""
    size, shard_size = int(record["size"]), int(record["shard_size"])
    plan = Plan([(int(low), int(high)) for low, high in record["remaining"]], int(record["world"]), size)
    consumed = []
    for rank in range(plan.world if plan.remaining else 0):
        progress = store.get_record(progress_key(epoch, attempt, rank))
        stretch = plan.share(rank)[1]
        consumed.append(int(progress.get("consumed", 0)) if progress.get("final") or not passed else stretch)
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
