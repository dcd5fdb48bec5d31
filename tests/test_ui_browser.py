"""``launcher ui`` in a real browser (issue 40): Debian's headless chromium, driven through chromium-driver by
Selenium, shows the pages of real runs of the local backend (one finished, one failed, one still training) as a
person sees them: the nodes, the failure's cause, the log lines as they arrive, the nodes' figures; and cancels a run
after confirming.

Set LAUNCHER_UI_SCREENSHOTS to a directory (docs/images) to keep the pages' pictures there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import write_spec
from conftest import require, run_cli
from clirun import run_id_from

pytestmark = pytest.mark.slow

FINISHES = """
import os
rank = os.environ["RANK"]
for epoch in range(1, 4):
    print(f"rank {rank} epoch {epoch} done", flush=True)
"""
FAILS = """
import os, time
rank = os.environ["RANK"]
print(f"rank {rank} epoch 1 done", flush=True)
if rank == "1":
    raise ValueError("bad batch")
time.sleep(120)
"""
TRAINS = """
import itertools, os, time
rank = os.environ["RANK"]
for step in itertools.count():
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.2)
"""
WAIT_SECONDS = 120


def _run(directory: Path, script: str, *, detach: bool = False) -> str:
    directory.mkdir()
    spec = write_spec(directory, script, nodes=2)
    done = run_cli("run", "-f", str(spec), *(["--detach"] if detach else []), cwd=directory, timeout=240)
    assert done.returncode == (1 if script is FAILS else 0), done.stdout + done.stderr
    return run_id_from(done.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The three runs, and the home that records them."""
    root = tmp_path_factory.mktemp("ui-runs")
    os.environ["LAUNCHER_HOME"] = str(root / "home")  # the module's own, for the CLI and the ui alike
    try:
        found = {"finished": _run(root / "finished", FINISHES), "failed": _run(root / "failed", FAILS),
                 "training": _run(root / "training", TRAINS, detach=True), "home": root / "home"}
        yield found
        run_cli("cancel", found["training"], "--grace", "5")  # where the test did not get to it
    finally:
        del os.environ["LAUNCHER_HOME"]


@pytest.fixture(scope="module")
def url(runs) -> str:
    """``launcher ui`` as a user starts it: its printed address, with the secret."""
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "ui", "--no-browser"], text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "LAUNCHER_HOME": str(runs["home"])})
    printed = proc.stdout.readline()
    assert printed.startswith("launcher ui: http://127.0.0.1:"), printed
    yield printed.split(": ", 1)[1].strip()
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver_binary = shutil.which("chromium"), shutil.which("chromedriver")
    require(chromium is not None and driver_binary is not None,
            "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,1000",
                     f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_binary), options=options)
    yield driver
    driver.quit()


def _wait(browser, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, WAIT_SECONDS, poll_frequency=0.2).until(condition, message=what)


# The pages redraw their tables every few seconds: what a test reads of them is read in one script, so that no
# element it found is replaced before it reads it (Selenium's stale element reference).

def _text(browser, selector: str) -> str:
    return browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : ''",
                                  selector)


def _rows(browser, selector: str, key: str) -> list[tuple[str | None, list[str]]]:
    """Each row of the table body ``selector``: its ``data-KEY`` and its cells' texts."""
    return [(row[0], row[1]) for row in browser.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
        ".map(r => [r.dataset[arguments[1]] || null, [...r.cells].map(c => c.innerText)])", selector, key)]


def _node_states(browser) -> dict[str, str]:
    return {node: cells[2] for node, cells in _rows(browser, "#nodes", "node")}


def _log_lines(browser) -> list[str]:
    return browser.execute_script("return [...document.querySelectorAll('#log .line')].map(l => l.textContent)")


def _screenshot(browser, name: str, tmp_path: Path) -> None:
    where = Path(os.environ.get("LAUNCHER_UI_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(where / name))


def test_the_list_shows_every_run_with_its_state_and_the_cause_of_a_failure(runs, url, browser, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(url)
    assert "token=" not in browser.current_url  # traded for the cookie at once

    def states(driver) -> dict[str, str] | bool:
        shown = {run: cells[6] for run, cells in _rows(driver, "#runs", "run")}
        return shown if len(shown) == 3 else False

    shown = _wait(browser, states, "the three runs listed")
    assert shown == {runs["finished"]: "succeeded", runs["failed"]: "failed", runs["training"]: "running"}
    [failed_row] = [cells for run, cells in _rows(browser, "#runs", "run") if run == runs["failed"]]
    assert "cause: rank 1: ValueError: bad batch" in " ".join(failed_row)
    _screenshot(browser, "ui-runs.png", tmp_path)
    browser.find_element(By.ID, "state").send_keys("failed")  # the server filters
    _wait(browser, lambda d: [run for run, _ in _rows(d, "#runs", "run")] == [runs["failed"]], "only the failed run")


def test_a_finished_runs_page_shows_its_nodes_and_its_whole_log(runs, url, browser):
    browser.get(url.replace("/?", f"/runs/{runs['finished']}?"))
    _wait(browser, lambda d: _node_states(d) == {"t-main": "succeeded", "t-worker-0": "succeeded"}, "both nodes")
    _wait(browser, lambda d: "rank 1 epoch 3 done" in "\n".join(_log_lines(d)), "the log to its end")
    said = [line for line in _log_lines(browser) if "epoch" in line]  # the nodes' lines merged by time
    for node, rank in (("t-main", 0), ("t-worker-0", 1)):
        assert [line for line in said if line.startswith(f"[{node} r{rank}]")] == [
            f"[{node} r{rank}] rank {rank} epoch {epoch} done" for epoch in (1, 2, 3)]
    assert len(said) == 6
    assert f"run {runs['finished']} succeeded" in _text(browser, "#summary")
    _wait(browser, lambda d: d.find_element("id", "timeline").is_displayed(), "the timeline picture")
    assert not browser.find_element("id", "cancel").is_displayed()


def test_a_failed_runs_page_names_the_node_and_the_cause(runs, url, browser, tmp_path):
    browser.get(url.replace("/?", f"/runs/{runs['failed']}?"))
    _wait(browser, lambda d: "cause:" in _text(d, "#summary"), "the failure summary")
    summary = _text(browser, "#summary")
    assert f"run {runs['failed']} failed: node t-worker-0 exited with status 1" in summary
    assert "cause: rank 1: ValueError: bad batch" in summary
    assert "stopped because of it: node t-main" in summary
    assert _node_states(browser) == {"t-main": "failed", "t-worker-0": "failed"}
    _wait(browser, lambda d: any(line.endswith("ValueError: bad batch") for line in _log_lines(d)), "the traceback")
    _wait(browser, lambda d: d.find_element("id", "timeline").is_displayed(), "the timeline picture")
    _screenshot(browser, "ui-failed-run.png", tmp_path)


def test_a_training_runs_log_lines_arrive_and_cancel_after_confirming_ends_it(runs, url, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions

    browser.get(url.replace("/?", f"/runs/{runs['training']}?"))
    _wait(browser, lambda d: _text(d, "#state") == "running", "the run running")

    def latest_step(driver) -> int:
        steps = [int(found[1]) for line in _log_lines(driver) if (found := re.search(r"r0\] rank 0 step (\d+)", line))]
        return max(steps, default=-1)

    _wait(browser, lambda d: latest_step(d) >= 0, "a training line")
    seen = latest_step(browser)
    _wait(browser, lambda d: latest_step(d) >= seen + 3, "newer lines, as they arrive")
    browser.find_element(By.CSS_SELECTOR, '#rank option[value="1"]')  # the ranks seen are offered
    browser.execute_script("const s = document.getElementById('rank'); s.value = '1'; "
                           "s.dispatchEvent(new Event('change'))")
    _wait(browser, lambda d: len(_log_lines(d)) > 3, "rank 1's lines")
    assert all(line.startswith("[t-worker-0 r1] rank 1 step") for line in _log_lines(browser))
    def figures(driver) -> list[str] | bool:  # sampled every 5 s: the nodes' first, then their ranks' too
        rows = [" ".join(cells) for _, cells in _rows(driver, "#health", "none")]
        return rows if len(rows) == 4 else False

    rows = _wait(browser, figures, "each node's and each rank's figures")
    assert [row.split()[0:2] for row in rows] == [["t-main", "running"], ["rank", "0"], ["t-worker-0", "running"],
                                                   ["rank", "1"]], rows
    _screenshot(browser, "ui-training-run.png", tmp_path)
    browser.set_window_size(640, 1000)  # a narrow window: the tables squeeze their columns, never a node's name
    lines = browser.execute_script(
        "return [...document.querySelectorAll('#health td:first-child, #nodes td:first-child')].map(td => {"
        "const r = document.createRange(); r.selectNodeContents(td); return [td.textContent, r.getClientRects().length];})")
    assert all(count == 1 for _, count in lines), lines
    browser.set_window_size(1200, 1000)

    browser.find_element(By.ID, "cancel").click()
    alert = _wait(browser, expected_conditions.alert_is_present(), "the confirmation")
    assert runs["training"] in alert.text
    alert.dismiss()  # not confirmed: nothing is sent
    assert browser.find_element(By.ID, "cancel").is_enabled() and _text(browser, "#state") == "running"
    browser.find_element(By.ID, "cancel").click()
    _wait(browser, expected_conditions.alert_is_present(), "the confirmation").accept()
    _wait(browser, lambda d: _text(d, "#state") == "cancelled", "the run cancelled")
    assert _node_states(browser) == {"t-main": "cancelled", "t-worker-0": "cancelled"}
    assert f"run {runs['training']} cancelled: cancelled by user" in _text(browser, "#summary")
    done = run_cli("status", runs["training"], env={**os.environ, "LAUNCHER_HOME": str(runs["home"])})
    assert f"run {runs['training']} (local): cancelled" in done.stdout


def test_a_run_of_many_nodes_shows_those_in_trouble_first_and_the_rest_when_asked(tmp_path, browser, monkeypatch):
    """Issue 41: a page of 60 nodes draws 25 rows, the failed and lost ones first, a count per state, and every
    row once asked for."""
    from launcher.protocol.status import StatusRecord
    from launcher.protocol.store import WorkDir
    from launcher.runs import state

    names = [f"n{i:02d}" for i in range(60)]
    info = state.RunInfo(run_id="many", backend="local", work_dir=str(tmp_path / "wd"), nodes=names, spec_file="",
                         spec_digest="0" * 12, created_at=0, effective_spec={"kind": "distributed", "spec": {}})
    home = tmp_path / "home"
    monkeypatch.setenv("LAUNCHER_HOME", str(home))  # this test's own: the module's runs are not in it
    state.save(info)
    store = WorkDir(info.run_url)
    for rank, name in enumerate(names):
        ended = {"n41": ("failed", 1), "n57": ("lost", None)}.get(name, ("running", None))
        StatusRecord(store, name, "many").update(state=ended[0], exit_code=ended[1], rank=rank)
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "ui", "--no-browser"], text=True,
                            stdout=subprocess.PIPE, env={**os.environ, "LAUNCHER_HOME": str(home)})
    try:
        browser.get(proc.stdout.readline().split(": ", 1)[1].strip().replace("/?", "/runs/many?"))
        _wait(browser, lambda d: len(_node_states(d)) == 25, "the first 25 rows")
        shown = list(_node_states(browser).items())
        assert shown[:2] == [("n41", "failed"), ("n57", "lost")] and [n for n, _ in shown[2:5]] == ["n00", "n01", "n02"]
        assert _text(browser, "#node-counts") == "58 running, 1 failed, 1 lost"
        browser.execute_script("document.getElementById('fold-nodes').click()")
        _wait(browser, lambda d: len(_node_states(d)) == 60, "every row, once asked for")
        assert _text(browser, "#fold-nodes") == "show the first 25"
    finally:
        proc.terminate()
        proc.wait(30)
