"""Dynamic data sharding for elastic runs: every index of an epoch trained exactly once, whatever nodes come
and go (docs/data.md). Use ``ElasticSampler`` instead of ``DistributedSampler``, read it through
``ElasticLoader`` (a ``DataLoader``), and keep ``sampler.state_dict()`` in the checkpoint with the model."""

from launcher.data.loader import ElasticLoader
from launcher.data.sampler import ElasticSampler

__all__ = ["ElasticLoader", "ElasticSampler"]
