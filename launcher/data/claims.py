"""Claims of one epoch in one attempt: create-if-absent of ``data/{epoch:05d}/{attempt}/claims/{unit}``.

Exactly one rank wins each unit because the store's create-if-absent is atomic (local link, S3 and OCI
If-None-Match). A create that the store performed but whose answer was lost is retried by WorkDir and
then reads "exists": the claim holds this claimer's token, so reading it back tells a win from a loss.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any, Iterator

from launcher.node.store import WorkDir


def attempt_prefix(epoch: int, attempt: str) -> str:
    return f"data/{epoch:05d}/{attempt}"


class Claims:
    """Claims in a run's work dir (any WorkDir: directory, s3://, oci://)."""

    def __init__(self, store: WorkDir, epoch: int, attempt: str, rank: int):
        self.store = store
        self.prefix = attempt_prefix(epoch, attempt)
        self.token = f"{rank} {uuid.uuid4().hex}".encode()

    def announce(self, manifest: dict[str, Any]) -> None:
        """Record what this attempt hands out (equal on every rank; the first writer wins)."""
        self.store.create(f"{self.prefix}/units.json", json.dumps(manifest).encode())

    def claim(self, unit: str) -> bool:
        key = f"{self.prefix}/claims/{unit}"
        if self.store.create(key, self.token):
            return True
        return not self.store.is_local and self.store.get(key) == self.token

    def claimed(self) -> set[str]:
        return set(self.store.list(f"{self.prefix}/claims"))

    def done(self, unit: str) -> None:
        self.store.put(f"{self.prefix}/done/{unit}", self.token)


class MemoryClaims:
    """One process alone (no work dir): every unit is its own; nothing to record."""

    def __init__(self) -> None:
        self._taken: set[str] = set()
        self._lock = threading.Lock()

    def announce(self, manifest: dict[str, Any]) -> None:
        pass

    def claim(self, unit: str) -> bool:
        with self._lock:
            if unit in self._taken:
                return False
            self._taken.add(unit)
            return True

    def claimed(self) -> set[str]:
        with self._lock:
            return set(self._taken)

    def done(self, unit: str) -> None:
        pass


def claim_order(units: list[str], rank: int, world: int) -> tuple[list[str], list[str]]:
    """(own, steal): a rank first takes its own contiguous stripe front to back, then the other ranks'
    stripes back to front, starting with the next rank's, so a thief meets each owner only once."""
    bounds = [len(units) * i // world for i in range(world + 1)]
    stripes = [units[bounds[i]:bounds[i + 1]] for i in range(world)]
    own = stripes[rank % world]
    steal = [unit for step in range(1, world) for unit in reversed(stripes[(rank + step) % world])]
    return own, steal


def claim_all(claims: Claims | MemoryClaims, units: list[str], rank: int, world: int) -> Iterator[str]:
    """The units this rank wins, lazily (a caller that stops asking stops claiming). One pass suffices:
    every unit is tried once, and a failed try means another rank holds it."""
    own, steal = claim_order(units, rank, world)
    for unit in own:
        if claims.claim(unit):
            yield unit
    if not steal:
        return
    taken = claims.claimed()  # one listing instead of a failed create per unit already taken
    for unit in steal:
        if unit not in taken and claims.claim(unit):
            yield unit
