"""``ElasticLoader``: a DataLoader that tells its ElasticSampler which batches reached the training loop."""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader

from launcher.data.sampler import ElasticSampler


class ElasticLoader(DataLoader):
    """``DataLoader`` with the same arguments; ``sampler`` must be an ElasticSampler.

    A DataLoader prefetches (``num_workers * prefetch_factor`` batches), so what the sampler handed out is
    more than what was trained. Batches come back in order and all but the last are full, so after the
    loop received ``n`` batches exactly the first ``n * batch_size`` handed-out indices (capped at what was
    handed out) were consumed: that is what ``sampler.state_dict()`` records.
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any):
        super().__init__(dataset, *args, **kwargs)
        if not isinstance(self.sampler, ElasticSampler):
            raise ValueError("ElasticLoader needs sampler=ElasticSampler(...)")
        if self.batch_size is None:
            raise ValueError("ElasticLoader needs batch_size (a batch_sampler would hide which indices were trained)")
        if self.drop_last:
            raise ValueError("ElasticLoader cannot drop_last: the indices of a dropped batch are claimed and "
                             "never trained, so the epoch would miss them")
        if not getattr(self, "in_order", True):
            raise ValueError("ElasticLoader needs in_order=True: consumption is counted in the order handed out")
        self.sampler.counted = True

    def __iter__(self) -> Iterator[Any]:
        sampler: ElasticSampler = self.sampler  # type: ignore[assignment]
        for batch in super().__iter__():
            sampler.note_batch(self.batch_size)  # type: ignore[arg-type]
            yield batch
