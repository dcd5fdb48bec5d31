"""The nodes' health records (:mod:`launcher.protocol.health`) as the timeline draws them: per record, the node's
CPU (in percent of the cores it may use) and mean GPU utilisation over time, and each rank's steps per second.

A figure a sample lacks (no GPUs, no ``cores``, a rank not running then) is None, and a drawn line breaks there
rather than bridging what was not measured. Each record read stays a series of its own (one per attempt of a run
retried whole), so a line never joins two attempts either. :func:`utilisation` is pure; damaged samples are left out.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from launcher.protocol.health import incarnation_series, read_series
from launcher.protocol.store import WorkDir

Point = tuple[float, float | None, float | None]  # (unix time, CPU % of the node's cores, mean GPU util %)
RankPoint = tuple[float, float | None]  # (unix time, steps/s)


@dataclass(frozen=True)
class Utilisation:
    """One health record of one node, as drawn."""

    node: str
    points: list[Point]  # by time
    steps_per_s: dict[int, list[RankPoint]]  # global rank -> its steps/s, from its first sample to its last
    attempt: int = 1
    incarnation: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "incarnation": self.incarnation,
                "series": [[at, _rounded(cpu), _rounded(gpu)] for at, cpu, gpu in self.points],
                "steps_per_s": {str(rank): [[at, _rounded(value)] for at, value in points]
                                for rank, points in sorted(self.steps_per_s.items())}}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cpu_of_cores(sample: dict[str, Any]) -> float | None:
    """The node's CPU use in percent of the cores it may use (``cpu_percent`` counts one core as 100)."""
    cpu, cores = _number(sample.get("cpu_percent")), _number(sample.get("cores"))
    return cpu / cores if cpu is not None and cores else None


def mean_gpu(sample: dict[str, Any]) -> float | None:
    """The mean utilisation of the node's GPUs that report one; None on a node without GPUs."""
    gpus = sample.get("gpus")
    figures = [_number(gpu.get("util_percent")) for gpu in gpus if isinstance(gpu, dict)] if isinstance(gpus,
                                                                                                         list) else []
    known = [figure for figure in figures if figure is not None]
    return fmean(known) if known else None


def _rank_steps(sample: dict[str, Any]) -> dict[int, float | None]:
    ranks = sample.get("ranks")
    if not isinstance(ranks, dict):
        return {}
    return {int(rank): _number(entry.get("steps_per_s")) for rank, entry in ranks.items()
            if isinstance(rank, str) and rank.isdigit() and isinstance(entry, dict)}


def utilisations(node: str, record: dict[str, Any], attempt: int = 1) -> list[Utilisation]:
    """What ``record`` (a node's health record) draws: one per start of the node that took samples (a replaced
    node's earlier starts' stay in its record), oldest first; none where it holds no usable sample."""
    return [_drawn(node, sorted(samples, key=lambda sample: sample["at"]), attempt, incarnation)
            for incarnation, samples in incarnation_series(record)]


def _drawn(node: str, samples: list[dict[str, Any]], attempt: int, incarnation: int) -> Utilisation:
    points = [(float(sample["at"]), cpu_of_cores(sample), mean_gpu(sample)) for sample in samples]
    per_sample = [_rank_steps(sample) for sample in samples]
    steps: dict[int, list[RankPoint]] = {}
    for rank in sorted({rank for figures in per_sample for rank in figures}):
        present = [index for index, figures in enumerate(per_sample) if rank in figures]
        steps[rank] = [(points[index][0], per_sample[index].get(rank))  # None between: not running then
                       for index in range(present[0], present[-1] + 1)]
    return Utilisation(node, points, steps, attempt, incarnation)


def read_utilisation(store: WorkDir, nodes: list[str], attempt: int = 1) -> list[Utilisation]:
    """The health records of ``nodes`` in one attempt's namespace, as drawn; nodes without one are left out."""
    with ThreadPoolExecutor(max_workers=8) as pool:  # one GET per node: side by side on an object store
        records = list(pool.map(lambda node: read_series(store, node), nodes))
    return [drawn for node, record in zip(nodes, records) if record for drawn in utilisations(node, record, attempt)]
