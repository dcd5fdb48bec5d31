"""How one attempt (a start of the training processes) splits what an epoch has left among its ranks.

Each rank gets one contiguous stretch of the untrained positions, and every rank the same number of steps:
a DDP loop then never waits on a rank that ran out of data, so no ``Join`` and no per-step collective is
needed. The split is a pure function of (what is left, world size): every rank computes the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.data.intervals import Interval, complement, normalize, take, total


class TooFewSamples(RuntimeError):
    """Fewer untrained samples than ranks: some rank would have no batch for a step the others take."""


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The same permutation on every rank (DistributedSampler's: ``randperm`` seeded with seed + epoch)."""
    if not shuffle:
        return list(range(size))
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(size, generator=generator).tolist()


def batch_sizes(count: int, steps: int) -> list[int]:
    """``count`` samples spread over ``steps`` batches as evenly as possible, larger ones first."""
    base, extra = divmod(count, steps) if steps else (0, 0)
    return [base + 1] * extra + [base] * (steps - extra)


@dataclass(frozen=True)
class Plan:
    remaining: list[Interval]  # the epoch's untrained positions, in order
    world: int
    size: int  # the epoch's positions, trained or not

    @property
    def left(self) -> int:
        return total(self.remaining)

    def share(self, rank: int) -> tuple[int, int]:
        """(first, count): rank's stretch, as offsets into the sequence of remaining positions."""
        base, extra = divmod(self.left, self.world)
        return rank * base + min(rank, extra), base + (1 if rank < extra else 0)

    def steps(self, batch_size: int) -> int:
        """Steps every rank takes: as few as batches of ``batch_size`` allow, and at least one sample each."""
        left = self.left
        if left == 0:
            return 0
        if left < self.world and left == self.size:
            raise TooFewSamples(
                f"the dataset has {left} samples for {self.world} training processes: every process needs at least "
                f"one sample per step. Train it with at most {left} processes")
        if left < self.world:
            raise TooFewSamples(
                f"{left} samples of this epoch are left for {self.world} training processes (the checkpoint holds "
                f"the other {self.size - left} as trained): every process must take the same number of steps with "
                f"at least one sample each. Resume with at most {left} processes, or let the epoch finish before "
                f"the run grows")
        return min(-(-left // (self.world * batch_size)), left // self.world)

    def batches(self, rank: int, batch_size: int) -> list[int]:
        return batch_sizes(self.share(rank)[1], self.steps(batch_size))

    def trained(self, rank: int, consumed: int) -> list[Interval]:
        """The positions ``rank`` trained after the loop consumed ``consumed`` of its stretch."""
        first, count = self.share(rank)
        return take(self.remaining, first, min(consumed, count))

    def done(self, consumed: list[int]) -> list[Interval]:
        """The epoch's trained positions once each rank consumed ``consumed[rank]`` of its stretch."""
        trained = complement(self.remaining, self.size)
        for rank, count in enumerate(consumed):
            trained += self.trained(rank, count)
        return normalize(trained)
