"""``ElasticLoader``: a DataLoader over an ElasticSampler that gives every rank the same number of batches
and tells the sampler which of them reached the training loop."""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader, Sampler

from launcher.data.sampler import ElasticSampler


class _EqualSteps(Sampler[list[int]]):
    """The batch sampler: the rank's stretch in the steps every rank takes."""

    def __init__(self, sampler: ElasticSampler, batch_size: int):
        self.sampler, self.batch_size = sampler, batch_size

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler.batches(self.batch_size)

    def __len__(self) -> int:
        return self.sampler.steps(self.batch_size)


class ElasticLoader(DataLoader):
    """``DataLoader(dataset, batch_size, sampler=ElasticSampler(...), ...)`` with DataLoader's other arguments.

    Batches hold ``batch_size`` samples or, near an epoch's end, slightly fewer: each rank's samples are
    spread over the steps all ranks take. A DataLoader prefetches (``num_workers * prefetch_factor``
    batches), so what the sampler handed out is more than what was trained; the loader counts the batches
    that reach the loop, and ``sampler.state_dict()`` records exactly those.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool | None = None,
                 sampler: ElasticSampler | None = None, **kwargs: Any):
        if not isinstance(sampler, ElasticSampler):
            raise ValueError("ElasticLoader needs sampler=ElasticSampler(...)")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"ElasticLoader needs batch_size >= 1, not {batch_size!r}")
        if shuffle:
            raise ValueError("ElasticLoader: shuffle=True conflicts with the sampler (ElasticSampler shuffles)")
        for name, why in (("batch_sampler", "the loader makes the batches (equal steps on every rank)"),
                          ("drop_last", "a dropped batch's indices would never be trained")):
            if kwargs.get(name):
                raise ValueError(f"ElasticLoader cannot take {name}: {why}")
        if kwargs.get("in_order") is False:
            raise ValueError("ElasticLoader needs in_order=True: consumption is counted in the order handed out")
        super().__init__(dataset, batch_sampler=_EqualSteps(sampler, batch_size), **kwargs)
        self.elastic_sampler = sampler
        sampler.counted = True

    def __iter__(self) -> Iterator[Any]:
        for batch in super().__iter__():
            self.elastic_sampler.note_batch()
            yield batch
