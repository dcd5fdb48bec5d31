"""An epoch's order and its shards, and the progress of an epoch as shard offsets: pure data, no I/O.

Shard ``k`` is positions ``[k*S, (k+1)*S)`` of the epoch's order (the last one may be shorter). Progress
is, per shard, how many of its leading positions were trained ("offset"); a unit of work is the rest of
one shard, ``[offset, length)``, named ``f"{shard}-{offset}"``.
"""

from __future__ import annotations

from typing import Any

STATE_VERSION = 1


def shard_count(size: int, shard_size: int) -> int:
    return -(-size // shard_size)


def shard_length(size: int, shard_size: int, shard: int) -> int:
    return min(shard_size, size - shard * shard_size)


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The same permutation on every rank (DistributedSampler's: ``randperm`` seeded with seed + epoch)."""
    if not shuffle:
        return list(range(size))
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(size, generator=generator).tolist()


def unit_name(shard: int, offset: int) -> str:
    return f"{shard}-{offset}"


def remaining_units(size: int, shard_size: int, offsets: dict[int, int]) -> list[tuple[int, int]]:
    """(shard, offset) of every shard not completely trained, in shard order."""
    return [(k, offsets.get(k, 0)) for k in range(shard_count(size, shard_size))
            if offsets.get(k, 0) < shard_length(size, shard_size, k)]


def encode(offsets: dict[int, int], *, size: int, shard_size: int) -> dict[str, Any]:
    """Offsets as complete shards in ``[start, end)`` ranges and partial shards by offset (JSON-safe, small)."""
    done: list[list[int]] = []
    partial: dict[str, int] = {}
    for shard in sorted(offsets):
        offset = offsets[shard]
        if offset >= shard_length(size, shard_size, shard):
            if done and done[-1][1] == shard:
                done[-1][1] = shard + 1
            else:
                done.append([shard, shard + 1])
        elif offset > 0:
            partial[str(shard)] = offset
    return {"done": done, "partial": partial}


def decode(state: dict[str, Any], *, size: int, shard_size: int) -> dict[str, int]:
    offsets = {int(k): int(v) for k, v in state.get("partial", {}).items()}
    for start, end in state.get("done", []):
        for shard in range(start, end):
            offsets[shard] = shard_length(size, shard_size, shard)
    return offsets


def complete(offsets: dict[int, int], *, size: int, shard_size: int) -> bool:
    return not remaining_units(size, shard_size, offsets)
