"""One rank's part of one epoch in one attempt: a background claimer, the log of what was handed out,
and what the training loop consumed of it."""

from __future__ import annotations

import queue
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator

from launcher.data.claims import Claims, MemoryClaims, claim_all
from launcher.data.shards import encode, remaining_units, shard_length, unit_name

_END = object()


class EpochRun:
    def __init__(self, *, epoch: int, order: list[int], base: dict[int, int], size: int, shard_size: int,
                 claims: Claims | MemoryClaims, rank: int, world: int, prefetch: int):
        self.epoch = epoch
        self.order = order
        self.base = base
        self.size, self.shard_size = size, shard_size
        self.claims = claims
        self.rank, self.world = rank, world
        self.units = {unit_name(k, o): (k, o) for k, o in remaining_units(size, shard_size, base)}
        self.queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self.stopping = threading.Event()
        self.log: list[list[int]] = []  # [shard, offset, handed out] per unit, in the order handed out
        self.yielded = 0
        self.consumed = 0
        self.steps = 0  # batches the loop received (ElasticLoader)
        self.exhausted = False  # no unit left to claim and all handed out
        self.counted = False
        self._marked = 0  # units of the log marked done
        self._marked_end = 0  # handed-out positions up to the end of those units
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastic-sampler-done")
        self._writes: list[Future] = []
        self._thread = threading.Thread(target=self._claim, name="elastic-sampler-claims", daemon=True)
        self._thread.start()

    # -- the claimer thread ------------------------------------------------------------------
    def _claim(self) -> None:
        try:
            self.claims.announce({"size": self.size, "shard_size": self.shard_size,
                                  **encode(self.base, size=self.size, shard_size=self.shard_size)})
            for name in claim_all(self.claims, list(self.units), self.rank, self.world):
                if not self._put(self.units[name]) or self.stopping.is_set():
                    return
            self._put(_END)
        except BaseException as exc:  # handed to the training loop, which raises it
            self._put(exc)

    def _put(self, item: Any) -> bool:
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    # -- the training loop's side ----------------------------------------------------------
    def indices(self, counted: bool) -> Iterator[int]:
        """Every index of every unit this rank claims, unit after unit. Not ``counted``: what was handed out
        counts as consumed (exact for a DataLoader without workers: it asks for a batch's indices as the loop
        asks for the batch)."""
        self.counted = counted
        while not self.exhausted:
            item = self.queue.get()
            if item is _END:
                self.exhausted = True
                if not counted:
                    self.consume(self.yielded)
                return
            if isinstance(item, BaseException):
                raise RuntimeError(f"ElasticSampler could not claim data for epoch {self.epoch}: {item}") from item
            if not counted:
                self.consume(self.yielded)  # what came before is done: the loop asked for more
            shard, offset = item
            entry = [shard, offset, 0]
            self.log.append(entry)
            first = shard * self.shard_size
            for position in range(first + offset, first + shard_length(self.size, self.shard_size, shard)):
                entry[2] += 1
                self.yielded += 1
                yield self.order[position]

    def consume(self, total: int) -> None:
        """The loop has trained the first ``total`` indices handed out; mark units done as they complete."""
        self.consumed = min(total, self.yielded)
        while self._marked < len(self.log):
            shard, offset, handed = self.log[self._marked]
            end = self._marked_end + handed
            full = offset + handed == shard_length(self.size, self.shard_size, shard)
            if not full or self.consumed < end:
                return
            self._marked += 1
            self._marked_end = end
            self._writes.append(self._writer.submit(self.claims.done, unit_name(shard, offset)))

    def offsets(self) -> dict[int, int]:
        """Offsets of the shards this rank claimed and started, after what the loop consumed."""
        left = self.consumed if self.counted else self.yielded
        result: dict[int, int] = {}
        for shard, offset, handed in self.log:
            taken = min(left, handed)
            left -= taken
            result[shard] = offset + taken
        return result

    def close(self) -> None:
        """Stop claiming and wait for the done markers (informational, but `launcher data` reads them)."""
        self.stopping.set()
        while self._thread.is_alive():  # unblock a claimer waiting for room in the queue
            try:
                self.queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.01)
        self._writer.shutdown(wait=True)
        failed = [write.exception() for write in self._writes if write.exception() is not None]
        if failed:  # progress only: the claims and the checkpoint are what training relies on
            warnings.warn(f"ElasticSampler: {len(failed)} done markers of epoch {self.epoch} were not written "
                          f"(`launcher data` will show those units in flight): {failed[0]}", stacklevel=3)
