"""benchmarks/scale.py at a tiny size (8 nodes on a local work dir), so that the benchmark cannot rot: every node
registers, holds the decision, trains and ends, and the figures it prints add up; and through a membership change
(a node's death, two nodes joining) with the real membership rounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_the_scale_benchmark_runs_8_nodes_and_prints_sane_figures(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scale.py"), "--nodes", "8", "--processes", "2",
                           "--train-seconds", "2", "--keep", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=50)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert (figures["store"], figures["nodes"], figures["processes"]) == ("local", 8, 2)
    lag = figures["decided_after_last_registration_s"]
    assert 0 <= lag["median"] <= lag["max"] < 10
    rates = figures["requests_per_node_per_s"]
    assert rates["rendezvous"]["create"] > 0 and rates["training"]["put"] > 0 and rates["ending"]["put"] > 0
    assert 0 < rates["all"] < max(rates[phase]["all"] for phase in ("rendezvous", "training", "ending"))
    assert figures["requests_per_node"] >= 8  # at least: 2 status writes, registration, decision, events, logs
    assert figures["process_peak_rss_mib"]["nodes_per_process"] == 4
    # the kept work dir holds every node's records, written by the protocol's writers
    run = tmp_path / "scale"
    assert len(list((run / "nodes").iterdir())) == 8
    statuses = [json.loads(path.read_text()) for path in (run / "status").iterdir()]
    assert sorted(s["node"] for s in statuses) == [f"node-{i}" for i in range(8)]
    assert {s["state"] for s in statuses} == {"succeeded"}
    assert sorted(s["rank"] for s in statuses) == list(range(8))


@pytest.mark.parametrize("change,members", [("death", 7), ("scale", 10)])
def test_the_scale_benchmark_takes_8_nodes_through_a_membership_change(tmp_path, change, members):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scale.py"), "--nodes", "8", "--processes", "2",
                           "--train-seconds", "2", "--change", change, "--join", "2", "--keep", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    summary = figures["change"]
    assert summary["kind"] == change and summary["final_round"] >= 1 and summary["members"] == members
    after = summary["every_node_in_the_final_round_s"]
    assert 0 < after["median"] <= after["max"] < 60
    assert figures["requests_per_node_per_s"]["change"]["create"] > 0  # each node registered in the new round
    # the work dir holds the rounds the real Rounds code wrote: the last one has every node the change left
    run = tmp_path / "scale"
    last = json.loads((run / "rounds" / f"{summary['final_round']:05d}.json").read_text())
    expected = [f"node-{i}" for i in range(members)]
    assert sorted(last["decision"]["ranks"], key=lambda name: int(name[5:])) == expected
    statuses = {path.stem: json.loads(path.read_text())["state"] for path in (run / "status").iterdir()}
    assert statuses == {name: "succeeded" for name in expected} | ({"node-7": "lost"} if change == "death" else {})


def test_the_client_benchmark_reads_the_run_scale_py_kept_and_refuses_an_empty_one(tmp_path, monkeypatch):
    """`scale_client.py --kept 8=DIR` on the DIR `scale.py --keep DIR` wrote: its client record names that run, dated
    from the records (not from when it was measured); a DIR without the run's records exits instead of measuring."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "scale.py"), "--nodes", "8", "--processes", "2",
                    "--train-seconds", "1", "--keep", str(tmp_path)], check=True, capture_output=True, env=env,
                   timeout=50)
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home"))
    from scale_client import make_run

    from launcher.runs import state

    info = state.load(make_run(8, 1.0, tmp_path / "home", tmp_path)[0])
    assert info.run_url == str(tmp_path / "scale")
    starts = [json.loads(path.read_text())["started_at"] for path in (tmp_path / "scale" / "status").iterdir()]
    starts += [event["at"] for path in (tmp_path / "scale" / "events").glob("*/000.0000.json")
               for event in json.loads(path.read_text())["events"]]
    assert len(starts) > 8 and min(starts) - 5 < info.created_at < min(starts)
    with pytest.raises(SystemExit, match="lacks 8 of 8 nodes' status records"):
        make_run(8, 1.0, tmp_path / "home", tmp_path / "scale")
