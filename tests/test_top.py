"""``launcher top`` in the terminal it is in (issue 44): the table fits 80, 120 and 200 columns (a real pty, the
width the CLI reads from it), what is hidden is said, GPU columns only where there are GPUs, the round and restarts
in the header, and a node started again never shows its predecessor's figures as its own."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from conftest import run_cli
from launcher.columns import Column, cut, fit
from launcher.commands.top import COLUMNS
from launcher.protocol.health import HealthRecord
from launcher.protocol.rendezvous import Decision
from launcher.protocol.rounds import Round, decision_key
from launcher.protocol.status import StatusRecord
from test_health_client import Run, four_ranks, rank_entry, sample

ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def test_a_cell_is_cut_with_an_ellipsis_at_its_end_or_in_its_middle():
    assert cut("2.00 GiB (40/64 GiB free)", 10) == "2.00 GiB…"
    assert cut("ddptut-worker-12", 10, middle=True) == "ddptu…r-12"
    assert cut("short", 10) == "short"


@pytest.mark.parametrize("width", range(8, 201))
def test_a_fitted_table_is_never_wider_than_its_width_and_keeps_its_key_columns(width):
    columns = [Column("NAME", last=4, middle=True), Column("STATE"), Column("A", keep=2), Column("B", keep=1, least=3),
               Column("NOTE", least=6, last=3)]
    rows = [["a-rather-long-node-name", "running", "1", "bbbbbbbbbbbbbbbb", "slowest, straggler: CPU-bound"]]
    fitted = fit(columns, rows, width)
    assert max(map(len, fitted.lines)) <= width
    header = fitted.lines[0].split()
    if width >= 40:  # the key columns and their header names fit: they stay, whatever else goes
        assert {"NAME", "STATE", "NOTE"} <= set(header)
        assert set(fitted.hidden) == {"A", "B"} - set(header)  # and the line below says what went


def test_a_table_that_fits_is_shown_whole_and_none_is_cut_or_hidden():
    fitted = fit([Column("NAME"), Column("STATE", keep=1)], [["m", "running"]], 80)
    assert (fitted.lines, fitted.hidden, fitted.cut) == (["NAME  STATE", "m     running"], [], [])


def test_columns_go_by_priority_and_cells_are_cut_before_any_column_goes():
    fitted = fit([Column("NAME"), Column("MEMORY", keep=1, least=8), Column("LAST", keep=2)],
                 [["m", "2.00 GiB (40/64 GiB free)", "1s ago"]], 24)
    # cut to its least (8), then given back the 2 columns left: a cell is cut only as far as it must be
    assert (fitted.lines[1], fitted.hidden, fitted.cut) == ("m     2.00 GiB…   1s ago", [], ["MEMORY"])
    fitted = fit([Column("NAME"), Column("MEMORY", keep=1, least=8), Column("LAST", keep=2)],
                 [["m", "2.00 GiB (40/64 GiB free)", "1s ago"]], 16)
    assert (fitted.lines[1], fitted.hidden) == ("m     2.00 GiB…", ["LAST"])


def in_a_terminal(args: list[str], columns: int, until: str | None = None, env: dict | None = None,
                  timeout: float = 60) -> tuple[subprocess.Popen, int, list[str]]:
    """``launcher ARGS`` on a pty ``columns`` wide, COLUMNS unset: its output's lines (escapes removed) up to the
    first that matches ``until`` (else to its end)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environment = {key: value for key, value in (env or os.environ).items() if key not in ("COLUMNS", "LINES")}
    process = subprocess.Popen([sys.executable, "-m", "launcher", *args], stdin=follower, stdout=follower,
                               stderr=follower, env=environment, close_fds=True)
    os.close(follower)
    data, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], deadline - time.monotonic())
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        data += chunk
        text = data.decode(errors="replace")
        if until and re.search(until, text, re.M):
            break
    lines = ESCAPES.sub("", data.decode(errors="replace")).replace("\r\n", "\n").split("\n")
    return process, leader, [line for line in lines if line]


def finished(process: subprocess.Popen, leader: int) -> int:
    try:
        while os.read(leader, 65536):  # drain, so that the process never blocks on a full terminal
            pass
    except OSError:
        pass
    os.close(leader)
    return process.wait(timeout=60)


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_the_live_table_fits_the_terminal_it_is_in(tmp_path, launcher_home, columns):
    run = four_ranks(tmp_path, (0.2, 0.19, 0.2, 0.42))
    run.recorded()
    process, leader, lines = in_a_terminal(["top", run.info.run_id], columns, until=r"--wide shows|^straggler:.*\n.*\n")
    try:
        table = lines[lines.index(next(line for line in lines if line.startswith("NODE / RANK"))) - 1:]
        assert max(map(len, table)) <= columns, table
        header = table[1]
        for kept in ("NODE / RANK", "STATE", "STEPS/S", "NOTE"):  # the key columns, at every width
            assert kept in header, table
        assert "GPU" not in header  # no node has GPUs: no columns of "-"
        rank_3 = next(line for line in table if line.startswith("  rank 3"))
        assert "slowest, straggler" in rank_3 and "4.80" in rank_3, table  # the marks and steps/s are kept
        assert any(line.startswith("straggler: rank 3 on node w-0") for line in table)
        said = " ".join(line.strip() for line in table[table.index(rank_3) + 1:])  # the lines below the table
        if columns == 200:
            assert "--wide" not in said and "LAST LINE" in header and "(40/64 GiB free)" in table[2], table
        else:
            hidden = "hidden to fit 80 columns: SAMPLES/S, DATA WAIT, LAST LINE" if columns == 80 else \
                f"cut to fit {columns} columns: MEMORY"
            assert hidden in said and "--wide shows every column whole" in said, table
    finally:
        run.ended()
        assert finished(process, leader) == 0


def test_once_at_80_columns_is_fitted_not_wrapped_and_wide_shows_every_column(tmp_path, launcher_home):
    run = four_ranks(tmp_path, (0.2, 0.19, 0.2, 0.42))
    run.recorded()
    process, leader, lines = in_a_terminal(["top", run.info.run_id, "--once"], 80)
    assert finished(process, leader) == 0
    assert max(map(len, lines)) <= 80 and len([line for line in lines if line.startswith("  rank")]) == 4, lines
    process, leader, lines = in_a_terminal(["top", run.info.run_id, "--once", "--wide"], 80)
    assert finished(process, leader) == 0
    header = next(line for line in lines if line.startswith("NODE / RANK"))
    assert header.split("  ")[0] == "NODE / RANK" and "LAST LINE" in header and "DATA WAIT" in header, lines
    assert not any("--wide" in line for line in lines)


def test_piped_once_fits_columns_and_reads_80_without_it(tmp_path, launcher_home, monkeypatch):
    run = four_ranks(tmp_path, (0.2, 0.19, 0.2, 0.42))
    run.recorded()
    assert max(map(len, run_cli("top", run.info.run_id, "--once").stdout.splitlines())) <= 80
    monkeypatch.setenv("COLUMNS", "120")
    shown = run_cli("top", run.info.run_id, "--once").stdout.splitlines()
    assert max(map(len, shown)) <= 120 and max(map(len, shown)) > 80


def test_gpu_columns_are_shown_where_a_node_has_gpus(tmp_path, launcher_home):
    run = Run(tmp_path, nodes=("m",))
    run.sampled("m", sample({0: rank_entry(0.2, gpu=0), 1: rank_entry(0.2, gpu=1)}, gpu_utils=(96.0, 41.0)))
    shown = run_cli("top", run.recorded(), "--once", "--wide").stdout
    assert "GPU MEMORY" in shown.splitlines()[1] and "96% 41%" in shown
    assert {column.name for column in COLUMNS} >= {"GPU", "GPU MEMORY"}


def test_the_header_says_the_round_and_the_restarts(tmp_path, launcher_home):
    run = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.2))
    decision = Decision("w-0", "127.0.0.1", 29500, {"w-0": 0, "m": 1})
    run.store.put(decision_key(2), Round(2, decision, restarts=2, history=("round 0 ended", "round 1 ended"))
                  .to_bytes())
    assert run_cli("top", run.recorded(), "--once").stdout.startswith(
        "run health-run (local): running (round 2, 2 restarts), ")


def test_a_node_started_again_shows_none_of_its_predecessors_figures(tmp_path, launcher_home):
    """The main killed and started again: its replacement (incarnation 1) has written its status but not yet a
    sample, and the record still holds the killed start's last one, ``running`` with two training ranks."""
    run = four_ranks(tmp_path, (0.2, 0.2, 0.2, 0.2))
    replacement = StatusRecord(run.store, "m", run.info.run_id, incarnation=1)
    replacement.update(state="waiting")
    shown = run_cli("top", run.recorded(), "--once", "--wide").stdout.splitlines()
    node = next(line for line in shown if line.startswith("m "))
    assert node.split()[1] == "waiting" and node.endswith("started again, not sampled yet"), shown
    assert [line.split()[1] for line in shown if line.startswith("  rank")] == ["2", "3"], shown  # w-0's only
    HealthRecord(run.store, "m", incarnation=1).add(sample({0: rank_entry(0.2), 1: rank_entry(0.2)}))
    shown = run_cli("top", run.info.run_id, "--once", "--wide").stdout.splitlines()
    assert [line.split()[1] for line in shown if line.startswith("  rank")] == ["0", "1", "2", "3"], shown
