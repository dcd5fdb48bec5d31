"""The health record itself (launcher.protocol.health): bounded over a long run, the newest sample whole."""

from __future__ import annotations

import json

from launcher.protocol.health import (MAX_SAMPLES, HealthRecord, health_key, incarnation_series, latest_sample,
                                      read_series)
from launcher.protocol.store import WorkDir


def full_sample(at: float, ranks: int = 8) -> dict:
    """A sample as a node of ``ranks`` GPU ranks writes it (launcher.node.health), every figure present."""
    return {"at": at, "cpu_percent": 790.5, "rss_bytes": 41 << 30, "mem_available_bytes": 900 << 30,
            "mem_total_bytes": 1 << 40, "cores": 96, "window_seconds": 60.0,
            "gpus": [{"index": i, "name": "NVIDIA H200", "util_percent": 97.0, "mem_used_bytes": 70 << 30,
                      "mem_total_bytes": 141 << 30, "power_watts": 612.25, "temp_c": 61} for i in range(ranks)],
            "ranks": {str(r): {"local": r, "pid": 4000 + r, "cpu_percent": 99.5, "rss_bytes": 5 << 30,
                               "steps": int(at), "samples": int(at) * 256, "step_source": "optimizer",
                               "metrics": {"loss": 0.125, "lr": 0.0003}, "steps_per_s": 4.875,
                               "samples_per_s": 1248.0, "window_s": 60.0, "data_wait_fraction": 0.0125,
                               "work_per_step_s": 0.2051, "last_line_at": at - 0.5, "gpu": r}
                      for r in range(ranks)}}


class ObjectStore(WorkDir):
    """A local work dir that the writer treats as an object store: it writes when due (every 30 s) and when
    flushed, not after each sample."""

    def __init__(self, root: str):
        super().__init__(root)
        self.is_local = False

    def put(self, key: str, data: bytes) -> None:
        self.is_local = True
        try:
            super().put(key, data)
        finally:
            self.is_local = False


def test_a_day_of_samples_stays_small_and_keeps_the_newest_whole(tmp_path):
    store = ObjectStore(str(tmp_path / "run"))
    record = HealthRecord(store, "n", interval=5.0)
    for index in range(24 * 720):  # a day at one sample every 5 s
        record.add(full_sample(1_800_000_000.0 + 5.0 * index))
    record.flush()
    written = store.get(health_key("n"))
    # 8 ranks on 8 GPUs: about 2.2 kB a sample kept, against 4.1 kB whole
    assert len(written) < 600_000, len(written)
    series = read_series(store, "n")
    assert len(series["samples"]) <= MAX_SAMPLES
    assert series["samples"][0]["at"] == 1_800_000_000.0  # the start of the day is still there, thinned
    assert series["latest"] == full_sample(1_800_000_000.0 + 5.0 * (24 * 720 - 1))
    kept = series["samples"][-1]["ranks"]["3"]
    assert kept["steps_per_s"] == 4.875 and kept["metrics"] == {"loss": 0.125, "lr": 0.0003}
    assert "pid" not in kept and "name" not in series["samples"][-1]["gpus"][0]


def test_the_newest_of_the_heartbeat_and_the_record_is_the_latest(tmp_path):
    store = WorkDir(str(tmp_path / "run"))
    record = HealthRecord(store, "n")
    record.add(full_sample(100.0))
    series = read_series(store, "n")
    assert latest_sample({"health": full_sample(105.0)}, series)["at"] == 105.0
    assert latest_sample({"health": full_sample(95.0)}, series)["at"] == 100.0
    assert latest_sample(None, None) is None
    assert latest_sample({"health": "damaged"}, {"latest": {"at": "x"}, "samples": []}) is None
    assert json.loads((tmp_path / "run" / health_key("n")).read_text())["node"] == "n"


def test_a_replacement_keeps_the_samples_of_its_nodes_earlier_starts_within_the_same_bound(tmp_path):
    """The main, killed after 12 hours, and its replacement: the replacement's record keeps the killed start's
    samples (thinned as one series with its own, so the bound is the one above), each start's apart."""
    store = ObjectStore(str(tmp_path / "run"))
    first = HealthRecord(store, "n", interval=5.0)
    for index in range(12 * 720):
        first.add(full_sample(1_800_000_000.0 + 5.0 * index))
    first.flush()
    replacement = HealthRecord(store, "n", incarnation=1, interval=5.0)
    later = 1_800_000_000.0 + 12 * 3600 + 30
    for index in range(12 * 720):
        replacement.add(full_sample(later + 5.0 * index))
    replacement.flush()
    written = store.get(health_key("n"))
    assert len(written) < 600_000, len(written)
    series = read_series(store, "n")
    assert len(series["samples"]) <= MAX_SAMPLES and series["incarnation"] == 1
    starts = incarnation_series(series)
    assert [incarnation for incarnation, _ in starts] == [0, 1]
    assert starts[0][1][0]["at"] == 1_800_000_000.0 and starts[0][1][-1]["at"] < later <= starts[1][1][0]["at"]
    assert HealthRecord(store, "n", incarnation=1).samples == []  # the same start again takes nothing over


def test_a_record_without_starts_is_one_series_of_its_incarnation():
    assert incarnation_series({"incarnation": 2, "samples": [{"at": 1.0}, {"at": True}, "x"]}) == [(2, [{"at": 1.0}])]
    assert incarnation_series({"samples": []}) == []
