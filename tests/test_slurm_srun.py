"""The batch script's srun keeper (launcher.node.engines.slurm_srun): what it runs is outside its process tree and
session, and its exit status is the keeper's, a signal's as a shell says it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

KEEPER = [sys.executable, "-m", "launcher.node.engines.slurm_srun"]


@pytest.mark.parametrize("script, code", [("exit 0", 0), ("exit 3", 3), ("kill -9 $$", 128 + signal.SIGKILL),
                                          ("kill -9 $PPID", 1)])  # its keeper killed: it cannot say
def test_the_keeper_exits_with_the_status_of_what_it_ran(script, code):
    assert subprocess.run([*KEEPER, "sh", "-c", script], timeout=30).returncode == code


def test_what_it_runs_is_neither_its_child_nor_in_its_session(tmp_path):
    said = tmp_path / "said"
    keeper = subprocess.Popen([*KEEPER, "sh", "-c", f'echo "$PPID $(ps -o sid= -p $$)" > {said}'])
    assert keeper.wait(timeout=30) == 0
    parent, session = (int(field) for field in said.read_text().split())
    assert parent != keeper.pid and session != os.getsid(0)  # the keeper's session is this one


def test_the_keeper_outlives_a_sigterm_and_reports_the_end():
    keeper = subprocess.Popen([*KEEPER, "sh", "-c", "echo started; sleep 1; exit 5"], stdout=subprocess.PIPE)
    assert keeper.stdout.readline() == b"started\n"
    keeper.send_signal(signal.SIGTERM)  # what a cancel sends the batch script's processes
    assert keeper.wait(timeout=30) == 5
