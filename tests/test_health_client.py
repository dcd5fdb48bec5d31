"""Run health on the client (issue 39): each node's and rank's latest figures, the slowest rank and the stragglers,
from records the nodes' own writers (HealthRecord, StatusRecord) put in a work dir; ``launcher top``, ``status`` and
``watch`` through the real CLI."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import run_cli
from launcher.commands.top import HEADER, REDRAW, rows, top
from launcher.protocol.health import HealthRecord, health_key
from launcher.protocol.status import StatusRecord
from launcher.protocol.store import WorkDir
from launcher.runs.health import (CPU_BOUND, LESS_BUSY, THROTTLED_SHARE, WAITING_ON_DATA, HealthReader, RunHealth,
                                  StragglerNotices)
from launcher.runs.state import RunInfo, save
from launcher.runs.view import read_view

NODES = ("m", "w-0")  # two nodes of two ranks each: ranks 0, 1 on m and 2, 3 on w-0
GIB = 2**30


def rank_entry(work: float, *, window: float = 60.0, data_wait: float = 0.05, gpu: int | None = None,
               last_line_ago: float = 1.0) -> dict:
    return {"local": 0, "pid": 100, "cpu_percent": 98.0, "rss_bytes": GIB, "steps": 300, "samples": 9600,
            "steps_per_s": 4.8, "samples_per_s": 153.6, "work_per_step_s": work, "data_wait_fraction": data_wait,
            "step_source": "loader", "window_s": window, "last_line_at": time.time() - last_line_ago,
            **({} if gpu is None else {"gpu": gpu})}


def sample(ranks: dict[int, dict], *, gpu_utils: tuple[float, ...] = (), window: float = 60.0,
           at: float | None = None) -> dict:
    """A node's sample; GPU i busy ``gpu_utils[i]`` percent."""
    return {"at": time.time() if at is None else at, "window_seconds": window, "cpu_percent": 197.0,
            "rss_bytes": 2 * GIB, "mem_available_bytes": 40 * GIB, "mem_total_bytes": 64 * GIB, "cores": 8,
            "gpus": [{"index": index, "name": "H100", "util_percent": util, "mem_used_bytes": 30 * GIB,
                      "mem_total_bytes": 80 * GIB} for index, util in enumerate(gpu_utils)],
            "ranks": {str(rank): entry for rank, entry in ranks.items()}}


class Run:
    """A run of :data:`NODES` in a work dir, recorded in LAUNCHER_HOME where a test asks for it."""

    def __init__(self, tmp_path: Path, nodes: tuple[str, ...] = NODES, run_id: str = "health-run"):
        self.info = RunInfo(run_id, "local", str(tmp_path / "work"), list(nodes), "", "", time.time())
        self.store = WorkDir(self.info.run_url)
        self.statuses = {node: StatusRecord(self.store, node, run_id) for node in nodes}
        self.health = {node: HealthRecord(self.store, node) for node in nodes}
        for rank, node in enumerate(nodes):
            self.statuses[node].update(state="running", rank=rank)

    def sampled(self, node: str, *samples: dict) -> None:
        for one in samples:
            self.health[node].add(one)

    def ended(self, state: str = "succeeded") -> None:
        for node in self.info.nodes:
            self.statuses[node].update(state=state, exit_code=0 if state == "succeeded" else 1)

    def read(self) -> RunHealth:
        return HealthReader().read(read_view(self.info), self.store)

    def recorded(self) -> str:
        save(self.info)
        return self.info.run_id


def four_ranks(tmp_path: Path, works: tuple[float, float, float, float], **entry) -> Run:
    """Ranks 0..3 with these works per step; ``entry`` for rank 3's."""
    run = Run(tmp_path)
    run.sampled("m", sample({0: rank_entry(works[0]), 1: rank_entry(works[1])}))
    run.sampled("w-0", sample({2: rank_entry(works[2]), 3: rank_entry(works[3], **entry)}))
    return run


def test_a_rank_with_much_more_own_work_per_step_is_the_straggler_among_four(tmp_path):
    found = four_ranks(tmp_path, (0.2, 0.19, 0.2, 0.42)).read()
    assert [straggler.rank for straggler in found.stragglers] == [3]
    straggler = found.stragglers[0]
    assert (straggler.node, straggler.median_s, straggler.suggests) == ("w-0", pytest.approx(0.2), CPU_BOUND)
    assert straggler.ratio == pytest.approx(0.42 / 0.2)
    assert found.slowest == 3
    assert straggler.line() == ("straggler: rank 3 on node w-0 does 2.1x the median work per step "
                                "(0.42 s vs 0.20 s): CPU-bound")
    assert [(rank.rank, rank.node, rank.state) for rank in found.ranks] == \
        [(0, "m", "running"), (1, "m", "running"), (2, "w-0", "running"), (3, "w-0", "running")]
    assert found.node("w-0").as_dict()["cpu_percent"] == 197.0


def test_short_steps_are_said_in_milliseconds(tmp_path):
    found = four_ranks(tmp_path, (0.004, 0.004, 0.004, 0.0095)).read()
    assert found.stragglers[0].line().endswith("does 2.4x the median work per step (9.5 ms vs 4.0 ms): CPU-bound")


def test_ranks_that_work_alike_have_no_straggler_and_no_slowest(tmp_path):
    found = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.2)).read()
    assert (found.stragglers, found.slowest) == ([], None)


def test_a_rank_just_under_the_ratio_is_only_the_slowest(tmp_path):
    found = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.25)).read()
    assert (found.stragglers, found.slowest) == ([], 3)


@pytest.mark.parametrize("works, slowest", [
    ((0.0038, 0.0038, 0.0038, 0.0039), None),  # noise: 3.9 ms against 3.8 ms is no slowest rank
    ((0.0038, 0.0038, 0.0038, 0.0042), 3),  # 1.1x the median
])
def test_slowest_is_marked_only_beyond_the_margin(tmp_path, works, slowest):
    assert four_ranks(tmp_path, works).read().slowest == slowest


def test_a_rank_measured_over_a_short_window_is_not_compared(tmp_path):
    short = four_ranks(tmp_path / "short", (0.2, 0.2, 0.2, 0.9), window=30.0).read()
    assert short.stragglers == [] and not short.ranks[3].comparable
    long_enough = four_ranks(tmp_path / "long", (0.2, 0.2, 0.2, 0.9), window=0.9 * 60.0).read()
    assert [straggler.rank for straggler in long_enough.stragglers] == [3]


def test_the_window_is_the_nodes_own(tmp_path):
    """A node sampling with LAUNCHER_HEALTH_WINDOW=10 names its window in the sample: 9.5 s is a whole one."""
    run = Run(tmp_path)
    run.sampled("m", sample({0: rank_entry(0.2, window=9.5), 1: rank_entry(0.2, window=9.5)}, window=10.0))
    run.sampled("w-0", sample({2: rank_entry(0.2, window=9.5), 3: rank_entry(0.5, window=9.5)}, window=10.0))
    assert [straggler.rank for straggler in run.read().stragglers] == [3]


def test_a_straggler_that_waits_for_data_is_said_to(tmp_path):
    found = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.5), data_wait=0.45).read()
    assert [straggler.suggests for straggler in found.stragglers] == [WAITING_ON_DATA]


@pytest.mark.parametrize("throttled, suggests", [
    ((0.0, 0.0, 0.0, 0.8), "CPU-throttled (a cgroup CPU quota held it back 80% of the time)"),
    ((0.8, 0.8, 0.8, 0.8), CPU_BOUND),  # a quota on every rank alike does not tell this one apart
    ((0.0, 0.0, 0.0, THROTTLED_SHARE / 2), CPU_BOUND),
])
def test_a_straggler_held_back_by_a_cpu_quota_is_said_to_be_throttled_not_cpu_bound(tmp_path, throttled, suggests):
    run = Run(tmp_path)
    entries = [{**rank_entry(work, window=60.0), "cpu_percent": 8.0, "throttled_fraction": share}
               for work, share in zip((0.2, 0.2, 0.2, 0.5), throttled)]
    run.sampled("m", sample({0: entries[0], 1: entries[1]}))
    run.sampled("w-0", sample({2: entries[2], 3: entries[3]}))
    found = run.read()
    assert [(straggler.rank, straggler.suggests) for straggler in found.stragglers] == [(3, suggests)]
    assert found.ranks[3].as_dict()["throttled_fraction"] == throttled[3]


def gpu_run(tmp_path: Path, straggler_util: float) -> RunHealth:
    """Four ranks with a GPU each (rank r uses GPU r % 2 of its node); rank 3 is slow, its GPU ``straggler_util``."""
    run = Run(tmp_path)
    run.sampled("m", sample({0: rank_entry(0.2, gpu=0), 1: rank_entry(0.2, gpu=1)}, gpu_utils=(96.0, 94.0)))
    run.sampled("w-0", sample({2: rank_entry(0.2, gpu=0), 3: rank_entry(0.5, gpu=1)},
                              gpu_utils=(95.0, straggler_util)))
    return run.read()


def test_a_straggler_whose_gpu_is_less_busy_than_its_peers_is_said_to(tmp_path):
    found = gpu_run(tmp_path, straggler_util=60.0)
    assert [(straggler.rank, straggler.suggests) for straggler in found.stragglers] == [(3, LESS_BUSY)]
    assert found.ranks[3].gpu_util == 60.0 and found.ranks[2].gpu_util == 95.0


def test_a_straggler_whose_gpu_is_as_busy_as_the_others_is_cpu_bound(tmp_path):
    found = gpu_run(tmp_path / "busy", straggler_util=90.0)
    assert [straggler.suggests for straggler in found.stragglers] == [CPU_BOUND]


def test_status_json_keeps_a_replaced_nodes_earlier_samples_apart(tmp_path, launcher_home):
    run = Run(tmp_path)
    run.sampled("w-0", sample({2: rank_entry(0.2)}, at=1000.0), sample({2: rank_entry(0.2)}, at=1005.0))
    replacement = HealthRecord(run.store, "w-0", incarnation=1)
    replacement.add(sample({2: rank_entry(0.2)}, at=1020.0))
    status = json.loads(run_cli("status", run.recorded(), "--json").stdout)
    assert status["nodes"]["w-0"]["health_history"] == [{"incarnation": 0, "from": 1000.0, "to": 1005.0, "samples": 2},
                                                        {"incarnation": 1, "from": 1020.0, "to": 1020.0, "samples": 1}]


def test_a_node_without_records_yet_has_a_row_and_no_ranks(tmp_path):
    run = Run(tmp_path, nodes=("m", "w-0", "w-1"))
    run.sampled("m", sample({0: rank_entry(0.2), 1: rank_entry(0.2)}))
    found = run.read()
    assert found.sampled and found.node("w-1").sample is None
    assert found.node("w-1").as_dict() == {"health_at": None, "cpu_percent": None, "rss_bytes": None,
                                           "mem_available_bytes": None, "mem_total_bytes": None, "gpus": [],
                                           "health_history": []}
    assert {rank.node for rank in found.ranks} == {"m"}
    assert not Run(tmp_path / "none").read().sampled


def test_damaged_records_and_entries_are_passed_over(tmp_path):
    run = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.5))
    run.store.put(health_key("m"), b"{not json")  # no writer makes this: a store's damage
    run.sampled("w-0", {**sample({2: rank_entry(0.2)}), "ranks": {"2": rank_entry(0.2), "x": {}, "3": "broken"}})
    found = run.read()
    assert found.node("m").sample is None
    assert [rank.rank for rank in found.ranks] == [2]


def test_ranks_of_ended_nodes_are_not_stragglers(tmp_path):
    run = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.5))
    run.ended()
    found = run.read()
    assert (found.stragglers, found.slowest) == ([], None)
    assert found.ranks[3].state == "succeeded"
    # an ended rank's rates were its node's last interval, not its pace: top leaves them out
    [rank_row] = [row for row in rows(found) if row[0] == "  rank 3"]
    assert rank_row[HEADER.index("STEPS/S")] == rank_row[HEADER.index("WORK/STEP")] == "-", rank_row


def test_the_status_heartbeats_sample_counts_when_it_is_newer(tmp_path):
    run = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.2))
    newer = sample({2: rank_entry(0.2), 3: rank_entry(0.6)}, at=time.time() + 1)
    run.statuses["w-0"].update(health=newer)
    assert [straggler.rank for straggler in run.read().stragglers] == [3]


def test_watchs_notices_read_each_health_record_once_per_sample_interval_and_say_a_straggler_once(tmp_path):
    run = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.5))
    reads: list[str] = []
    plain_get = run.store.get
    run.store.get = lambda key: reads.append(key) or plain_get(key)
    now = [0.0]
    notices = StragglerNotices(clock=lambda: now[0])
    said = []
    for moment in (0.0, 0.25, 1.0, 4.9, 5.0, 6.0, 9.9):  # polls; the straggler's figures keep coming
        now[0] = moment
        run.sampled("w-0", sample({2: rank_entry(0.2), 3: rank_entry(0.5)}))
        said += notices.new(read_view(run.info), run.store)
    assert [straggler.rank for straggler in said] == [3]
    health_reads = [key for key in reads if key.startswith("health/")]
    assert health_reads == [health_key("m"), health_key("w-0")] * 2  # at 0 s and at 5 s
    again = WorkDir(run.info.run_url + "/attempt-2")  # the run retried whole: a new attempt's own namespace
    for node in NODES:
        HealthRecord(again, node).add(sample({2: rank_entry(0.2), 3: rank_entry(0.5)} if node == "w-0"
                                             else {0: rank_entry(0.2), 1: rank_entry(0.2)}))
    assert [straggler.rank for straggler in notices.new(read_view(run.info), again)] == [3]


@contextlib.contextmanager
def cli_process(*args: str, limit: float = 120) -> Iterator[subprocess.Popen]:
    """The real CLI as a process whose output a test reads as it comes; killed after ``limit`` seconds, so that a
    line that never comes fails the test instead of hanging it."""
    process = subprocess.Popen([sys.executable, "-m", "launcher", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(limit, process.kill)
    killer.start()
    try:
        yield process
    finally:
        killer.cancel()
        if process.poll() is None:
            process.kill()
        process.communicate()


def top_once(run_id: str) -> subprocess.CompletedProcess:
    return run_cli("top", run_id, "--once", "--wide")  # every column whole (tests/test_top.py fits them)


def test_top_once_shows_nodes_and_ranks_with_the_slowest_and_the_straggler_marked(tmp_path, launcher_home):
    run = four_ranks(tmp_path, (0.2, 0.19, 0.2, 0.42))
    done = top_once(run.recorded())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("run health-run (local): running, ")
    assert lines[1].split()[:4] == ["NODE", "/", "RANK", "STATE"]
    rows = {line.split()[0] if not line.startswith("  rank") else " ".join(line.split()[:2]): line
            for line in lines[2:] if not line.startswith("straggler:")}
    assert set(rows) == {"m", "w-0", "rank 0", "rank 1", "rank 2", "rank 3"}
    assert rows["m"].split()[1:3] == ["running", "197%"] and "2.00 GiB (40/64 GiB free)" in rows["m"]
    assert rows["rank 3"].split()[2:6] == ["running", "98%", "1.00", "GiB"]
    assert "4.80" in rows["rank 3"] and "0.42 s" in rows["rank 3"] and "5%" in rows["rank 3"]
    assert rows["rank 3"].rstrip().endswith("slowest, straggler: CPU-bound")
    assert not any("slowest" in rows[f"rank {rank}"] or "straggler" in rows[f"rank {rank}"] for rank in (0, 1, 2))
    assert lines[-1] == "straggler: rank 3 on node w-0 does 2.1x the median work per step (0.42 s vs 0.20 s): CPU-bound"


def test_top_once_shows_each_gpu_of_a_node_and_the_one_of_each_rank(tmp_path, launcher_home):
    run = Run(tmp_path, nodes=("m",))
    run.sampled("m", sample({0: rank_entry(0.2, gpu=0), 1: rank_entry(0.2, gpu=1)}, gpu_utils=(96.0, 41.0)))
    done = top_once(run.recorded())
    lines = done.stdout.splitlines()
    node = next(line for line in lines if line.startswith("m "))
    assert "96% 41%" in node and "30/80 GiB 30/80 GiB" in node
    rank_1 = next(line for line in lines if line.startswith("  rank 1"))
    assert "41%" in rank_1 and "30/80 GiB" in rank_1


def test_top_imports_no_heavy_library(tmp_path, launcher_home):
    run_id = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.5)).recorded()
    check = ("import sys; from launcher.cli import main; main(['top', '--once', sys.argv[1]]); "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'docker', 'oci', 'jinja2', 'numpy'}))")
    done = subprocess.run([sys.executable, "-c", check, run_id], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "[]", done.stderr


def test_top_says_when_there_are_no_figures_yet_and_when_a_run_ended_without(tmp_path, launcher_home):
    run = Run(tmp_path)
    done = top_once(run.recorded())
    assert (done.returncode, done.stdout.splitlines()[1:]) == (
        0, ["no figures yet: nodes sample every 5 s by default"])
    run.ended()
    done = run_cli("top", run.info.run_id)  # ended: one table and done
    assert (done.returncode, done.stdout.splitlines()[1:]) == (0, ["its nodes recorded no figures"])


def test_top_refreshes_until_the_run_ends_then_shows_the_last_table_and_exits_with_its_status(tmp_path,
                                                                                             launcher_home):
    run = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.5))
    with cli_process("top", run.recorded(), "--wide") as process:
        first = []
        for line in process.stdout:  # the first table is out once its straggler line is
            first.append(line)
            if line.startswith("straggler:"):
                break
        assert first[0].startswith("run health-run (local): running")
        run.ended(state="failed")
        rest, errors = process.communicate(timeout=60)
    assert process.returncode == 1, errors
    final = rest.strip().split("\n\n")[-1].splitlines()  # plain tables, one after the other, not redrawn
    assert final[0].startswith("run health-run (local): failed")
    states = [line.split()[2 if line.startswith("  rank") else 1] for line in final[2:]]
    assert states == ["failed"] * 6  # both nodes, each with its two ranks
    assert not any("straggler" in line for line in final)
    node_rows = [line for line in final[2:] if not line.startswith("  rank")]
    assert all("last sample" in line and "sampled" not in line for line in node_rows), final  # not an age that grows
    assert top_once(run.info.run_id).returncode == 0  # --once is for scripts: 0 whatever the run's result


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_top_redraws_in_place_on_a_terminal_and_once_does_not(tmp_path, launcher_home, monkeypatch):
    run = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.5))
    run.recorded()
    once = Terminal()
    assert top(run.info.run_id, once=True, out=once) == 0
    assert once.getvalue().startswith("run health-run (local): running")
    run.ended()
    live = Terminal()
    assert top(run.info.run_id, once=False, out=live) == 0
    assert live.getvalue().startswith(REDRAW + "run health-run (local): succeeded")
    assert live.getvalue().count(REDRAW) == 1
    assert max(map(len, once.getvalue().splitlines())) > 60  # as it is, once
    monkeypatch.setenv("COLUMNS", "60")
    narrow = Terminal()
    assert top(run.info.run_id, once=False, out=narrow) == 0
    assert max(map(len, narrow.getvalue().removeprefix(REDRAW).splitlines())) == 60  # redrawn: cut, not wrapped


def test_status_json_carries_each_ranks_and_nodes_figures_and_the_stragglers(tmp_path, launcher_home):
    run = four_ranks(tmp_path, (0.2, 0.19, 0.2, 0.42))
    done = run_cli("status", run.recorded(), "--json")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert [(rank["rank"], rank["node"], rank["steps_per_s"], rank["slowest"]) for rank in shown["ranks"]] == \
        [(0, "m", 4.8, False), (1, "m", 4.8, False), (2, "w-0", 4.8, False), (3, "w-0", 4.8, True)]
    node = shown["nodes"]["w-0"]
    assert (node["state"], node["cpu_percent"], node["rss_bytes"], node["gpus"]) == ("running", 197.0, 2 * GIB, [])
    assert shown["stragglers"] == [{"rank": 3, "node": "w-0", "work_per_step_s": 0.42,
                                    "median_s": pytest.approx(0.2), "ratio": pytest.approx(0.42 / 0.2),
                                    "suggests": CPU_BOUND}]
    plain = run_cli("status", run.info.run_id)
    assert plain.stdout.count("straggler:") == 1
    assert "straggler: rank 3 on node w-0 does 2.1x the median work per step" in plain.stdout


def test_status_json_says_no_stragglers_as_an_empty_list(tmp_path, launcher_home):
    run = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.2))
    shown = json.loads(run_cli("status", run.recorded(), "--json").stdout)
    assert shown["stragglers"] == [] and len(shown["ranks"]) == 4
    assert "straggler" not in run_cli("status", run.info.run_id).stdout


def test_watch_says_a_straggler_once_while_it_stays_one(tmp_path, launcher_home):
    """Each state written (of a third node) is a line of ``watch -v`` printed after the view that saw it, the
    straggler's new sample written before: several polls in which rank 3 is still a straggler."""
    run = Run(tmp_path, nodes=("m", "w-0", "w-1"))
    run.statuses["w-1"].update(state="registering")

    def heartbeat(at: float) -> None:
        run.statuses["m"].update(health=sample({0: rank_entry(0.2), 1: rank_entry(0.2)}, at=at))
        run.statuses["w-0"].update(health=sample({2: rank_entry(0.2), 3: rank_entry(0.42)}, at=at))

    heartbeat(time.time())
    with cli_process("watch", "-v", run.recorded()) as process:
        lines = []

        def until(text: str) -> None:
            for line in process.stdout:
                lines.append(line)
                if text in line:
                    return
            raise AssertionError(f"watch ended before {text!r}: {lines}")

        until("straggler:")
        for state in ("waiting", "running", "registering", "waiting"):
            heartbeat(time.time())
            run.statuses["w-1"].update(state=state)
            until(f"[w-1] -- {state}")
        run.ended()
        rest, errors = process.communicate(timeout=60)
    said = [line for line in lines + rest.splitlines() if line.startswith("straggler")]
    assert said == ["straggler: rank 3 on node w-0 does 2.1x the median work per step (0.42 s vs 0.20 s): "
                    "CPU-bound\n"], errors
    assert process.returncode == 0
