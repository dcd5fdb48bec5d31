"""The run timeline (issue 29, item 1): events recorded by the nodes, derived from the run's records, shown as a
table and drawn as a picture that a real headless browser renders with lanes and marks where the records say."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import threading
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from clirun import run_id_from
from cluster import write_spec
from conftest import require, run_cli
from test_oci import project, sim  # noqa: F401 - fixtures: the OCI simulation and the seed 004 project in it
from launcher.commands.timeline import breakdown, table_rows
from launcher.protocol import events as node_events
from launcher.protocol.events import EventLog
from launcher.protocol.store import WorkDir
from launcher.runs import timeline as tl
from launcher.runs.recoveries import recoveries

T0 = 1_000_000.0  # submitted


def batch(node: str, incarnation: int, *events: tuple) -> dict:
    """An events batch as a node writes it: (phase, seconds after submit, fields)."""
    return {"node": node, "incarnation": incarnation,
            "events": [{"phase": phase, "at": T0 + seconds, **(fields[0] if fields else {})}
                       for phase, seconds, *fields in events]}


def happy_node(node: str, offset: float, ranks: tuple[int, ...], round_number: int | None = None) -> dict:
    r = {} if round_number is None else {"round": round_number}
    return batch(node, 0, ("started", 0.2 + offset, {"pid": 7}), ("registered", 0.5 + offset, r),
                 ("decided", 0.6 + offset, {**r, "rank": ranks[0]}), ("torchrun", 0.7 + offset, {"round": 0}),
                 *[("first-line", 3.0 + offset + rank / 10, {"round": 0, "rank": rank}) for rank in ranks],
                 *[("last-line", 5.0 + offset + rank / 10, {"round": 0, "rank": rank}) for rank in ranks],
                 ("exited", 6.0 + offset, {"round": 0, "code": 0}), ("synced", 6.1 + offset))


def static_records() -> tl.Records:
    return tl.Records(
        run={"created_at": T0},
        batches=[happy_node("m", 0.0, (0, 1)), happy_node("w-0", 0.05, (2, 3))],
        statuses={"m": {"state": "succeeded", "exit_code": 0, "ended_at": T0 + 6.2, "updated_at": T0 + 6.2},
                  "w-0": {"state": "succeeded", "exit_code": 0, "ended_at": T0 + 6.3, "updated_at": T0 + 6.3}})


def timeline_of(records: tl.Records, nodes: list[str], read_at: float = T0 + 100) -> tl.Timeline:
    found = tl.derive(records)
    recovering = any(event.phase == tl.ROUND_DECIDED and event.round is not None for event in found)
    return tl.Timeline("r", T0, nodes, found, read_at, recovering)


def test_a_static_run_has_every_phase_of_every_node_in_order():
    found = timeline_of(static_records(), ["m", "w-0"])
    for node in ("m", "w-0"):
        phases = [event.phase for event in found.node_events(node)]
        assert phases == ["started", "registered", "decided", "torchrun", "first-line", "first-line", "last-line",
                          "last-line", "exited", "synced", tl.RECORDED]
    run_level = [(event.phase, round(found.seconds(event.at), 3)) for event in found.events if event.node is None]
    assert run_level == [(tl.SUBMITTED, 0.0), (tl.ROUND_DECIDED, 0.6)]  # the first node to learn the decision
    assert not found.recovering
    assert [event.rank for event in found.node_events("w-0") if event.phase == "first-line"] == [2, 3]


def test_the_table_shows_seconds_from_submit_with_each_nodes_earliest_first_and_latest_last_line():
    rows = table_rows(timeline_of(static_records(), ["m", "w-0"]))
    assert rows[0] == ["PHASE", "run", "m", "w-0"]
    by_label = {row[0]: row[1:] for row in rows[1:]}
    assert by_label["submitted"] == ["0.00", "", ""]
    assert by_label["first training line"] == ["", "3.00", "3.25"]  # ranks 0 and 2
    assert by_label["last training line"] == ["", "5.10", "5.35"]  # ranks 1 and 3
    assert by_label["final status recorded"] == ["", "6.20", "6.30"]
    assert [row[0] for row in rows[1:3]] == ["submitted", "process started"]  # rows in time order


def test_a_row_whose_one_node_ended_long_before_the_others_stays_among_the_rows_of_its_time():
    """A node lost early (its final status recorded at 2 s) and two that recorded theirs at 640 s: the row of final
    statuses comes after the rows of 5 and 6 s, not above them, as ordering rows by their earliest cell put it."""
    records = static_records()
    records.batches.append(batch("w-1", 0, ("started", 0.2), ("registered", 0.5), ("decided", 0.6, {"rank": 4})))
    records.statuses["w-1"] = {"state": "lost", "exit_code": 137, "ended_at": T0 + 2.0, "updated_at": T0 + 2.0}
    for node in ("m", "w-0"):
        records.statuses[node]["updated_at"] = T0 + 640.0
    labels = [row[0] for row in table_rows(timeline_of(records, ["m", "w-0", "w-1"]))[1:]]
    assert labels.index("final status recorded") > labels.index("outputs synced") > labels.index("last training line")


def test_segments_colour_each_stretch_by_what_the_node_did():
    spans = [(s.state, round(s.start - T0, 2), round(s.end - T0, 2))
             for s in tl.segments(timeline_of(static_records(), ["m", "w-0"])) if s.node == "m"]
    assert spans == [(tl.STARTING, 0.2, 0.5), (tl.WAITING, 0.5, 0.6), (tl.PREPARING, 0.6, 0.7),
                     (tl.LAUNCHING, 0.7, 3.0), (tl.TRAINING, 3.0, 5.1), (tl.STOPPING, 5.1, 6.0),
                     (tl.SYNCING, 6.0, 6.1), (tl.RECORDING, 6.1, 6.2)]


def round_zero(rank: int) -> list[tuple]:
    """A member's events in round 0 up to its first training line."""
    return [("started", 0.2), ("registered", 0.5, {"round": 0}), ("decided", 0.6, {"round": 0, "rank": rank}),
            ("torchrun", 0.7, {"round": 0}), ("first-line", 3.0, {"round": 0, "rank": rank})]


def recovery_records() -> tl.Records:
    """3 nodes in round 0; w-1 killed at 10 s; its replacement joins; round 1 trains again at 14 s."""
    round_one = [("registered", 11.0, {"round": 1}), ("decided", 12.0, {"round": 1, "rank": 0}),
                 ("restored", 12.5, {"round": 1, "files": 3}), ("torchrun", 12.6, {"round": 1})]
    survivors = [batch(node, 0, *round_zero(rank), ("last-line", 9.9, {"round": 0, "rank": rank}),
                       ("exited", 10.4, {"round": 0, "code": -15}), *round_one,
                       ("first-line", 14.0 + rank, {"round": 1, "rank": rank}))
                 for node, rank in (("m", 0), ("w-0", 1))]
    replacement = batch("w-1", 1, ("started", 10.3), ("registered", 11.5, {"round": 1}),
                        ("decided", 12.0, {"round": 1, "rank": 2}), ("torchrun", 12.7, {"round": 1}),
                        ("first-line", 14.5, {"round": 1, "rank": 2}))
    return tl.Records(
        run={"created_at": T0}, rounds=[0, 1],
        batches=[*survivors, batch("w-1", 0, *round_zero(2)), replacement],
        ends={0: [{"node": "w-1", "kind": "lost", "reason": "node process killed by SIGKILL", "at": T0 + 10.0},
                  {"node": "w-1", "kind": "join", "reason": "replacement 1 joins", "at": T0 + 10.6},
                  {"node": "m", "kind": "peer", "reason": "rank 0 lost a peer", "at": T0 + 10.2}]},
        statuses={"w-1": {"state": "running", "round": 1, "updated_at": T0 + 15}},
        scales=[{"nodes": 4, "at": T0 + 16.0, "from": ["m", "w-0", "w-1"], "add": ["w-2"], "remove": []}],
        leaves=[{"node": "w-0", "reason": "the run was scaled to 2 nodes", "at": T0 + 18.0}])


def test_recovery_derives_death_round_end_replacement_and_training_again():
    found = timeline_of(recovery_records(), ["m", "w-0", "w-1"])
    assert found.recovering
    death = [event for event in found.events if event.phase == tl.DEATH]
    assert [(e.node, e.round, e.incarnation, e.at - T0) for e in death] == [("w-1", 0, 0, 10.0)]
    ended = [event for event in found.events if event.phase == tl.ROUND_ENDED and event.node is None]
    assert [(e.round, e.at - T0) for e in ended] == [(0, 10.0)] and "w-1" in ended[0].detail
    joins = [e for e in found.events if e.phase == tl.JOINS]
    assert [(e.node, e.incarnation) for e in joins] == [("w-1", 1)]  # the replacement, started at 10.3
    again = [event for event in found.events if event.phase == tl.TRAINING_AGAIN]
    assert [(e.round, e.at - T0, e.detail) for e in again] == [(1, 14.0, "4.00 s after round 0 ended")]
    decided = [(e.round, round(e.at - T0, 3)) for e in found.events if e.phase == tl.ROUND_DECIDED]
    assert decided == [(0, 0.6), (1, 12.0)]
    assert [e.detail for e in found.events if e.phase == tl.SCALE] == ["3 -> 4 nodes (+w-2)"]
    assert [(e.node, e.detail) for e in found.events if e.phase == tl.LEAVE_ASKED] == [
        ("w-0", "the run was scaled to 2 nodes")]


def test_a_dead_incarnations_lane_ends_at_its_death_and_its_replacements_begins_at_its_start():
    spans = [s for s in tl.segments(timeline_of(recovery_records(), ["m", "w-0", "w-1"])) if s.node == "w-1"]
    first = [s for s in spans if s.incarnation == 0]
    second = [s for s in spans if s.incarnation == 1]
    assert first[-1].state == tl.TRAINING and first[-1].end == T0 + 10.0
    assert (second[0].state, second[0].start) == (tl.STARTING, T0 + 10.3)
    assert (second[-1].state, second[-1].end) == (tl.TRAINING, T0 + 100)  # still running: up to when it was read
    survivor = [(s.state, round(s.start - T0, 3)) for s in tl.segments(timeline_of(recovery_records(), ["m"]))]
    assert (tl.SYNCING, 10.4) in survivor and (tl.WAITING, 11.0) in survivor and (tl.PREPARING, 12.0) in survivor


def test_a_node_its_supervisor_recorded_dead_and_damaged_records():
    records = static_records()
    records.batches[1] = batch("w-0", 0, *round_zero(2))  # killed while training: nothing more recorded
    records.statuses["w-0"] = {"state": "failed", "exit_code": 137, "reason": "node process killed by SIGKILL",
                               "ended_at": T0 + 4.0, "updated_at": T0 + 4.2, "reported_by": "supervisor"}
    records.batches.append({"node": "x", "events": "not a list"})
    records.batches.append({"node": "m", "incarnation": 0, "events": [{"phase": "bogus", "at": T0}, {"at": "x"}]})
    records.cancel = {"reason": "cancelled by user", "at": T0 + 4.5}
    found = timeline_of(records, ["m", "w-0"])
    ended = [(e.phase, round(e.at - T0, 3)) for e in found.node_events("w-0")][-2:]
    assert ended == [(tl.DEATH, 4.0), (tl.RECORDED, 4.2)]
    assert tl.segments(found)[-1] == tl.Segment("w-0", 0, tl.TRAINING, T0 + 3.0, T0 + 4.0)
    assert [e.detail for e in found.events if e.phase == tl.CANCELLED] == ["cancelled by user"]
    assert {e.node for e in found.events} == {None, "m", "w-0"}


def test_the_event_log_writes_batches_and_the_rest_when_closed(tmp_path):
    store = WorkDir(str(tmp_path / "run"))
    log = EventLog(store, "w-0", 2, interval=0.0).start()
    log.record(node_events.REGISTERED, round=3)
    log.first_line(3)(5, 123.0)
    log.training_ended(3, 0, {5: 124.0})
    log.close()
    keys = store.find(f"{node_events.EVENTS_PREFIX}/w-0")
    assert keys and all(re.fullmatch(r"002\.\d{4}\.json", key) for key in keys)
    events = [event for key in keys for event in store.get_record(f"events/w-0/{key}")["events"]]
    assert [event["phase"] for event in events] == ["started", "registered", "first-line", "last-line", "exited"]
    assert events[2] == {"phase": "first-line", "at": 123.0, "round": 3, "rank": 5}
    assert events[0]["at"] <= events[1]["at"]  # the process started before it registered


class NotedPuts(WorkDir):
    """A local work dir that lets a test await each write instead of sleeping."""

    def __init__(self, root: str):
        super().__init__(root)
        self.written = threading.Event()

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        self.written.set()


def test_events_that_arrive_between_writes_share_one_request(tmp_path):
    store = NotedPuts(str(tmp_path / "run"))
    log = EventLog(store, "w-0", 0, interval=3600.0).start()
    assert store.written.wait(30), "the first event is written at once"
    for rank in range(40):
        log.first_line(0)(rank, 100.0 + rank)
    log.close()
    keys = store.find(f"{node_events.EVENTS_PREFIX}/w-0")
    assert keys == ["000.0000.json", "000.0001.json"], "40 events in the interval: one more request, not 40"
    later = store.get_record("events/w-0/000.0001.json")["events"]
    assert [event["rank"] for event in later] == list(range(40))


def test_the_cli_refuses_a_picture_it_cannot_write(tmp_path, launcher_home):
    done = run_cli("timeline", "-o", str(tmp_path / "run.png"))
    assert done.returncode == 2 and "html or .svg" in done.stderr


# -- a real run -----------------------------------------------------------------------------------------------

SCRIPT = """
import os
print(f"rank {os.environ['RANK']} starts", flush=True)
print(f"rank {os.environ['RANK']} ends", flush=True)
"""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real 2-node local run (2 training processes per node, real torchrun) that succeeded."""
    directory = tmp_path_factory.mktemp("timeline")
    env = {**os.environ, "LAUNCHER_HOME": str(directory / "home")}
    spec = write_spec(directory, SCRIPT, nodes=2, extra_cluster={"processesPerNode": 2})
    done = run_cli("run", "-f", str(spec), cwd=directory, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    return directory, env, run_id, directory / "wd" / run_id


def records_of(work: Path) -> dict:
    """What the run's records say, read as plain files (not through launcher): per node, each phase's times."""
    submitted = json.loads((work / "run.json").read_text())["created_at"]
    phases: dict[str, dict[str, list]] = {}
    for path in sorted((work / "events").glob("*/*.json")):
        body = json.loads(path.read_text())
        for event in body["events"]:
            phases.setdefault(body["node"], {}).setdefault(event["phase"], []).append(event)
    for path in (work / "status").glob("*.json"):
        status = json.loads(path.read_text())
        phases[status["node"]]["recorded"] = [{"at": status["updated_at"]}]
    return {"submitted": submitted, "phases": phases}


@pytest.mark.xdist_group("timeline")
def test_a_real_run_records_every_phase_and_the_cli_shows_them(finished_run, tmp_path):
    directory, env, run_id, work = finished_run
    said = records_of(work)
    nodes = ["t-main", "t-worker-0"]
    assert sorted(said["phases"]) == nodes
    order = ["started", "registered", "decided", "torchrun", "first-line", "last-line", "exited", "synced", "recorded"]
    for node in nodes:
        phases = said["phases"][node]
        firsts = [min(event["at"] for event in phases[phase]) for phase in order]
        assert firsts == sorted(firsts) and firsts[0] >= said["submitted"] - 1, (node, phases)
        assert sorted(event["rank"] for event in phases["first-line"]) == sorted(event["rank"]
                                                                               for event in phases["last-line"])
    ranks = sorted(event["rank"] for node in nodes for event in said["phases"][node]["first-line"])
    assert ranks == [0, 1, 2, 3]
    for node in nodes:  # at most one batch per interval while the node lived, and the last when it closed
        batches = list((work / "events" / node).glob("*.json"))
        events = [event for batch in batches for event in json.loads(batch.read_text())["events"]]
        lived = max(event["at"] for event in events) - min(event["at"] for event in events)
        assert all(json.loads(batch.read_text())["events"] for batch in batches)
        assert len(batches) <= lived / node_events.LOCAL_INTERVAL + 2, (node, len(batches), lived)

    done = run_cli("timeline", run_id, "--json", env=env)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["nodes"] == nodes and not shown["recovering"]
    recorded = {(e["node"], e["phase"], e["rank"]): e["seconds"] for e in shown["events"]}
    for node in nodes:
        for event in said["phases"][node]["first-line"]:
            assert recorded[(node, "first-line", event["rank"])] == pytest.approx(event["at"] - said["submitted"])

    done = run_cli("timeline", run_id, "-o", str(tmp_path / "run.html"), env=env)
    assert done.returncode == 0, done.stderr
    table = done.stdout.splitlines()
    assert table[0] == f"run {run_id}: seconds from submit (2 nodes)"
    assert table[1].split() == ["PHASE", "run", *nodes]
    row = next(line for line in table if line.startswith("torchrun started")).split()
    expected = [f"{min(e['at'] for e in said['phases'][node]['torchrun']) - said['submitted']:.2f}" for node in nodes]
    assert row[2:] == expected
    page = (tmp_path / "run.html").read_text()
    assert "<script" not in page and "<link" not in page and "http" not in page  # nothing to fetch: opens offline
    assert run_cli("timeline", run_id, "-o", str(tmp_path / "run.svg"), env=env).returncode == 0
    root = ElementTree.parse(tmp_path / "run.svg").getroot()  # well-formed, standalone SVG
    assert root.tag == "{http://www.w3.org/2000/svg}svg"


MEASURE = """<script>
const out = {lanes: {}, states: [], marks: []};
const svg = document.querySelector('svg');
const box = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
                                                                   bottom: r.bottom}; };
out.svg = {...box(svg), x0: +svg.dataset.x0, scale: +svg.dataset.pxPerS};
for (const g of document.querySelectorAll('[data-lane]')) out.lanes[g.dataset.lane] = box(g.querySelector('rect'));
for (const e of document.querySelectorAll('[data-state]')) {
  const b = box(e);
  const hit = document.elementFromPoint((b.left + b.right) / 2, (b.top + b.bottom) / 2);
  out.states.push({...b, node: e.dataset.node, state: e.dataset.state, attempt: e.dataset.attempt,
                   hit: hit && hit.dataset.state || null});
}
out.attempts = [...document.querySelectorAll('rect.attempt')].map(e => ({...box(e), attempt: e.dataset.attempt}));
out.ends = [...document.querySelectorAll('[data-ended]')].map(e => ({ended: e.dataset.ended,
  attempt: e.dataset.attempt, text: e.firstChild.textContent}));
for (const e of document.querySelectorAll('[data-phase]'))
  out.marks.push({...box(e), node: e.dataset.node, phase: e.dataset.phase, rank: e.dataset.rank || null});
const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def measured_in_chromium(page: Path, tmp_path: Path, script: str = MEASURE) -> dict:
    """Open ``page`` in headless chromium with a measuring ``script`` added (it leaves its JSON in
    ``<pre id="measured">``); what its layout engine placed where."""
    chromium = shutil.which("chromium")
    require(chromium is not None, "chromium is not installed (apt-get install chromium)")
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1400",
                           f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.xdist_group("timeline")
def test_a_browser_draws_lanes_and_marks_where_the_records_say(finished_run, tmp_path):
    directory, env, run_id, work = finished_run
    assert run_cli("timeline", run_id, "-o", str(tmp_path / "run.html"), env=env).returncode == 0
    shown = measured_in_chromium(tmp_path / "run.html", tmp_path)
    said = records_of(work)
    nodes = ["t-main", "t-worker-0"]

    def x_of(at: float) -> float:
        return shown["svg"]["left"] + shown["svg"]["x0"] + (at - said["submitted"]) * shown["svg"]["scale"]

    lanes = shown["lanes"]
    assert list(lanes) == ["run", *nodes]
    assert lanes["run"]["bottom"] <= lanes["t-main"]["top"] and lanes["t-main"]["bottom"] <= lanes["t-worker-0"]["top"]
    for node in nodes:
        phases = said["phases"][node]
        mine = [state for state in shown["states"] if state["node"] == node]
        assert all(lanes[node]["top"] <= s["top"] and s["bottom"] <= lanes[node]["bottom"] for s in mine)
        starting = next(s for s in mine if s["state"] == tl.STARTING)
        assert starting["left"] == pytest.approx(x_of(phases["started"][0]["at"]), abs=1)
        training = next(s for s in mine if s["state"] == tl.TRAINING)
        assert training["left"] == pytest.approx(x_of(min(e["at"] for e in phases["first-line"])), abs=1)
        assert training["right"] == pytest.approx(x_of(max(e["at"] for e in phases["last-line"])), abs=1)
        widest = max(mine, key=lambda s: s["right"] - s["left"])
        assert widest["hit"] == widest["state"]  # the browser paints it there, on top
        for event in phases["first-line"]:
            tick = next(m for m in shown["marks"] if m["node"] == node and m["phase"] == "first-line"
                        and m["rank"] == str(event["rank"]))
            assert (tick["left"] + tick["right"]) / 2 == pytest.approx(x_of(event["at"]), abs=1)
            assert lanes[node]["top"] <= tick["top"] and tick["bottom"] <= lanes[node]["bottom"]
        end = next(m for m in shown["marks"] if m["node"] == node and m["phase"] == tl.RECORDED)
        assert (end["left"] + end["right"]) / 2 == pytest.approx(x_of(phases["recorded"][0]["at"]), abs=1)


def retried_run(tmp_path: Path):
    """A run of node m retried whole twice, each attempt 10 s after the one before: attempt 1 lost m at 6.2 s,
    attempt 2 failed at 16.2 s, attempt 3 succeeded. Each attempt's records are in its own namespace; the attempt
    records say how the one before ended, a second after it (attempt 3's start claim, later still)."""
    from launcher.runs.attempts import Attempt, key, namespace, start_key
    from launcher.runs.state import RunInfo

    info = RunInfo("r", "oci", str(tmp_path), ["m"], "", "", T0, backend_ids={"recovery": {"maxRestarts": 2}})
    top = WorkDir(info.run_url)
    top.put("run.json", json.dumps({"created_at": T0}).encode())
    ends = {1: ("lost", "job run failed", 6.2), 2: ("failure", "rank 0: ValueError", 16.2), 3: ("succeeded", "", 26.2)}
    for number, (kind, reason, ended) in ends.items():
        store = top if number == 1 else WorkDir(namespace(info.run_url, "r", number))
        offset = 10.0 * (number - 1)
        store.put("events/m/000.0000.json", json.dumps(happy_node("m", offset, (0,))).encode())
        state = "succeeded" if kind == "succeeded" else "failed"
        store.put("status/m.json", json.dumps({"state": state, "updated_at": T0 + ended + 0.3}).encode())
        if number > 1:
            before = ends[number - 1]
            top.put(key(number), Attempt(number, store.url, {"node": "m", "kind": before[0], "reason": before[1],
                                                             "at": T0 + before[2]}, True, restarts=number - 1,
                                         at=T0 + before[2] + 1.0).to_bytes())
    top.put(start_key(3), json.dumps({"at": T0 + 17.5}).encode())  # attempt 3's start was claimed later
    return info


def test_a_run_retried_whole_shows_every_attempt_labelled_in_order_with_why_each_ended(tmp_path):
    found = tl.read_timeline(retried_run(tmp_path))
    assert (found.nodes, found.attempts) == (["m"], 3)
    ran = [(e.phase, e.attempt, round(found.seconds(e.at), 3)) for e in found.events
           if e.phase in (tl.SUBMITTED, tl.ATTEMPT, tl.ATTEMPT_ENDED, "started", tl.RECORDED)]
    assert ran == [(tl.SUBMITTED, 1, 0.0), ("started", 1, 0.2), (tl.ATTEMPT_ENDED, 1, 6.2), (tl.RECORDED, 1, 6.5),
                   (tl.ATTEMPT, 2, 7.2), ("started", 2, 10.2), (tl.ATTEMPT_ENDED, 2, 16.2), (tl.RECORDED, 2, 16.5),
                   (tl.ATTEMPT, 3, 17.5), ("started", 3, 20.2), (tl.RECORDED, 3, 26.5)]
    rows = table_rows(found)
    assert rows[0] == ["PHASE", "run", "m", "CAUSE"]
    labels = [row[0] for row in rows[1:]]
    for attempt in (1, 2, 3):
        mine = [label for label in labels if label.endswith(f"(attempt {attempt})")]
        assert mine == [f"{phase} (attempt {attempt})" for phase in (
            "process started", "registered", "ranks decided", "rank learned", "torchrun started",
            "first training line", "last training line", "torchrun exited", "outputs synced",
            "final status recorded")], labels
    by_label = {row[0]: row[1:] for row in rows[1:]}
    assert by_label["final status recorded (attempt 3)"] == ["", "26.50", ""]  # the run's real end
    assert by_label["attempt 1 ended"] == [
        "6.20", "", "node m: job run failed; retried as attempt 2 (restart 1 of 2)"]
    assert by_label["attempt 2 ended"][0] == "16.20" and "rank 0: ValueError" in by_label["attempt 2 ended"][2]
    assert labels.index("attempt 1 ended") < labels.index("attempt 2 started") < labels.index(
        "process started (attempt 2)") < labels.index("attempt 2 ended") < labels.index("attempt 3 started")
    spans = [(s.attempt, s.state, round(s.start - T0, 2), round(s.end - T0, 2)) for s in tl.segments(found)]
    assert [span for span in spans if span[1] == tl.TRAINING] == [(1, tl.TRAINING, 3.0, 5.0),
                                                                 (2, tl.TRAINING, 13.0, 15.0),
                                                                 (3, tl.TRAINING, 23.0, 25.0)]
    from launcher import timeline_svg

    drawn = ElementTree.fromstring(timeline_svg.svg(found))
    bands = [(e.get("data-attempt"), float(e.get("data-t")), float(e.get("data-end")))
             for e in drawn.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "attempt"]
    assert bands == [("1", 0.0, 6.5), ("2", 7.2, 16.5), ("3", 17.5, 26.5)]
    notes = ["".join(e.itertext()) for e in drawn.iter("{http://www.w3.org/2000/svg}text") if e.get("data-ended")]
    assert notes[0].startswith("attempt 1 ended at 6.20 s: node m: job run failed; retried as attempt 2")
    assert [note.split(":")[0] for note in notes] == ["attempt 1 ended at 6.20 s", "attempt 2 ended at 16.20 s"]


def test_a_recovering_runs_rows_name_the_attempt_and_the_round_and_why_a_round_ended():
    from launcher.commands.timeline import row_label

    events = [tl.Event(T0 + 1, "torchrun", "m", 0, attempt=2),
              tl.Event(T0 + 2, tl.ROUND_ENDED, None, 0, attempt=2, detail="node m: lost: killed by SIGKILL"),
              tl.Event(T0 + 3, tl.TRAINING_AGAIN, None, 1, attempt=2), tl.Event(T0 + 4, tl.RECORDED, "m", 1, attempt=2)]
    found = tl.Timeline("r", T0, ["m"], events, T0 + 10, recovering=True, attempts=2)
    assert [row_label(found, event) for event in events] == [
        "torchrun started (attempt 2, round 0)", "round 0 ended (attempt 2)", "training again (attempt 2, round 1)",
        "final status recorded (attempt 2)"]
    assert table_rows(found)[2] == ["round 0 ended (attempt 2)", "2.00", "", "node m: lost: killed by SIGKILL"]
    alone = tl.Timeline("r", T0, ["m"], events, T0 + 10, recovering=True)  # one attempt: rows as they always were
    assert [row_label(alone, event) for event in events] == [
        "torchrun started (round 0)", "round 0 ended", "training again (round 1)", "final status recorded"]


def test_an_attempt_that_was_not_started_says_why_and_a_killed_node_lane_ends_at_the_next_attempt(tmp_path):
    from launcher.runs.attempts import Attempt, key

    info = retried_run(tmp_path)
    top = WorkDir(info.run_url)
    (tmp_path / "r" / "status" / "m.json").unlink()  # attempt 1's node died without a word
    top.put(key(4), Attempt(4, "", {}, False, 2, given_up="gave up after 2 of 2 restarts: node m",
                            at=T0 + 30.0).to_bytes())
    found = tl.read_timeline(info)
    assert found.attempts == 3  # attempt 4 never ran
    assert [(e.attempt, e.detail) for e in found.events if e.phase == tl.ATTEMPT_ENDED][-1] == (
        3, "gave up after 2 of 2 restarts: node m")
    first = [s for s in tl.segments(found) if s.attempt == 1]
    assert (first[-1].state, first[-1].end) == (tl.RECORDING, T0 + 7.2)  # to attempt 2's start, not to the read



# -- a real run retried whole: the OCI simulation's native retries ---------------------------------------------------

VICTIM = "PyTorch-Distributed-worker-1"


def cells_of(table: list[str]) -> list[dict[str, str]]:
    """The rows of ``launcher timeline``'s table, each column's cell cut where the header's column begins."""
    names, starts = table[0].split(), [0]
    for name in names[1:]:
        starts.append(table[0].index(f" {name}", starts[-1]) + 1)
    bounds = list(zip(starts, starts[1:] + [None]))
    return [{name: line[start:end].strip() for name, (start, end) in zip(names, bounds)} for line in table[1:]]


def recorded_attempts(sim, run_id: str) -> list[dict]:
    """The attempt records as the simulated object store holds them, read without launcher."""
    prefix = f"launcher/{run_id}/attempts/"
    found = [json.loads(body) for (_, _, name), (body, _) in sim.objects.items()
             if name.startswith(prefix) and re.fullmatch(r"\d+\.json", name[len(prefix):])]
    return sorted(found, key=lambda record: record["number"])


@pytest.mark.slow
def test_a_real_run_retried_whole_shows_each_attempt_in_the_table_and_the_picture(project, sim, tmp_path):
    """Native OCI, maxRestarts 1: the replica of NODE_RANK 2 is killed at its first epoch in every attempt, so the
    run is retried whole once and then gives up. The timeline has every attempt's rows, labelled and in order,
    each attempt's end with its cause, and the picture a band per attempt holding that attempt's stretches."""
    spec, env = project
    sim.dying["PyTorch-Distributed#2"] = "dies"
    done = run_cli("run", "-f", str(spec), "--run-id", "tl-retry", "--set",
                   "spec.cluster.spec.recovery={maxRestarts: 1}", "--", "--epochs", "2", env=env, timeout=600)
    assert done.returncode != 0 and "attempt 2 started" in done.stdout, done.stdout + done.stderr
    records = recorded_attempts(sim, "tl-retry")
    assert [(r["number"], r["started"]) for r in records] == [(2, True), (3, False)]

    shown = json.loads(run_cli("timeline", "tl-retry", "--json", env=env).stdout)
    assert shown["attempts"] == 2
    ends = [event for event in shown["events"] if event["phase"] == tl.ATTEMPT_ENDED]
    assert [event["attempt"] for event in ends] == [1, 2]
    for event, record in zip(ends, records):
        assert event["at"] == pytest.approx(record["cause"].get("at") or record["at"])
    assert "retried as attempt 2 (restart 1 of 1)" in ends[0]["detail"] and VICTIM in ends[0]["detail"]
    assert "exit code 137" in ends[0]["detail"]
    assert ends[1]["detail"] == records[1]["given_up"] and ends[1]["detail"].startswith("gave up after 1 of 1")

    done = run_cli("timeline", "tl-retry", "-o", str(tmp_path / "run.html"), env=env)
    assert done.returncode == 0, done.stderr
    rows = cells_of(done.stdout.split("\n\n")[0].splitlines()[1:])  # the table: after its header line, before what follows it
    assert list(rows[0])[-1] == "CAUSE"
    labels = [row["PHASE"] for row in rows]
    by_label = {row["PHASE"]: row for row in rows}
    for attempt in (1, 2):
        for phase in ("process started", "torchrun started", "first training line", "final status recorded"):
            assert f"{phase} (attempt {attempt})" in labels, (attempt, labels)
        assert labels.index(f"attempt {attempt} ended") > labels.index(f"torchrun started (attempt {attempt})")
        assert by_label[f"attempt {attempt} ended"]["CAUSE"] == ends[attempt - 1]["detail"]
        assert by_label[f"attempt {attempt} ended"]["run"] == f"{ends[attempt - 1]['seconds']:.2f}"
    assert labels.index("attempt 1 ended") < labels.index("attempt 2 started") < labels.index(
        "process started (attempt 2)")
    times = [float(cell) for row in rows for column, cell in row.items() if column not in ("PHASE", "CAUSE") and cell]
    last = max(float(cell) for column, cell in by_label["final status recorded (attempt 2)"].items()
               if column not in ("PHASE", "CAUSE") and cell)
    assert last == max(times)  # the table ends where the run did: attempt 2's final statuses

    page = measured_in_chromium(tmp_path / "run.html", tmp_path)
    bands = page["attempts"]
    assert [band["attempt"] for band in bands] == ["1", "2"]
    assert all(a["right"] <= b["left"] + 1 for a, b in zip(bands, bands[1:]))  # side by side on one time axis
    run_lane = page["lanes"]["run"]
    assert all(run_lane["top"] <= band["top"] and band["bottom"] <= run_lane["bottom"] for band in bands)
    for band in bands:
        mine = [state for state in page["states"] if state["attempt"] == band["attempt"]]
        assert mine and all(band["left"] - 1 <= s["left"] and s["right"] <= band["right"] + 1 for s in mine), band
    assert [(end["ended"], end["attempt"]) for end in page["ends"]] == [(tl.ATTEMPT_ENDED, "1"),
                                                                          (tl.ATTEMPT_ENDED, "2")]
    assert all(end["text"].startswith(f"attempt {end['attempt']} ended at ") for end in page["ends"])
    assert page["ends"][0]["text"].endswith("; retried as attempt 2 (restart 1 of 1)")  # cut in the middle if long


def test_a_recovery_is_broken_down_by_phase_and_names_whom_each_waited_for():
    records = recovery_records()
    for each in records.batches:
        if each["node"] == "w-1" and each["incarnation"] == 1:  # the replacement, started cold
            each["events"] += [{"phase": "rank-started", "at": T0 + 14.2, "round": 1, "rank": 2},
                               {"phase": "first-step", "at": T0 + 15.5, "round": 1, "rank": 2, "source": "loader"},
                               {"phase": "first-step", "at": T0 + 15.9, "round": 1, "rank": 2, "source": "optimizer"}]
        elif each["incarnation"] == 0 and each["node"] != "w-1":
            rank = 0 if each["node"] == "m" else 1
            each["events"] += [{"phase": "rank-started", "at": T0 + 13.0, "round": 1, "rank": rank},
                               {"phase": "first-step", "at": T0 + 15.0, "round": 1, "rank": rank,
                                "source": "optimizer"}]
    found = timeline_of(records, ["m", "w-0", "w-1"])
    again = [event for event in found.events if event.phase == tl.TRAINING_AGAIN]
    # the last rank's first step, by the optimizer (which comes before the loader's batch in precedence)
    assert [(e.round, round(e.at - T0, 2)) for e in again] == [(1, 15.9)]
    [recovery] = recoveries(found)
    assert (recovery.round, recovery.kind, recovery.node) == (1, "lost", "w-1")
    assert [(p.name, None if p.at is None else round(p.at - T0, 2), p.node) for p in recovery.phases] == [
        ("ended", 10.0, "w-1"), ("registered", 11.5, "w-1"), ("round-decided", 12.0, None),
        ("torchrun", 12.7, "w-1"), ("rank-started", 14.2, "w-1"), ("first-step", 15.9, "w-1")]
    assert recovery.cold == ("m", "w-0", "w-1")  # no torchrun of round 1 was a spare's
    text = breakdown(found, recovery)
    assert text.splitlines()[0].startswith("recovery (round 1): death seen at 10.00 s")
    assert "first step" in text and "+5.90" in text and "w-1 (cold: no spare)" in text, text


def test_a_recovery_whose_ranks_count_no_steps_says_so_and_falls_back_to_the_first_line():
    found = timeline_of(recovery_records(), ["m", "w-0", "w-1"])
    [recovery] = recoveries(found)
    assert recovery.phase("first-step").at is None and round(recovery.first_line - T0, 2) == 14.0
    assert "no first step counted" in breakdown(found, recovery)
    assert "first training line +4.00" in breakdown(found, recovery)


def test_a_recovery_whose_round_ended_before_it_trained_says_that_instead():
    records = recovery_records()
    records.ends[1] = [{"node": "m", "kind": "lost", "reason": "node process killed by SIGKILL", "at": T0 + 13.5}]
    records.rounds.append(2)
    found = timeline_of(records, ["m", "w-0", "w-1"])
    recovery = next(each for each in recoveries(found) if each.round == 1)
    text = breakdown(found, recovery)
    assert "the round ended at +3.50 (node m: lost: node process killed by SIGKILL) before every rank counted a step" \
        in text, text
    assert "no first step counted" not in text
