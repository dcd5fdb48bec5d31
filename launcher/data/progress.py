"""Each epoch's progress as the work dir records it (for `launcher data`): the newest attempt's units done,
claimed and not done (in flight), and not claimed (left), counted in shards."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from launcher.data.claims import attempt_prefix
from launcher.data.shards import decode, remaining_units, shard_count, unit_name
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
    """Every recorded epoch's progress, oldest first; with ``latest_only`` only the newest epoch's (one read)."""
    epochs = sorted(int(name) for name in store.list("data") if name.isdigit())
    found = []
    for epoch in epochs[-1:] if latest_only else epochs:
        name = f"{epoch:05d}"
        attempts = [a for a in store.list(f"data/{name}") if _attempt_order(a) is not None]
        if attempts:
            progress = _attempt_progress(store, epoch, max(attempts, key=_attempt_order))
            if progress is not None:
                found.append(progress)
    return found


def _attempt_progress(store: WorkDir, epoch: int, attempt: str) -> EpochProgress | None:
    prefix = attempt_prefix(epoch, attempt)
    manifest = store.get_record(f"{prefix}/units.json")
    if not manifest:
        return None
    size, shard_size = int(manifest["size"]), int(manifest["shard_size"])
    units = {unit_name(k, o) for k, o in remaining_units(size, shard_size, decode(manifest, size=size,
                                                                                   shard_size=shard_size))}
    shards = shard_count(size, shard_size)
    claimed = set(store.list(f"{prefix}/claims")) & units
    done = set(store.list(f"{prefix}/done")) & units
    done_total = shards - len(units) + len(done)
    in_flight = len(claimed - done)
    return EpochProgress(epoch, attempt, shards, done_total, in_flight, shards - done_total - in_flight)
