"""One rank's part of one epoch in one attempt: its stretch of the untrained positions, in batches, and how
much of it the training loop consumed."""

from __future__ import annotations

from typing import Iterator

from launcher.data.plan import Plan, TooFewSamples
from launcher.data.records import Recorder, plan_key, plan_record, progress_key, progress_record


class EpochRun:
    def __init__(self, *, epoch: int, attempt: str, shard_size: int, order: list[int], plan: Plan, rank: int,
                 recorder: Recorder | None):
        self.epoch, self.attempt, self.shard_size = epoch, attempt, shard_size
        self.order = order
        self.plan = plan
        self.rank = rank
        self.count = plan.share(rank)[1]
        self.recorder = recorder
        self.sizes: list[int] = []  # the batches handed out, in order (ElasticLoader)
        self.handed_out = 0  # indices handed out
        self.steps = 0  # batches the loop received (ElasticLoader)
        self.consumed = 0  # indices the loop trained
        self.counted = False  # consumption is counted by the loop, not assumed from what was handed out
        self.iterated = False
        self.closed = False
        if recorder is not None:
            recorder.watch(progress_key(epoch, attempt, rank),
                           lambda: progress_record(self.consumed, self.count, final=self.closed))

    def _indices(self) -> list[int]:
        return [index for low, high in self.plan.trained(self.rank, self.count) for index in self.order[low:high]]

    def indices(self) -> Iterator[int]:
        """This rank's indices one by one (a DataLoader with ``sampler=``, one process): what is handed out
        counts as trained, which is exact when the DataLoader has no workers to prefetch."""
        self._start_iterating()
        self._record_plan()
        for index in self._indices():
            self.handed_out = self.consumed = self.handed_out + 1
            yield index

    def batches(self, batch_size: int) -> Iterator[list[int]]:
        """This rank's indices in batches, as many as every other rank gets (ElasticLoader)."""
        self._start_iterating()
        self.counted = True
        try:
            sizes = self.plan.batches(self.rank, batch_size)
        except TooFewSamples as exc:
            raise TooFewSamples(f"ElasticSampler, epoch {self.epoch}: {exc}") from None
        self._record_plan(batch_size, len(sizes))
        indices = self._indices()
        for size in sizes:
            self.sizes.append(size)
            start, self.handed_out = self.handed_out, self.handed_out + size
            yield indices[start:start + size]

    def _start_iterating(self) -> None:
        if self.iterated:
            raise RuntimeError(f"ElasticSampler: epoch {self.epoch} was already iterated; call sampler.set_epoch() "
                               f"with the next epoch (or loop over sampler.epochs(...)) before iterating again")
        self.iterated = True

    def note_batch(self) -> None:
        """The loop received the next batch handed out."""
        self.consumed += self.sizes[self.steps]
        self.steps += 1

    def close(self) -> None:
        """The epoch is over for this rank (or abandoned): its progress record gets its last value, marked final
        (the count can no longer grow, so `launcher data` takes it as it is)."""
        self.closed = True
        if self.recorder is not None:
            self.recorder.unwatch(progress_key(self.epoch, self.attempt, self.rank))

    def _record_plan(self, batch_size: int | None = None, steps: int | None = None) -> None:
        if self.recorder is None or self.rank != 0:
            return
        self.recorder.create(plan_key(self.epoch, self.attempt), plan_record(
            size=len(self.order), shard_size=self.shard_size, world=self.plan.world, remaining=self.plan.remaining,
            batch_size=batch_size, steps=steps))
