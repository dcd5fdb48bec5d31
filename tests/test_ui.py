"""``launcher ui`` (issue 40) over HTTP, without a browser: who may ask, the run list of a thousand runs, the log
after a cursor, and the verb itself. tests/test_ui_browser.py drives the pages in chromium."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import quote, urlencode

import pytest

from conftest import REPO
from launcher.ui.access import HEADER, Access
from launcher.ui.server import Server
from uirecords import NODES, ship, write_run, write_runs


class Client:
    """Plain HTTP to a running server, with the cookie its secret gives, and any Host header."""

    def __init__(self, server: Server):
        self.port = server.access.port
        self.secret = server.access.secret
        self.cookie = server.access.cookie

    def ask(self, method: str, path: str, *, cookie: bool = True, host: str | None = None,
            headers: dict | None = None, body: bytes | None = None) -> tuple[int, dict, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        sent = {"Host": f"127.0.0.1:{self.port}" if host is None else host, **(headers or {})}
        if cookie:
            sent["Cookie"] = f"{self.cookie}={self.secret}"
        if body is None and method == "POST":
            body = b""
        connection.request(method, path, headers=sent, body=body)
        answer = connection.getresponse()
        body = answer.read()
        connection.close()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, body

    def json(self, path: str) -> dict:
        status, _, body = self.ask("GET", path)
        assert status == 200, body
        return json.loads(body)


@pytest.fixture
def client(launcher_home):
    server = Server("127.0.0.1", 0)
    serving = threading.Thread(target=server.serve, daemon=True)
    serving.start()
    yield Client(server)
    server.stop()
    serving.join()
    server.close()


def test_every_request_needs_the_secret_and_the_url_trades_it_for_a_strict_cookie(client):
    for path in ("/", "/api/runs", "/static/run.js", "/runs/r1", "/api/runs/r1/log"):
        status, _, body = client.ask("GET", path, cookie=False)
        assert status == 403 and b"token" in body, path
        status, _, _ = client.ask("GET", f"{path}?token=not-the-secret", cookie=False)
        assert status == 403, path
    status, headers, _ = client.ask("GET", f"/?state=failed&token={client.secret}", cookie=False)
    assert status == 303 and headers["location"] == "/?state=failed"  # the secret leaves the address
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"launcher_ui_{client.port}={client.secret};")  # each server's own, by its port
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    status, headers, page = client.ask("GET", "/")
    assert status == 200 and f'content="{client.secret}"'.encode() in page
    assert "frame-ancestors 'none'" in headers["content-security-policy"]


def test_only_this_servers_own_address_or_localhost_may_be_the_host(client):
    port = client.port
    assert client.ask("GET", "/api/runs", host=f"localhost:{port}")[0] == 200
    for host in (f"rebound.example:{port}", f"127.0.0.1.example:{port}", f"localhost:{port + 1}", "localhost", ""):
        status, _, body = client.ask("GET", "/api/runs", host=host)
        assert status == 403 and b"Host" in body, host
    anywhere = Access("0.0.0.0", 8123)  # listening on every address: any address literal, never a name
    assert anywhere.host_allowed("10.1.2.3:8123") and anywhere.host_allowed("[::1]:8123")
    assert not anywhere.host_allowed("rebound.example:8123") and not anywhere.host_allowed("10.1.2.3:8124")


def test_no_other_site_may_read_an_answer_or_act(client, launcher_home):
    write_run(launcher_home / "wd", "r1", "succeeded", created_at=time.time())
    origin = {"Origin": "http://elsewhere.example"}
    for method, path in (("GET", "/api/runs"), ("OPTIONS", "/api/runs/r1/cancel"), ("GET", "/api/runs/r1")):
        _, headers, _ = client.ask(method, path, headers={**origin, "Access-Control-Request-Method": "POST"})
        assert not [name for name in headers if name.startswith("access-control-")], (method, path)
    assert client.ask("GET", "/api/runs/r1/cancel")[0] == 405  # a link or an image cannot cancel
    for headers in ({}, {HEADER: "guessed"}):  # a cross-site form sends the cookie at most, never the header
        status, _, body = client.ask("POST", "/api/runs/r1/cancel", headers=headers)
        assert status == 403 and HEADER.encode() in body
    status, _, body = client.ask("POST", "/api/runs/r1/cancel", headers={HEADER: client.secret})
    assert status == 200 and json.loads(body)["message"] == "run r1 already ended: succeeded; nothing to cancel"


def test_run_ids_from_the_url_are_run_ids_recorded_here_nothing_else(client, launcher_home):
    write_run(launcher_home / "wd", "r12345", "succeeded", created_at=time.time())
    (launcher_home / "elsewhere").mkdir()
    for ref, why in (("..", "not a run id"), ("-r1", "not a run id"), ("r1", "no run 'r1'"),  # a prefix is no id
                     (quote("../elsewhere", safe=""), ""), (quote("/etc/passwd", safe=""), "")):  # no such route
        status, _, body = client.ask("GET", f"/api/runs/{ref}")
        assert status == 404 and why in json.loads(body)["error"], ref
    assert client.ask("GET", "/runs/..%2F..")[0] == 404
    status, headers, body = client.ask("GET", "/runs/r1")  # an address a person opens: a page that says why
    assert status == 404 and headers["content-type"].startswith("text/html"), headers
    assert b"no run &#x27;r1&#x27;" in body and b'href="/"' in body, body
    status, headers, body = client.ask("GET", "/runs/%3Cb%3E")
    assert status == 404 and b"<b>" not in body  # what the address holds is shown as text, never as markup
    assert client.json("/api/runs/r12345")["result"] == "succeeded"


def test_a_thousand_runs_are_listed_from_their_records_without_asking_a_backend(client, launcher_home, monkeypatch):
    made = write_runs(launcher_home, 1000)
    import launcher.backends
    import launcher.ui.catalog as catalog

    def no_backend(*args, **kwargs):
        raise AssertionError("the run list asked a backend")

    monkeypatch.setattr(launcher.backends, "backend_for", no_backend)
    parsed, load = [], catalog.load
    monkeypatch.setattr(catalog, "load", lambda path: parsed.append(path) or load(path))
    first = client.json("/api/runs?per_page=50&page=2")
    assert (first["total"], first["pages"]) == (1000, 20)
    assert [run["run_id"] for run in first["runs"]] == [f"r{i:05d}" for i in range(50, 100)]  # newest first
    assert all(run["state"] == made[run["run_id"]] for run in first["runs"])
    assert len(parsed) == 1000
    failed = client.json("/api/runs?state=failed&per_page=200")
    assert failed["total"] == 250 and all(run["state"] == "failed" for run in failed["runs"])
    assert failed["runs"][0]["result"] == ("failed: node t-worker-0 exited with status 1; "
                                           "cause: rank 1: ValueError: bad batch")
    slurm = client.json("/api/runs?backend=slurm&q=r000")
    assert [run["run_id"] for run in slurm["runs"]] == ["r00000", "r00010", "r00020", "r00030", "r00040",
                                                         "r00050", "r00060", "r00070", "r00080", "r00090"]
    parsed.clear()
    again = client.json("/api/runs?state=failed&per_page=200")  # records unchanged: none is parsed again
    assert again == failed and parsed == []
    status, _, body = client.ask("GET", "/api/runs?per_page=5000")
    assert status == 400 and "1 to 200 runs" in json.loads(body)["error"]
    past = client.json("/api/runs?per_page=50&page=99999")  # a link from before runs were cleaned: the last page
    assert (past["page"], past["pages"]) == (20, 20) and past["runs"][-1]["run_id"] == "r00999"
    past_failed = client.json("/api/runs?state=failed&per_page=200&page=7")
    assert (past_failed["page"], past_failed["pages"]) == (2, 2) and len(past_failed["runs"]) == 50


def test_the_log_comes_after_the_pages_cursor_bounded_and_by_rank(client, launcher_home):
    store = write_run(launcher_home / "wd", "r1", "running", created_at=time.time())
    ship(store, "t-main", [("node", "registered", None), *[("out", f"main line {i}", 0) for i in range(3)]])
    ship(store, "t-worker-0", [("out", f"worker line {i}", 1) for i in range(3)])
    first = client.json("/api/runs/r1/log")
    assert [(line["node"], line["who"], line["text"]) for line in first["lines"]] == [
        ("t-main", "[launcher]", "registered"), *[("t-main", "0", f"main line {i}") for i in range(3)],
        *[("t-worker-0", "1", f"worker line {i}") for i in range(3)]]
    ship(store, "t-worker-0", [("out", "worker line 3", 1)])
    after = client.json("/api/runs/r1/log?" + urlencode({"after": first["after"]}))
    assert [line["text"] for line in after["lines"]] == ["worker line 3"] and after["skipped"] == 0
    again = client.json("/api/runs/r1/log?" + urlencode({"after": after["after"]}))
    assert again["lines"] == []
    ranked = client.json("/api/runs/r1/log?rank=1")
    assert [line["text"] for line in ranked["lines"]] == [f"worker line {i}" for i in range(4)]
    # a burst bigger than the page keeps: the newest lines only, and how many were left out
    ship(store, "t-main", [("out", f"burst {i}", 0) for i in range(12_000)], max_lines=1000)
    burst = client.json("/api/runs/r1/log?" + urlencode({"after": again["after"], "limit": 100}))
    assert [line["text"] for line in burst["lines"]] == [f"burst {i}" for i in range(11_900, 12_000)]
    assert burst["skipped"] == 11_900
    cursor = json.loads(burst["after"])
    assert set(cursor) == set(NODES) and cursor["t-main"][0] == 13  # a chunk before, twelve of the burst


def test_the_page_asks_for_the_log_in_a_body_so_a_run_of_many_nodes_keeps_its_cursor(client, launcher_home):
    """A cursor names every node (~70 bytes each): at 1,024 nodes it outgrew the address (414, retried each second).
    The page POSTs its question, with the header a change needs; GET keeps working for a short cursor."""
    from launcher.protocol.store import WorkDir
    from launcher.runs import state

    nodes = [f"node-with-a-long-name-{i:04d}" for i in range(1200)]
    state.save(state.RunInfo(run_id="big", backend="local", work_dir=str(launcher_home / "wd"), nodes=nodes,
                             spec_file="", spec_digest="", created_at=time.time()))
    store = WorkDir(f"{launcher_home / 'wd'}/big")
    for rank, node in enumerate(nodes):
        ship(store, node, [("out", f"line 0 of {node}", rank)])
    first = client.json("/api/runs/big/log")
    assert len(first["lines"]) == 1200 and len(urlencode({"after": first["after"]})) > 65536
    assert client.ask("GET", "/api/runs/big/log?" + urlencode({"after": first["after"]}))[0] == 414
    ship(store, nodes[-1], [("out", "line 1", 1199)])
    question = json.dumps({"after": first["after"], "limit": 100, "final": "0", "rank": ""}).encode()
    sent = {HEADER: client.secret, "Content-Type": "application/json"}
    status, _, body = client.ask("POST", "/api/runs/big/log", headers=sent, body=question)
    assert status == 200, body[:300]
    assert [(line["node"], line["text"]) for line in json.loads(body)["lines"]] == [(nodes[-1], "line 1")]
    status, _, body = client.ask("POST", "/api/runs/big/log", headers={"Content-Type": "application/json"},
                                 body=question)
    assert status == 403  # a question by POST needs the header, as a change does: no other page can ask it
    status, _, body = client.ask("POST", "/api/runs/big/log", headers=sent, body=b"[1]")
    assert status == 400 and "not a JSON object" in json.loads(body)["error"]


@pytest.mark.parametrize("after, why", [
    ("{", "not a log cursor"),
    ('{"t-other": [0, null]}', "no node 't-other'"),
    ('{"t-main": [0, "../../status/t-main.json"]}', "not a chunk number and name"),
    ('{"t-main": [3, "000002~1.000000.jsonl"]}', "not a chunk number and name"),
    ('{"t-main": [-1, null]}', "not a chunk number and name"),
])
def test_a_cursor_the_server_did_not_give_is_refused_with_why(client, launcher_home, after, why):
    write_run(launcher_home / "wd", "r1", "running", created_at=time.time())
    status, _, body = client.ask("GET", "/api/runs/r1/log?" + urlencode({"after": after}))
    assert status == 400 and why in json.loads(body)["error"]


def test_the_verb_prints_its_address_with_the_secret_and_ends_cleanly_on_ctrl_c(tmp_path, launcher_home):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "ui", "--no-browser"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        printed = proc.stdout.readline()
        found = re.fullmatch(r"launcher ui: http://127\.0\.0\.1:(\d+)/\?token=([\w-]{40,})\n", printed)
        assert found, printed
        connection = http.client.HTTPConnection("127.0.0.1", int(found[1]), timeout=30)
        connection.request("GET", f"/?token={found[2]}")
        assert connection.getresponse().status == 303
        connection.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err


def test_another_address_is_warned_about_and_bad_ports_refused(launcher_home):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    bad = subprocess.run([sys.executable, "-m", "launcher", "ui", "--port", "70000"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "at most 65535" in bad.stderr
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "ui", "--no-browser", "--host", "0.0.0.0"], env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith("launcher ui: http://127.0.0.1:")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    err = proc.stderr.read()
    assert "warning: listening on 0.0.0.0" in err


def test_the_cli_imports_the_web_framework_only_for_the_ui():
    probe = ("import sys; from launcher import cli; cli.build_parser(); "
             "print([m for m in sys.modules if m.split('.')[0] in ('flask', 'werkzeug') or m.startswith('launcher.ui')])")
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_runs_page_carries_launcher_tops_figures_once_nodes_record_them(client, launcher_home):
    from launcher.protocol.health import HealthRecord

    write_run(launcher_home / "wd", "r2", "running", created_at=time.time())
    assert client.json("/api/runs/r2")["health"] == []  # nothing sampled yet
    store = write_run(launcher_home / "wd", "r1", "running", created_at=time.time())
    works = {"t-main": 0.2, "t-worker-0": 0.6}  # rank 1 does three times rank 0's work per step
    for rank, node in enumerate(NODES):
        HealthRecord(store, node).add({
            "at": time.time(), "window_seconds": 60.0, "cpu_percent": 99.0, "rss_bytes": 2**30,
            "ranks": {str(rank): {"cpu_percent": 98.0, "rss_bytes": 2**30, "steps_per_s": 4.8, "samples_per_s": 153.6,
                                  "work_per_step_s": works[node], "data_wait_fraction": 0.01, "window_s": 60.0,
                                  "last_line_at": time.time()}}})
    page = client.json("/api/runs/r1")
    header, *rows = page["health"]
    assert header[0] == "NODE / RANK" and "STEPS/S" in header and "WORK/STEP" in header
    assert [row[0] for row in rows] == ["t-main", "  rank 0", "t-worker-0", "  rank 1"]
    assert rows[3][header.index("STEPS/S")] == "4.80" and rows[3][header.index("WORK/STEP")] == "0.60 s"
    assert page["stragglers"] == ["straggler: rank 1 on node t-worker-0 does 1.5x the median work per step "
                                  "(0.60 s vs 0.40 s): CPU-bound"]


def test_bad_questions_and_unreadable_runs_get_an_answer_that_says_why(client, launcher_home, tmp_path):
    from launcher.runs import state

    for query, why in (("/api/runs?page=x", "page='x': not a whole number"), ("/api/runs?page=0", "pages count from 1"),
                       ("/api/runs/r1/log?limit=0", "ask for 1 to 5000 lines")):
        write_run(launcher_home / "wd", "r1", "running", created_at=time.time())
        status, _, body = client.ask("GET", query)
        assert status == 400 and why in json.loads(body)["error"], query
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    state.save(state.RunInfo(run_id="r2", backend="local", work_dir=str(blocked), nodes=["t-main"], spec_file="",
                             spec_digest="", created_at=time.time() + 1))
    listed = client.json("/api/runs")["runs"][0]
    assert listed["run_id"] == "r2" and listed["state"] == "unknown"
    assert listed["result"].startswith("work dir not readable: ") and "Not a directory" in listed["result"]
    status, _, body = client.ask("GET", "/api/runs/r2")
    assert status == 400 and "Not a directory" in json.loads(body)["error"]
    status, _, body = client.ask("POST", "/api/runs/r2/cancel", headers={HEADER: client.secret})
    assert status == 400 and "Not a directory" in json.loads(body)["error"]  # the page says why it could not
    state.save(state.RunInfo(run_id="r3", backend="local", work_dir=str(tmp_path / "wd3"), nodes=["t-main"],
                             spec_file="", spec_digest="", created_at=time.time()))
    status, _, body = client.ask("GET", "/api/runs/r3/timeline.svg")  # no node has written a thing yet
    assert status == 404 and json.loads(body)["error"] == "nothing recorded yet"
    write_run(launcher_home / "wd", "r4", "succeeded", created_at=time.time())
    status, headers, body = client.ask("GET", "/api/runs/r4/timeline.svg")  # its nodes' ends are recorded
    assert status == 200 and headers["content-type"] == "image/svg+xml; charset=utf-8" and b'data-node="t-main"' in body


def test_a_port_in_use_is_refused_with_where(launcher_home):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "launcher", "ui", "--no-browser", "--port", str(port)],
                              env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"error: cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr


def test_a_forced_stop_that_fails_in_the_background_is_said_in_the_servers_log(capsys, launcher_home):
    from launcher.errors import BackendError
    from launcher.runs import state
    from launcher.ui import routes

    class Refusing:  # a backend whose engine refuses to end the run's jobs
        def stop(self, info, grace):
            raise BackendError("scancel: Access/permission denied")

    info = state.RunInfo(run_id="r1", backend="slurm", work_dir=str(launcher_home / "wd"), nodes=["t-main"],
                         spec_file="", spec_digest="", created_at=time.time())
    routes._force_stop(info, Refusing())
    assert "run r1: forcing the cancel failed: scancel: Access/permission denied" in capsys.readouterr().err


def test_a_page_that_opens_gets_the_newest_lines_without_the_older_chunks_being_read(client, launcher_home,
                                                                                      monkeypatch):
    from launcher.protocol.store import WorkDir

    store = write_run(launcher_home / "wd", "r1", "running", created_at=time.time())
    for part in range(20):  # 20 chunks of 1,000 lines from rank 0, one line of rank 1 after every fifth
        ship(store, "t-main", [("out", f"step {part * 1000 + i}", 0) for i in range(1000)], max_lines=1000)
        if part % 5 == 4:
            ship(store, "t-worker-0", [("out", f"rank 1 after {part}", 1)])
    read = []
    get = WorkDir.get
    monkeypatch.setattr(WorkDir, "get", lambda self, key: read.append(key) or get(self, key))
    newest = client.json("/api/runs/r1/log?limit=1500")
    assert [line["text"] for line in newest["lines"]] == [f"step {i}" for i in range(18_501, 20_000)] + [
        "rank 1 after 19"]
    assert newest["older"] and newest["skipped"] == 2000 + 4 - 1500  # read: 2 of main's chunks, the worker's 4
    main_chunks = [int(key.split("/")[2][:6]) for key in read if key.startswith("logs/t-main/")]
    assert sorted(main_chunks) == [18, 18, 19, 19, 20]  # the last two counted back, then read; the next looked for
    read.clear()
    ranked = client.json("/api/runs/r1/log?limit=2&rank=1")
    assert [line["text"] for line in ranked["lines"]] == ["rank 1 after 14", "rank 1 after 19"] and ranked["older"]
    # t-main has none of rank 1's lines: it is looked back through no further than 20 x 2 lines' worth (its last
    # chunk), not all 20 of its chunks
    main_chunks = [int(key.split("/")[2][:6]) for key in read if key.startswith("logs/t-main/")]
    assert sorted(main_chunks) == [19, 19, 20], main_chunks
    short = client.json("/api/runs/r1/log?limit=5000&rank=1")
    assert len(short["lines"]) == 4 and not short["older"]
