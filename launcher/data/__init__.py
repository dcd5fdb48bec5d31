"""Dynamic data sharding for elastic runs: every index of an epoch trained exactly once, whatever nodes come
and go (docs/data.md). Use ``ElasticSampler`` instead of ``DistributedSampler``, read it through
``ElasticLoader`` (a ``DataLoader``), and keep ``sampler.state_dict()`` in the checkpoint with the model.
``report(step, **metrics)`` tells the node's health sampler how far a loop that uses neither has come
(launcher.data.rankprogress).

The three are imported on first use: ``launcher status`` and ``launcher data`` read the progress records
(launcher.data.progress) without importing torch."""

from __future__ import annotations

from typing import Any

__all__ = ["ElasticLoader", "ElasticSampler", "report"]


def __getattr__(name: str) -> Any:
    if name == "ElasticLoader":
        from launcher.data.loader import ElasticLoader

        return ElasticLoader
    if name == "ElasticSampler":
        from launcher.data.sampler import ElasticSampler

        return ElasticSampler
    if name == "report":
        from launcher.data.rankprogress import report

        return report
    raise AttributeError(f"module 'launcher.data' has no attribute {name!r}")
