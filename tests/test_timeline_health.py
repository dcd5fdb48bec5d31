"""The timeline's utilisation rows (issue 39): each node's health record, written by the protocol's own writer into a
work dir, drawn under the node's lane (CPU of its cores, mean GPU, steps/s per rank) where the samples say, and
carried in ``timeline --json``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from statistics import fmean

import pytest

from conftest import run_cli
from test_timeline import T0, happy_node, measured_in_chromium, retried_run
from launcher import timeline_svg
from launcher.protocol.health import MAX_SAMPLES, HealthRecord, health_key
from launcher.protocol.store import WorkDir
from launcher.runs import timeline as tl
from launcher.runs.state import RunInfo, save
from launcher.commands.timeline import table_rows
from launcher.runs.timeline_health import read_utilisation, utilisations

SVG = "{http://www.w3.org/2000/svg}"
CORES = 4


def sample(at: float, cpu: float, gpus: tuple[float, ...] = (), steps: dict[int, float] | None = None) -> dict:
    """A sample as a node of CORES cores writes it: ``cpu`` in percent of one core, a GPU per figure."""
    return {"at": at, "cpu_percent": cpu, "cores": CORES, "rss_bytes": 1 << 30,
            "gpus": [{"index": index, "name": "H100", "util_percent": util} for index, util in enumerate(gpus)],
            "ranks": {str(rank): {"local": rank % 8, "steps_per_s": value, "window_s": 60.0}
                      for rank, value in (steps or {}).items()}}


def finished_run(tmp_path: Path, nodes: tuple[str, ...] = ("m", "w-0")) -> tuple[RunInfo, WorkDir]:
    """A static run's records (the nodes' events and final statuses, 6 s long), no health records yet."""
    info = RunInfo("r", "local", str(tmp_path / "wd"), list(nodes), "", "", T0)
    store = WorkDir(info.run_url)
    store.put("run.json", json.dumps({"created_at": T0}).encode())
    for index, node in enumerate(nodes):
        store.put(f"events/{node}/000.0000.json",
                  json.dumps(happy_node(node, 0.05 * index, (2 * index, 2 * index + 1))).encode())
        ended = T0 + 6.2 + 0.1 * index
        store.put(f"status/{node}.json", json.dumps({"node": node, "state": "succeeded", "exit_code": 0,
                                                      "ended_at": ended, "updated_at": ended}).encode())
    return info, store


def write_health(store: WorkDir, node: str, samples: list[dict]) -> None:
    record = HealthRecord(store, node)
    for each in samples:
        record.add(each)


def drawn(info: RunInfo) -> tuple[tl.Timeline, ElementTree.Element]:
    found = tl.read_timeline(info)
    return found, ElementTree.fromstring(timeline_svg.svg(found))


def points_of(element: ElementTree.Element) -> list[tuple[float, float]]:
    return [tuple(float(figure) for figure in pair.split(",")) for pair in element.get("points").split()]


def of_class(root: ElementTree.Element, kind: str, node: str) -> list[ElementTree.Element]:
    return [e for e in root.iter() if e.get("class") == kind and e.get("data-node") == node]


def row(root: ElementTree.Element, node: str, which: str) -> tuple[float, float]:
    """(full scale's y, zero's y) of a node's row."""
    found = next(e for e in of_class(root, "health-row", node) if e.get("data-row") == which)
    return float(found.get("data-top")), float(found.get("data-bottom"))


def lane(root: ElementTree.Element, node: str) -> tuple[float, float]:
    found = next(e for e in root.iter(f"{SVG}g") if e.get("data-lane") == node)
    return float(found.get("data-top")), float(found.get("data-bottom"))


def expected(root: ElementTree.Element, at: float, value: float, scale: tuple[float, float],
             full: float = 100.0) -> tuple[float, float]:
    """Where a figure at ``at`` goes: time across the run's axis, ``value`` up from its row's zero."""
    top, bottom = scale
    x = float(root.get("data-x0")) + (at - T0) * float(root.get("data-px-per-s"))
    return x, bottom - value / full * (bottom - top)


CPU = [150.0, 390.0, 20.0, 400.0, 260.0]  # percent of one core; the node may use CORES
GPUS = [(90.0, 70.0), (10.0, 30.0), (55.0, 55.0), (100.0, 80.0), (0.0, 40.0)]


def test_a_nodes_cpu_and_gpu_are_drawn_under_its_lane_where_its_samples_say_and_a_node_without_records_as_before(
        tmp_path):
    info, store = finished_run(tmp_path)
    times = [T0 + 1.0 + 1.2 * index for index in range(len(CPU))]
    write_health(store, "m", [sample(at, cpu, gpus) for at, cpu, gpus in zip(times, CPU, GPUS)])
    found, root = drawn(info)

    util = row(root, "m", "util")
    assert lane(root, "m")[1] <= util[0] < util[1] <= lane(root, "w-0")[0]  # between its lane and the next
    area = of_class(root, "cpu", "m")
    assert len(area) == 1
    corners = points_of(area[0])
    assert corners[0] == pytest.approx(expected(root, times[0], 0, util), abs=0.01)  # from the zero line ...
    assert corners[-1] == pytest.approx(expected(root, times[-1], 0, util), abs=0.01)  # ... back to it
    assert corners[1:-1] == [pytest.approx(expected(root, at, cpu / CORES, util), abs=0.01)
                             for at, cpu in zip(times, CPU)]
    gpu = of_class(root, "gpu", "m")
    assert len(gpu) == 1
    assert points_of(gpu[0]) == [pytest.approx(expected(root, at, fmean(utils), util), abs=0.01)
                                 for at, utils in zip(times, GPUS)]
    assert not of_class(root, "steps", "m")  # no rank reported steps: no steps row
    assert ["".join(e.itertext()) for e in of_class(root, "health-row", "m")] == ["CPU, GPU 0-100 %"]  # no steps row

    for kind in ("health-row", "cpu", "gpu", "sample"):
        assert not of_class(root, kind, "w-0")
    states = [e for e in root.iter(f"{SVG}rect") if e.get("data-state") and e.get("data-node") == "w-0"]
    top, bottom = lane(root, "w-0")
    assert states and all(top <= float(e.get("y")) and float(e.get("y")) + float(e.get("height")) <= bottom
                          for e in states)
    legend = ["".join(e.itertext()) for e in root.iter(f"{SVG}g") if e.get("class") == "legend"]
    assert "CPU, % of the node's cores" in legend and "mean GPU utilisation, %" in legend
    assert "steps/s, a line per rank" not in legend

    columns = of_class(root, "sample", "m")
    assert [float(e.get("data-at")) for e in columns] == pytest.approx(times)
    said = columns[1].find(f"{SVG}title").text
    assert said == "m: 2.2 s: CPU 98 % of its cores, GPU 20 %"


def test_each_ranks_steps_per_second_is_a_line_on_one_scale_for_the_run_broken_where_it_did_not_run(tmp_path):
    info, store = finished_run(tmp_path)
    times = [T0 + 1.0 + index for index in range(5)]
    steady = {rank: 4.0 for rank in range(8)}
    write_health(store, "m", [sample(at, 100, steps=steady | {3: 2.0 + index}) for index, at in enumerate(times)])
    write_health(store, "w-0", [sample(at, 100, steps={rank: 3.0 for rank in range(8, 16) if index != 2 or rank != 9})
                                for index, at in enumerate(times)])  # rank 9 missing from the middle sample
    found, root = drawn(info)
    fastest = 6.0  # rank 3's last figure
    assert row(root, "m", "util")[1] < row(root, "m", "steps")[0] < row(root, "m", "steps")[1] <= lane(root, "w-0")[0]
    for node in ("m", "w-0"):
        words = next(e for e in of_class(root, "health-row", node) if e.get("data-row") == "steps")
        assert "".join(words.itertext()) == "steps/s 0-6"
    assert ["".join(e.itertext()) for e in of_class(root, "health-row", "w-0")] == ["CPU 0-100 %", "steps/s 0-6"]
    lines = {(e.get("data-node"), int(e.get("data-rank"))): e for e in of_class(root, "steps", "m")}
    assert sorted(rank for _, rank in lines) == list(range(8))
    steps = row(root, "m", "steps")
    assert points_of(lines[("m", 3)]) == [pytest.approx(expected(root, at, 2.0 + index, steps, fastest), abs=0.01)
                                          for index, at in enumerate(times)]
    assert points_of(lines[("m", 0)]) == [pytest.approx(expected(root, at, 4.0, steps, fastest), abs=0.01)
                                          for at in times]
    broken = [points_of(e) for e in of_class(root, "steps", "w-0") if e.get("data-rank") == "9"]
    w_steps = row(root, "w-0", "steps")
    assert broken == [[pytest.approx(expected(root, times[i], 3.0, w_steps, fastest), abs=0.01) for i in (0, 1)],
                      [pytest.approx(expected(root, times[i], 3.0, w_steps, fastest), abs=0.01) for i in (3, 4)]]
    said = of_class(root, "sample", "m")[4].find(f"{SVG}title").text
    assert said.endswith("steps/s: rank 0 4.00, rank 1 4.00, rank 2 4.00, rank 3 6.00, rank 4 4.00, rank 5 4.00, "
                         "rank 6 4.00, rank 7 4.00")


def test_a_thinned_long_record_still_draws_across_the_whole_run(tmp_path):
    info, store = finished_run(tmp_path)
    long = 2000  # 5-second samples over about 2.8 hours: the writer thins the old ones
    times = [T0 + 1.0 + 5.0 * index for index in range(long)]
    write_health(store, "m", [sample(at, 10.0 * (index % 40), (float(index % 100),)) for index, at in enumerate(times)])
    stored = store.get_record(health_key("m"))["samples"]
    assert len(stored) <= MAX_SAMPLES and stored[0]["at"] == times[0] and stored[-1]["at"] == times[-1]
    found, root = drawn(info)
    util = row(root, "m", "util")
    corners = points_of(of_class(root, "cpu", "m")[0])
    assert corners[0][0] == pytest.approx(expected(root, times[0], 0, util)[0], abs=0.01)
    assert corners[-1][0] == pytest.approx(expected(root, times[-1], 0, util)[0], abs=0.01)
    x0, width = float(root.get("data-x0")), timeline_svg.PLOT_WIDTH
    assert x0 < corners[0][0] < x0 + 0.01 * width and x0 + 0.99 * width < corners[-1][0] <= x0 + width
    assert corners[1:-1] == [pytest.approx(expected(root, s["at"], s["cpu_percent"] / CORES, util), abs=0.01)
                             for s in stored]
    gpu = points_of(of_class(root, "gpu", "m")[0])
    assert [x for x, _ in gpu] == [x for x, _ in corners[1:-1]]


def test_a_missing_figure_breaks_the_line_and_damaged_samples_are_left_out():
    record = {"node": "m", "incarnation": 2, "samples": [
        sample(T0 + 1, 100, (50.0,)), {"at": T0 + 2, "cpu_percent": 80},  # no cores, no GPUs
        "not a sample", {"cpu_percent": 5, "cores": 1}, {"at": True, "cpu_percent": 5, "cores": 1},
        sample(T0 + 3, 200, (70.0,), {0: 1.5}), {"at": T0 + 4, "cpu_percent": "x", "cores": 0,
                                                 "gpus": [{"util_percent": None}, "x"], "ranks": {"0": {}, "r": {}}},
        sample(T0 + 5, 300, (90.0,), {0: 2.5})]}
    [found] = utilisations("m", record, attempt=2)
    assert found.points == [(T0 + 1, 25.0, 50.0), (T0 + 2, None, None), (T0 + 3, 50.0, 70.0), (T0 + 4, None, None),
                            (T0 + 5, 75.0, 90.0)]
    assert found.steps_per_s == {0: [(T0 + 3, 1.5), (T0 + 4, None), (T0 + 5, 2.5)]}
    assert (found.attempt, found.incarnation) == (2, 2)
    assert utilisations("m", {"samples": ["x", {"at": "soon"}]}) == []

    timeline = tl.Timeline("r", T0, ["m"], [tl.Event(T0, tl.SUBMITTED)], T0 + 6, health=[found])
    root = ElementTree.fromstring(timeline_svg.svg(timeline))
    assert [len(points_of(e)) for e in of_class(root, "gpu", "m")] == [2, 2, 2]  # a point alone: drawn as a dot
    assert [len(points_of(e)) for e in of_class(root, "cpu", "m")] == [3, 3, 3]
    assert [len(points_of(e)) for e in of_class(root, "steps", "m")] == [2, 2]
    titles = [e.find(f"{SVG}title").text for e in of_class(root, "sample", "m")]
    assert titles[1] == "m: 2.0 s: no figures"


def test_a_run_retried_whole_draws_each_attempts_record_on_its_own(tmp_path):
    from launcher.runs.attempts import namespace

    info = retried_run(tmp_path)
    for attempt in (1, 2, 3):
        store = WorkDir(info.run_url if attempt == 1 else namespace(info.run_url, "r", attempt))
        start = T0 + 10.0 * (attempt - 1)
        write_health(store, "m", [sample(start + 1, 100 * attempt), sample(start + 4, 100 * attempt)])
    found, root = drawn(info)
    assert [(d.attempt, [round(at - T0, 1) for at, _, _ in d.points]) for d in found.health] == [
        (1, [1.0, 4.0]), (2, [11.0, 14.0]), (3, [21.0, 24.0])]
    areas = of_class(root, "cpu", "m")
    assert [e.get("data-attempt") for e in areas] == ["1", "2", "3"]  # no line across the gaps between attempts
    assert of_class(root, "sample", "m")[2].find(f"{SVG}title").text.startswith("m: attempt 2, 11.0 s: CPU 50 %")


def test_timeline_json_carries_the_series_it_drew_and_the_cli_draws_them(tmp_path, launcher_home):
    info, store = finished_run(tmp_path)
    save(info)
    times = [T0 + 1.0 + index for index in range(3)]
    write_health(store, "m", [sample(at, 100 * (index + 1), (20.0 * index, 40.0), {0: 1.0 + index, 1: 1.5})
                              for index, at in enumerate(times)])
    done = run_cli("timeline", "r", "--json", "-o", str(tmp_path / "run.svg"))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert list(shown["health"]) == ["m"]  # w-0 wrote no record
    (record,) = shown["health"]["m"]
    assert record["attempt"] == 1 and record["incarnation"] == 0
    assert record["series"] == [[times[0], 25.0, 20.0], [times[1], 50.0, 30.0], [times[2], 75.0, 40.0]]
    assert record["steps_per_s"] == {"0": [[at, 1.0 + index] for index, at in enumerate(times)],
                                     "1": [[at, 1.5] for at in times]}
    root = ElementTree.parse(tmp_path / "run.svg").getroot()
    assert root.tag == f"{SVG}svg"
    util = row(root, "m", "util")
    drawn_cpu = points_of(of_class(root, "cpu", "m")[0])[1:-1]
    assert drawn_cpu == [pytest.approx(expected(root, at, cpu, util), abs=0.01) for at, cpu, _ in record["series"]]
    page = run_cli("timeline", "r", "-o", str(tmp_path / "run.html"))
    assert page.returncode == 0, page.stderr
    assert 'class="cpu"' in (tmp_path / "run.html").read_text()


MEASURE_HEALTH = """<script>
const box = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
                                                                   bottom: r.bottom}; };
const hitAt = (b) => document.elementFromPoint((b.left + b.right) / 2, (b.top + b.bottom) / 2);
const out = {lanes: {}, rows: [], shapes: [], columns: [], states: []};
for (const g of document.querySelectorAll('[data-lane]')) out.lanes[g.dataset.lane] = box(g.querySelector('rect'));
for (const g of document.querySelectorAll('g.health-row'))
  out.rows.push({...box(g.querySelector('rect')), node: g.dataset.node, row: g.dataset.row});
for (const e of document.querySelectorAll('polygon.cpu, polyline.gpu, polyline.steps'))
  out.shapes.push({...box(e), node: e.dataset.node, kind: e.getAttribute('class')});
for (const e of document.querySelectorAll('rect.sample')) {
  const hit = hitAt(box(e));
  out.columns.push({at: e.dataset.at, hit: hit && hit.dataset.at || null});
}
for (const e of document.querySelectorAll('[data-state]')) {
  const b = box(e), hit = hitAt(b);
  out.states.push({state: e.dataset.state, width: b.right - b.left, hit: hit && hit.dataset.state || null});
}
const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def test_a_browser_draws_the_rows_between_the_lanes_and_hovering_finds_each_sample(tmp_path):
    info, store = finished_run(tmp_path, ("m", "w-0", "w-1"))
    times = [T0 + 0.5 + 0.5 * index for index in range(12)]
    for node in ("m", "w-1"):
        write_health(store, node, [sample(at, 40.0 * index, (8.0 * index,), {rank: 1.0 + index for rank in range(8)})
                                   for index, at in enumerate(times)])
    found = tl.read_timeline(info)
    (tmp_path / "run.html").write_text(timeline_svg.html(found, table_rows(found)))
    shown = measured_in_chromium(tmp_path / "run.html", tmp_path, MEASURE_HEALTH)
    lanes = shown["lanes"]
    for node, after in (("m", "w-0"), ("w-1", None)):
        mine = [r for r in shown["rows"] if r["node"] == node]
        assert [r["row"] for r in mine] == ["util", "steps"]
        assert lanes[node]["bottom"] <= mine[0]["top"] and mine[0]["bottom"] <= mine[1]["top"]
        assert after is None or mine[1]["bottom"] <= lanes[after]["top"]
        shapes = [s for s in shown["shapes"] if s["node"] == node]
        assert sorted({s["kind"] for s in shapes}) == ["cpu", "gpu", "steps"]
        assert all(mine[0]["top"] - 1 <= s["top"] and s["bottom"] <= mine[1]["bottom"] + 1 for s in shapes)
    assert not [r for r in shown["rows"] if r["node"] == "w-0"]
    assert len(shown["columns"]) == 24 and all(c["hit"] == c["at"] for c in shown["columns"])
    wide = [s for s in shown["states"] if s["width"] >= 20]  # narrower ones may lie under a mark
    assert len(wide) >= 9 and all(s["hit"] == s["state"] for s in wide)  # the rows cover no lane


def test_a_replaced_nodes_earlier_start_is_drawn_beside_its_replacement(tmp_path):
    """The health record of a node replaced at T0 + 3: both starts' samples are read, each drawn as its own."""
    store = WorkDir(str(tmp_path / "run"))
    first = HealthRecord(store, "m")
    for at in (T0 + 1, T0 + 2):
        first.add(sample(at, 100, (), {0: 1.0}))
    replacement = HealthRecord(store, "m", incarnation=1)
    for at in (T0 + 4, T0 + 5):
        replacement.add(sample(at, 200, (), {0: 2.0}))
    drawn = read_utilisation(store, ["m"])
    assert [(each.incarnation, [point[0] for point in each.points]) for each in drawn] == \
        [(0, [T0 + 1, T0 + 2]), (1, [T0 + 4, T0 + 5])]
    timeline = tl.Timeline("r", T0, ["m"], [tl.Event(T0, tl.SUBMITTED)], T0 + 6, health=drawn)
    root = ElementTree.fromstring(timeline_svg.svg(timeline))
    assert len(of_class(root, "steps", "m")) == 2  # a line of steps/s for each start
