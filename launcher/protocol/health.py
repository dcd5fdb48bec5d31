"""The node's health record, ``health/{node}.json``: what its machine and its training processes did, sampled
about every :data:`SAMPLE_SECONDS`, so that ``launcher top``, ``status --json``, ``watch`` and the timeline can
tell whether a run uses its machines and which rank holds the others back.

One sample (a plain dict, every figure optional but ``at``)::

    {"at": unix time,
     "cpu_percent": CPU used by the node's processes (the node, torchrun, the ranks and their children),
                    in percent of one core, over the last interval,
     "rss_bytes": their resident memory, "mem_available_bytes": the machine's, "mem_total_bytes": the machine's,
     "cores": the cores this node may use,
     "gpus": [{"index", "name", "util_percent", "mem_used_bytes", "mem_total_bytes", "power_watts", "temp_c"}],
     "ranks": {"<global rank>": {"local": local rank, "pid": its process,
                                 "cpu_percent", "rss_bytes",
                                 "steps": steps so far, "samples": samples so far (where a loader counts them),
                                 "steps_per_s", "samples_per_s": over the last interval,
                                 "work_per_step_s": the rank's own work per step (CPU time and time waiting for
                                     data, not time waiting for the others in collectives) over the last
                                     :data:`WINDOW_SECONDS`,
                                 "data_wait_fraction": the share of that window spent waiting for data,
                                 "throttled_fraction": the share of that window a CPU quota held the rank's
                                     cgroup back (where the node can read its cgroup's cpu.stat),
                                 "window_s": the seconds that window really spans (a rank is comparable with
                                     the others once it is at least 0.9 x ``window_seconds``),
                                 "step_source": "report" | "optimizer" | "loader",
                                 "metrics": what the script passed to launcher.data.report,
                                 "last_line_at": unix time of the rank's last output line,
                                 "gpu": the ``index`` (in ``gpus``) of the GPU it computes on, where the node can tell}},
     "window_seconds": the window the node measures work per step over (LAUNCHER_HEALTH_WINDOW)}

The node samples every ``LAUNCHER_HEALTH_SAMPLE`` seconds (default :data:`SAMPLE_SECONDS`); its environment
gives both variables (the local backend's nodes inherit the client's).

The record is ``{"node", "incarnation", "interval", "latest": the newest sample whole, "samples": [oldest ..
newest], "starts": [[incarnation, time of its first sample], ...]}``. A replacement (incarnation n > 0) carries
the samples of the starts of its node before it on, as one series with them: ``starts`` says where each begins,
and the bound below is the whole series'. Each of ``samples`` keeps only the figures drawn over time (:data:`SERIES_FIGURES`,
:data:`SERIES_GPU_FIGURES`, :data:`SERIES_RANK_FIGURES`), bounded over a long run (:func:`downsample`): a node
with 8 ranks on 8 GPUs keeps at most about 540 kB however long it runs. It is rewritten whole: after every sample on a local work dir, at most every
:data:`STORE_SERIES_SECONDS` on object stores (which bill requests); there the latest sample also rides on the
status heartbeat (``status["health"]``), which is written anyway, so readers take the newer of the two
(:func:`latest_sample`).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from launcher.protocol.store import StoreError, WorkDir

HEALTH_PREFIX = "health"
SAMPLE_SECONDS = 5.0
WINDOW_SECONDS = 60.0  # the window a rank's own work per step is measured over (straggler detection)
STORE_SERIES_SECONDS = 30.0
RECENT_SAMPLES = 120  # kept at full resolution: the last 10 minutes
MAX_SAMPLES = 240  # older samples are thinned to stay within this many

Sample = dict[str, Any]

# what each sample of the series keeps (the latest keeps everything)
SERIES_FIGURES = ("at", "cpu_percent", "cores", "rss_bytes", "mem_available_bytes")
SERIES_GPU_FIGURES = ("index", "util_percent", "mem_used_bytes")
SERIES_RANK_FIGURES = ("steps", "step_source", "steps_per_s", "samples_per_s", "cpu_percent", "work_per_step_s",
                       "metrics")


def health_key(node: str) -> str:
    return f"{HEALTH_PREFIX}/{node}.json"


def downsample(samples: list[Sample], recent: int = RECENT_SAMPLES, limit: int = MAX_SAMPLES) -> list[Sample]:
    """``samples`` (oldest first) within ``limit``: the newest ``recent`` as they are, every other one of the older
    ones dropped until they fit, so old stretches keep their shape at a coarser step."""
    if len(samples) <= limit:
        return samples
    older, newer = samples[:-recent], samples[-recent:]
    while len(older) + len(newer) > limit:
        older = older[::2] if len(older) > 1 else []
    return older + newer


def compact(sample: Sample) -> Sample:
    """``sample`` with only the figures the series keeps."""
    kept: Sample = {name: sample[name] for name in SERIES_FIGURES if name in sample}
    if isinstance(sample.get("gpus"), list):
        kept["gpus"] = [{name: gpu[name] for name in SERIES_GPU_FIGURES if name in gpu}
                        for gpu in sample["gpus"] if isinstance(gpu, dict)]
    if isinstance(sample.get("ranks"), dict):
        kept["ranks"] = {rank: {name: figures[name] for name in SERIES_RANK_FIGURES if name in figures}
                         for rank, figures in sample["ranks"].items() if isinstance(figures, dict)}
    return kept


def latest_sample(status: dict[str, Any] | None, series: dict[str, Any] | None) -> Sample | None:
    """The newest sample a node wrote: in its status heartbeat or in its health record."""
    candidates = []
    if status and isinstance(status.get("health"), dict):
        candidates.append(status["health"])
    if series and isinstance(series.get("latest"), dict):
        candidates.append(series["latest"])
    candidates = [sample for sample in candidates if isinstance(sample, dict)
                  and isinstance(sample.get("at"), (int, float))]
    return max(candidates, key=lambda sample: sample["at"]) if candidates else None


def incarnation_series(record: dict[str, Any]) -> list[tuple[int, list[Sample]]]:
    """``record``'s samples split by the start of its node that took them, oldest first: (incarnation, samples)."""
    samples = [sample for sample in record.get("samples") or [] if isinstance(sample, dict)
               and isinstance(sample.get("at"), (int, float)) and not isinstance(sample["at"], bool)]
    starts = sorted((start for start in record.get("starts") or [] if isinstance(start, list) and len(start) == 2
                     and isinstance(start[0], int) and isinstance(start[1], (int, float))), key=lambda start: start[1])
    if not starts:
        incarnation = record.get("incarnation")
        return [(incarnation if isinstance(incarnation, int) else 0, samples)] if samples else []
    found = []
    for index, (incarnation, begins) in enumerate(starts):
        ends = starts[index + 1][1] if index + 1 < len(starts) else float("inf")
        own = [sample for sample in samples if begins <= sample["at"] < ends]
        if own:
            found.append((incarnation, own))
    return found


def read_series(store: WorkDir, node: str) -> dict[str, Any] | None:
    """A node's health record; None when it wrote none (yet) or it cannot be read."""
    try:
        record = store.get_record(health_key(node))
    except StoreError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("samples"), list) else None


class HealthRecord:
    """The node's writer of its health record."""

    def __init__(self, store: WorkDir, node: str, incarnation: int = 0, interval: float = SAMPLE_SECONDS):
        self.store = store
        self.node = node
        self.incarnation = incarnation
        self.interval = interval
        self.latest: Sample | None = None
        self.samples: list[Sample] = []  # compacted, the earlier starts' first
        self.starts: list[list[float]] = []
        if incarnation > 0:  # a replacement: the samples of the starts before it stay in the record
            earlier = read_series(store, node) or {}
            if isinstance(earlier.get("incarnation"), int) and earlier["incarnation"] < incarnation:
                self.samples = [sample for _, samples in incarnation_series(earlier) for sample in samples]
                self.starts = [[number, samples[0]["at"]] for number, samples in incarnation_series(earlier)]
        self._lock = threading.Lock()
        self._written_at = float("-inf")
        self._unwritten = False

    def add(self, sample: Sample) -> None:
        """Keep ``sample``; write the record when it is due (always on a local work dir)."""
        with self._lock:
            if not self.starts or self.starts[-1][0] != self.incarnation:
                self.starts.append([self.incarnation, sample["at"]])
            self.latest = sample
            self.samples = downsample([*self.samples, compact(sample)])
            self._unwritten = True
            due = self.store.is_local or time.monotonic() - self._written_at >= STORE_SERIES_SECONDS
        if due:
            self.flush()

    def flush(self) -> None:
        """Write what was not written yet (the node ends); a store error waits for the next write."""
        with self._lock:
            if not self._unwritten:
                return
            body = {"node": self.node, "incarnation": self.incarnation, "interval": self.interval,
                    "latest": self.latest, "samples": self.samples, "starts": self.starts}
            data = json.dumps(body).encode()
            self._unwritten = False
            self._written_at = time.monotonic()
        try:
            self.store.put(health_key(self.node), data)
        except StoreError:
            with self._lock:
                self._unwritten = True
