"""A large run's timeline folded to a screen (issue 41): above FOLD_ABOVE nodes the picture draws on their own the
nodes that stand out, each named with why, and folds the rest into lanes that show each state's spread over them and
name every node they hold; the table sums each phase up over the nodes; ``--all-nodes`` shows every node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from statistics import median

import pytest

from conftest import run_cli
from test_timeline import T0, batch, measured_in_chromium
from launcher.commands.timeline import table_rows
from launcher import timeline_svg
from launcher.protocol.store import WorkDir
from launcher.runs import timeline as tl
from launcher.runs.state import RunInfo, save
from launcher.runs.timeline_fold import FOLD_ABOVE, SHOWN_AT_MOST, named

SVG = "{http://www.w3.org/2000/svg}"
FEW = 4  # lanes a folded picture may add to SHOWN_AT_MOST: its folds


def names(count: int) -> list[str]:
    return ["m", *(f"w-{index}" for index in range(count - 1))]


def large_run(tmp_path: Path, count: int, failed: tuple[str, ...] = ("w-57",), state: str = "failed",
              slow_start: str = "w-10", slow_finish: str = "w-20") -> RunInfo:
    """``count`` nodes' records as they write them: ``failed`` ended early in ``state``, ``slow_start`` started
    2 s after the others, ``slow_finish`` recorded its end at 30 s; the rest succeeded at about 6 s."""
    info = RunInfo("big", "local", str(tmp_path / "wd"), names(count), "", "", T0)
    store = WorkDir(info.run_url)
    store.put("run.json", json.dumps({"created_at": T0}).encode())
    for index, node in enumerate(info.nodes):
        offset = 2.0 if node == slow_start else 0.001 * index
        begun = [("started", 0.2 + offset), ("registered", 0.5 + offset), ("decided", 0.6 + offset, {"rank": index}),
                 ("torchrun", 0.7 + offset, {"round": 0})]
        if node in failed:
            events = batch(node, 0, *begun, ("exited", 1.5 + offset, {"round": 0, "code": 1}))
            status = {"state": state, "exit_code": 1, "ended_at": T0 + 1.6, "updated_at": T0 + 1.6}
        else:
            events = batch(node, 0, *begun, ("first-line", 3.0 + offset, {"round": 0, "rank": index}),
                           ("last-line", 5.0 + offset, {"round": 0, "rank": index}),
                           ("exited", 6.0 + offset, {"round": 0, "code": 0}), ("synced", 6.1 + offset))
            ended = T0 + (30.0 if node == slow_finish else 6.2 + offset)
            status = {"state": "succeeded", "exit_code": 0, "ended_at": ended, "updated_at": ended}
        store.put(f"events/{node}/000.0000.json", json.dumps(events).encode())
        store.put(f"status/{node}.json", json.dumps({"node": node, **status}).encode())
    return info


def lanes_of(root: ElementTree.Element) -> tuple[dict[str, str], list[ElementTree.Element]]:
    """The picture's node lanes (name -> why it is drawn) and its folds."""
    groups = [group for group in root.iter(f"{SVG}g") if "data-lane" in group.attrib]
    shown = {group.get("data-lane"): group.get("data-why", "") for group in groups
             if group.get("class") != "fold" and group.get("data-lane") != "run"}
    return shown, [group for group in groups if group.get("class") == "fold"]


def test_a_failed_node_among_100_has_its_own_lane_and_the_rest_are_folded_with_every_name(tmp_path):
    info = large_run(tmp_path, 100)
    found = tl.read_timeline(info)
    text = timeline_svg.svg(found)
    root = ElementTree.fromstring(text)
    shown, folds = lanes_of(root)
    assert shown == {"m": "main", "w-10": "slowest to start", "w-20": "slowest to finish", "w-57": "failed"}
    assert len(shown) + len(folds) <= SHOWN_AT_MOST + FEW
    (folded,) = folds
    held = folded.get("data-nodes").split()
    assert folded.get("data-count") == "96" and sorted(held + list(shown)) == sorted(info.nodes)  # each node once
    assert "96 nodes folded" in text and "w-0 … w-98" in text  # the label: how many, the first and the last
    assert "w-0 to w-9, w-11 to w-19, w-21 to w-56, w-58 to w-98" in folded.find(f"{SVG}title").text
    assert "100 nodes: 4 on their own, 96 folded" in text
    assert {mark.get("data-node") for mark in root.iter(f"{SVG}g") if mark.get("class") == "mark"} <= {"", *shown}
    assert {rect.get("data-node") for rect in root.iter(f"{SVG}rect") if rect.get("class") == "state"} == set(shown)


def test_a_folds_rows_give_each_states_earliest_median_and_latest_over_its_nodes(tmp_path):
    found = tl.read_timeline(large_run(tmp_path, 40))
    root = ElementTree.fromstring(timeline_svg.svg(found))
    (folded,) = lanes_of(root)[1]
    held = folded.get("data-nodes").split()
    rows = {row.get("data-state"): row for row in root.iter(f"{SVG}g") if row.get("class") == "spread"}
    assert list(rows) == [tl.STARTING, tl.WAITING, tl.PREPARING, tl.LAUNCHING, tl.TRAINING, tl.STOPPING,
                          tl.SYNCING, tl.RECORDING]
    trained = [span for span in tl.segments(found) if span.state == tl.TRAINING and span.node in held]
    starts, ends = [found.seconds(span.start) for span in trained], [found.seconds(span.end) for span in trained]
    row = rows[tl.TRAINING]
    assert row.get("data-nodes") == str(len(held))
    for name, expected in (("start-min", min(starts)), ("start-median", median(starts)),
                           ("start-max", max(starts)), ("end-min", min(ends)), ("end-median", median(ends)),
                           ("end-max", max(ends))):
        assert float(row.get(f"data-{name}")) == round(expected, 6), name
    solid = row.findall(f"{SVG}rect")[1]
    scale, x0 = float(root.get("data-px-per-s")), float(root.get("data-x0"))
    assert float(solid.get("x")) == round(x0 + median(starts) * scale, 3)  # the median start, marked


def test_standouts_beyond_a_screen_are_folded_by_why_and_counted(tmp_path):
    lost = tuple(f"w-{index}" for index in range(30, 70))
    found = tl.read_timeline(large_run(tmp_path, 100, failed=lost, state="lost"))
    shown, folds = lanes_of(ElementTree.fromstring(timeline_svg.svg(found)))
    assert len(shown) == SHOWN_AT_MOST and len(shown) + len(folds) <= SHOWN_AT_MOST + FEW
    assert [(fold.get("data-why"), fold.get("data-count")) for fold in folds] == [("", "57"), ("lost", "19")]
    assert sum(why == "lost" for why in shown.values()) == 21
    assert set(lost) == {node for node, why in shown.items() if why == "lost"} | set(folds[1].get("data-nodes").split())


def test_a_run_at_the_threshold_keeps_a_lane_per_node_as_before(tmp_path):
    found = tl.read_timeline(large_run(tmp_path, FOLD_ABOVE))
    shown, folds = lanes_of(ElementTree.fromstring(timeline_svg.svg(found)))
    assert list(shown) == names(FOLD_ABOVE) and set(shown.values()) == {""} and not folds


def test_the_table_sums_each_phase_up_over_the_nodes_and_all_nodes_shows_each(tmp_path, launcher_home):
    save(large_run(tmp_path, 100))
    done = run_cli("timeline", "big", "-o", str(tmp_path / "run.html"))
    assert done.returncode == 0, done.stderr
    header, *rows = [re.split(r"\s{2,}", line.strip()) for line in done.stdout.splitlines()[1:-2]]
    assert header == ["PHASE", "run", "NODES", "MIN", "MEDIAN", "MAX", "m", "w-10", "w-20", "w-57"]
    by_phase = {row[0]: row[1:] for row in rows}
    assert by_phase["final status recorded"][:4] == ["100", "1.60", "6.25", "30.00"]
    assert by_phase["first training line"][:1] == ["99"]  # the failed node never trained
    assert "shown on their own: m (main), w-10 (slowest to start), w-20 (slowest to finish), w-57 (failed)" in \
        done.stdout and "96 more not shown (--all-nodes shows every node)" in done.stdout
    assert "96 nodes folded" in (tmp_path / "run.html").read_text()
    every = run_cli("timeline", "big", "--all-nodes", "-o", str(tmp_path / "all.svg"))
    assert every.returncode == 0, every.stderr
    assert every.stdout.splitlines()[1].split() == ["PHASE", "run", *names(100)]
    shown, folds = lanes_of(ElementTree.parse(tmp_path / "all.svg").getroot())
    assert list(shown) == names(100) and not folds


def test_names_in_a_row_are_written_as_ranges():
    assert named(["m", "w-0", "w-1", "w-2", "w-4", "x", "w-5"]) == "m, w-0 to w-2, w-4, x, w-5"


def test_a_browser_draws_each_folded_states_rows_inside_the_fold_below_the_standouts(tmp_path):
    found = tl.read_timeline(large_run(tmp_path, 100))
    page = tmp_path / "run.html"
    page.write_text(timeline_svg.html(found, table_rows(found)))
    shown = measured_in_chromium(page, tmp_path)
    lanes = shown["lanes"]
    assert list(lanes) == ["run", "m", "w-10", "w-20", "w-57", "fold:0"]
    assert all(lanes[above]["bottom"] <= lanes[below]["top"] for above, below in zip(lanes, list(lanes)[1:]))
    rows = [state for state in shown["states"] if "node" not in state]  # the fold's: no node of their own
    assert [row["state"] for row in rows] == [row.get("data-state") for row in ElementTree.fromstring(
        timeline_svg.svg(found)).iter(f"{SVG}g") if row.get("class") == "spread"]
    fold = lanes["fold:0"]
    assert all(fold["top"] <= row["top"] and row["bottom"] <= fold["bottom"] for row in rows)
    assert all(upper["bottom"] <= lower["top"] for upper, lower in zip(rows, rows[1:]))  # a row per state
    x0 = shown["svg"]["left"] + shown["svg"]["x0"]
    training = next(row for row in rows if row["state"] == tl.TRAINING)
    spans = [span for span in tl.segments(found) if span.state == tl.TRAINING and span.node not in lanes]
    assert training["left"] == pytest.approx(x0 + found.seconds(min(s.start for s in spans)) * shown["svg"]["scale"],
                                             abs=1)
    assert training["right"] == pytest.approx(x0 + found.seconds(max(s.end for s in spans)) * shown["svg"]["scale"],
                                              abs=1)


def test_a_run_the_protocols_writers_wrote_folds_and_its_benchmark_runs(tmp_path):
    """benchmarks/timeline_lanes.py at a small size (40 nodes of benchmarks/scale.py), so that it cannot rot; the
    records it keeps, as the nodes' own writers wrote them, fold in the picture and the table."""
    repo = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(repo / "benchmarks" / "timeline_lanes.py"), "--sizes", "40",
                           "--repeat", "1", "--train-seconds", "1", "--keep", str(tmp_path)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(repo)}, timeout=240)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.splitlines()[0])
    assert (row["nodes"], row["code"], row["exit"]) == (40, "after", 0)
    assert 2 <= row["lanes"] <= SHOWN_AT_MOST + FEW and row["svg_bytes"] > 0
    env = {**os.environ, "LAUNCHER_HOME": str(tmp_path / "40")}
    table = run_cli("timeline", str(tmp_path / "40" / "runs" / "scale" / "info.yaml"), env=env)
    assert table.returncode == 0, table.stderr
    header, *rows = [re.split(r"\s{2,}", line.strip()) for line in table.stdout.splitlines()[1:-1]]
    assert header[:6] == ["PHASE", "run", "NODES", "MIN", "MEDIAN", "MAX"] and "node-0" in header
    assert {row[0]: row[1] for row in rows}["registered"] == "40"  # the run's own cell is empty: NODES follows
    assert "node-0 (main" in table.stdout and "more not shown (--all-nodes shows every node)" in table.stdout
