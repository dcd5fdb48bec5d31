"""How a run uses its machines, as ``launcher top``, ``status`` and ``watch`` show it: each node's and each rank's
latest figures (from the nodes' health samples, :mod:`launcher.protocol.health`) and the ranks that hold the others
back.

Stragglers: in synchronous training every rank's step lasts as long as the slowest's, so steps/s cannot tell who is
slow; each rank's own work per step can (its CPU time and data waits, not its waits for the others in collectives).
Among the ranks of the nodes still training whose work was measured over (about) a whole window, a rank whose own
work per step is at least :data:`STRAGGLER_RATIO` times the median of theirs is a straggler.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from launcher.protocol.health import (SAMPLE_SECONDS, WINDOW_SECONDS, Sample, incarnation_series, latest_sample,
                                      read_series)
from launcher.protocol.status import FINAL_STATES
from launcher.protocol.store import WorkDir
from launcher.runs.view import RunView

STRAGGLER_RATIO = 1.3  # own work per step against the median of all ranks'
SLOWEST_MARGIN = 1.1  # "slowest" only this far above the median: below it, the ranks differ by noise
COMPARABLE_WINDOW = 0.9  # a rank's work is compared once measured over this share of its node's window
DATA_WAIT_SHARE = 0.3  # a straggler that waits this share of its window for data: "waiting on data"
THROTTLED_SHARE = 0.1  # a straggler whose cgroup a CPU quota held back this share of its window: "CPU-throttled"
LESS_BUSY_GPU = 0.8  # a straggler whose GPU is busy below this share of the others' median: "a GPU less busy"
WAITING_ON_DATA = "waiting on data"
LESS_BUSY = "a GPU less busy than its peers"
CPU_BOUND = "CPU-bound"
CPU_THROTTLED = "CPU-throttled (a cgroup CPU quota held it back {share:.0%} of the time)"


@dataclass
class NodeHealth:
    """A node's state (its status record's) and its latest sample, if it wrote one; where its health record was
    read, the samples it holds of each start of the node (a replaced node's earlier ones too)."""
    node: str
    state: str
    sample: Sample | None
    history: list[dict[str, Any]] = field(default_factory=list)
    restarted: bool = False  # started again since its newest sample, which is its predecessor's and not shown

    def figure(self, name: str) -> Any:
        return (self.sample or {}).get(name)

    @property
    def gpus(self) -> list[dict[str, Any]]:
        gpus = self.figure("gpus")
        return [gpu for gpu in gpus if isinstance(gpu, dict)] if isinstance(gpus, list) else []

    def as_dict(self) -> dict[str, Any]:
        """The figures ``status --json`` adds to the node's record."""
        return {"health_at": self.figure("at"), "cpu_percent": self.figure("cpu_percent"),
                "rss_bytes": self.figure("rss_bytes"), "mem_available_bytes": self.figure("mem_available_bytes"),
                "mem_total_bytes": self.figure("mem_total_bytes"), "gpus": self.gpus, "health_history": self.history}


@dataclass
class RankHealth:
    """A training process's latest figures (its entry in its node's sample)."""
    rank: int
    node: str
    state: str  # its node's
    figures: dict[str, Any]
    gpu: dict[str, Any] | None  # the entry of its node's ``gpus`` it uses, where the node could tell
    comparable: bool  # its work per step was measured over (about) a whole window

    def figure(self, name: str) -> Any:
        value = self.figures.get(name)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def gpu_util(self) -> float | None:
        util = (self.gpu or {}).get("util_percent")
        return util if isinstance(util, (int, float)) else None

    @property
    def training(self) -> bool:
        return self.state not in FINAL_STATES

    def as_dict(self) -> dict[str, Any]:
        """The rank's entry in ``status --json``'s ``ranks``."""
        names = ("cpu_percent", "rss_bytes", "steps", "samples", "steps_per_s", "samples_per_s", "work_per_step_s",
                 "data_wait_fraction", "throttled_fraction", "window_s", "last_line_at")
        source, metrics = self.figures.get("step_source"), self.figures.get("metrics")
        return {"rank": self.rank, "node": self.node, "state": self.state,
                **{name: self.figure(name) for name in names},
                "step_source": source if isinstance(source, str) else None,
                "metrics": {name: value for name, value in metrics.items() if isinstance(value, (int, float))}
                if isinstance(metrics, dict) else {},
                "gpu": None if self.gpu is None else self.gpu.get("index"), "gpu_util_percent": self.gpu_util}


@dataclass
class Straggler:
    rank: int
    node: str
    work_per_step_s: float
    median_s: float
    ratio: float
    suggests: str

    def line(self) -> str:
        """``straggler: rank 3 on node w-0 does 2.1x the median work per step (0.42 s vs 0.20 s): CPU-bound``."""
        return (f"straggler: rank {self.rank} on node {self.node} does {self.ratio:.1f}x the median work per step "
                f"({step_time(self.work_per_step_s)} vs {step_time(self.median_s)}): {self.suggests}")


@dataclass
class RunHealth:
    nodes: list[NodeHealth]
    ranks: list[RankHealth]  # in rank order
    stragglers: list[Straggler]
    slowest: int | None  # the training rank with the most own work per step, where it is above the median

    @property
    def sampled(self) -> bool:
        """Some node wrote a sample."""
        return any(node.sample is not None for node in self.nodes)

    def node(self, name: str) -> NodeHealth:
        return next(node for node in self.nodes if node.node == name)


def step_time(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 0.1 else f"{seconds * 1000:.1f} ms"


def assess(states: dict[str, str], samples: dict[str, Sample | None],
           histories: dict[str, list[dict[str, Any]]] | None = None,
           restarted: frozenset[str] = frozenset()) -> RunHealth:
    """Rows of each node (``states``: node -> state, in order) and of each rank its sample names, the slowest rank
    and the stragglers. ``restarted``: the nodes started again since their newest sample (given as None)."""
    nodes = [NodeHealth(name, state, samples.get(name), (histories or {}).get(name, []), name in restarted)
             for name, state in states.items()]
    ranks = sorted((rank for node in nodes for rank in _ranks(node)), key=lambda rank: rank.rank)
    return RunHealth(nodes, ranks, stragglers(ranks), _slowest(ranks))


def _slowest(ranks: list[RankHealth]) -> int | None:
    """The training rank with the most own work per step, where that is at least :data:`SLOWEST_MARGIN` times the
    median's, among the ranks measured over a whole window. Below the margin (3.9 ms against 3.8) the mark moved
    between ranks from one sample to the next and said nothing."""
    works = {rank.rank: work for rank in ranks if rank.training and rank.comparable
             and (work := rank.figure("work_per_step_s"))}
    if len(works) < 2:
        return None
    slowest = max(works, key=works.__getitem__)
    return slowest if works[slowest] >= SLOWEST_MARGIN * statistics.median(works.values()) else None


def _ranks(node: NodeHealth) -> list[RankHealth]:
    entries = node.figure("ranks")
    if not isinstance(entries, dict):
        return []
    window = node.figure("window_seconds")
    window = window if isinstance(window, (int, float)) and window > 0 else WINDOW_SECONDS
    gpus = {gpu.get("index"): gpu for gpu in node.gpus}
    found = []
    for key, figures in entries.items():
        if not (isinstance(key, str) and key.isdigit() and isinstance(figures, dict)):
            continue  # a damaged entry must not hide the others
        measured_over = figures.get("window_s")
        comparable = isinstance(measured_over, (int, float)) and measured_over >= COMPARABLE_WINDOW * window
        found.append(RankHealth(int(key), node.node, node.state, figures, gpus.get(figures.get("gpu")), comparable))
    return found


def stragglers(ranks: list[RankHealth]) -> list[Straggler]:
    """The training ranks whose own work per step is at least :data:`STRAGGLER_RATIO` times the median of all
    comparable ranks', each with what its figures suggest."""
    compared = [rank for rank in ranks if rank.training and rank.comparable
                and (rank.figure("work_per_step_s") or 0) > 0]
    if len(compared) < 2:
        return []
    median = statistics.median(rank.figure("work_per_step_s") for rank in compared)
    return [Straggler(rank.rank, rank.node, work, median, work / median, suggestion(rank, compared))
            for rank in compared if (work := rank.figure("work_per_step_s")) >= STRAGGLER_RATIO * median]


def suggestion(rank: RankHealth, peers: list[RankHealth]) -> str:
    """What a straggler's figures suggest: it waits on data, a CPU quota holds it back (its CPU share reads like its
    peers'), its GPU is less busy than the others' (its host side is slow to feed it), or else its own CPU work."""
    if (rank.figure("data_wait_fraction") or 0) >= DATA_WAIT_SHARE:
        return WAITING_ON_DATA
    throttled = rank.figure("throttled_fraction") or 0
    if throttled >= THROTTLED_SHARE and throttled > max((peer.figure("throttled_fraction") or 0 for peer in peers
                                                         if peer.rank != rank.rank), default=0):
        return CPU_THROTTLED.format(share=throttled)
    others = [peer.gpu_util for peer in peers if peer.rank != rank.rank and peer.gpu_util is not None]
    if rank.gpu_util is not None and others and rank.gpu_util < LESS_BUSY_GPU * statistics.median(others):
        return LESS_BUSY
    return CPU_BOUND


def node_state(view: RunView, node: str) -> str:
    if node in view.lost:
        return "lost"
    return view.statuses.get(node, {}).get("state") or "pending"


def _of_an_earlier_start(status: dict[str, Any] | None, sample: Sample | None,
                         starts: list[dict[str, Any]]) -> bool:
    """``sample`` was taken by an earlier start of the node than the one that wrote its status record (``starts``:
    its health record's :func:`history`)."""
    if sample is None or not status or sample == status.get("health") or not starts:
        return False  # a heartbeat's sample is always its writer's own
    current, sampled_by = status.get("incarnation"), starts[-1].get("incarnation")
    return isinstance(current, int) and isinstance(sampled_by, int) and sampled_by < current


def history(series: dict[str, Any]) -> list[dict[str, Any]]:
    """What a node's health record holds of each start of the node: its incarnation, first and last sample's time
    and how many samples (thinned over a long run) are kept."""
    return [{"incarnation": incarnation, "from": samples[0]["at"], "to": samples[-1]["at"], "samples": len(samples)}
            for incarnation, samples in incarnation_series(series)]


class HealthReader:
    """Reads each node's health record at most every ``every`` seconds: a node adds a sample about that often, and
    the record (whole, up to :data:`~launcher.protocol.health.MAX_SAMPLES` samples) costs far more to read and
    parse than the one sample it adds. The status heartbeat's sample, read anyway, is newer between reads where
    the node writes its record less often (object stores)."""

    def __init__(self, every: float = SAMPLE_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.every = every
        self.clock = clock
        self._series: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}

    def read(self, view: RunView, run: WorkDir) -> RunHealth:
        """Each node's newest sample of its current start: a replacement that has not sampled yet shows none of its
        predecessor's figures (a killed main's ``running 32%`` stayed on screen for seconds)."""
        samples, histories, restarted = {}, {}, set()
        for node in view.info.nodes:
            series = self._series_of(run, node)
            status = view.statuses.get(node)
            histories[node] = history(series) if series else []
            samples[node] = latest_sample(status, series)
            if _of_an_earlier_start(status, samples[node], histories[node]):
                samples[node] = None
                restarted.add(node)
        return assess({node: node_state(view, node) for node in view.info.nodes}, samples, histories,
                      frozenset(restarted))

    def _series_of(self, run: WorkDir, node: str) -> dict[str, Any] | None:
        now = self.clock()
        read_at, series = self._series.get((run.url, node), (float("-inf"), None))
        if now - read_at >= self.every:
            series = read_series(run, node)
            self._series[(run.url, node)] = (now, series)
        return series


class StragglerNotices:
    """Each straggler once per rank per attempt (the attempt's work dir), for a follower that polls."""

    def __init__(self, every: float = SAMPLE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        """``every``: how often each node's health record is read at most (a follower of many nodes: less often)."""
        self.reader = HealthReader(every, clock)
        self._said: set[tuple[str, int]] = set()

    def new(self, view: RunView, run: WorkDir) -> list[Straggler]:
        found = [straggler for straggler in self.reader.read(view, run).stragglers
                 if (run.url, straggler.rank) not in self._said]
        self._said.update((run.url, straggler.rank) for straggler in found)
        return found


def status_figures(health: RunHealth) -> dict[str, Any]:
    """What ``status --json`` carries beside the records: each rank's figures and the stragglers."""
    return {"ranks": [{**rank.as_dict(), "slowest": rank.rank == health.slowest} for rank in health.ranks],
            "stragglers": [asdict(straggler) for straggler in health.stragglers]}
