"""Each round's torchrun directory names its node process; a later start of the node removes those of starts that
died on this machine (their named pipes block readers), never a live one's."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from launcher.node.torchrun import training_dirs
from launcher.node.torchrun.training_dirs import OWNER_FILE, make_training_dir, sweep_stale


@pytest.fixture
def tmp_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def made_by_a_process_that_died(node: str) -> str:
    """A directory made by another node process, killed before it could remove it, with a rank's pipe inside."""
    code = ("import os, sys; from launcher.node.torchrun.training_dirs import make_training_dir; "
            "path = make_training_dir(sys.argv[1]); os.mkfifo(os.path.join(path, 'rank-0.pipe')); print(path)")
    made = subprocess.run([sys.executable, "-c", code, node], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": tempfile.gettempdir()}, check=True)
    return made.stdout.strip()


def test_a_dead_starts_directory_goes_and_a_live_ones_and_other_nodes_stay(tmp_dir):
    dead = made_by_a_process_that_died("w-1")
    other_node = made_by_a_process_that_died("w-10")  # a name the first one is a prefix of
    assert os.path.exists(os.path.join(dead, "rank-0.pipe"))
    live = make_training_dir("w-1")  # this process: alive
    assert os.path.isdir(live) and not os.path.exists(dead)
    assert sweep_stale("w-1") == [] and os.path.isdir(live) and os.path.isdir(other_node)
    with open(os.path.join(live, OWNER_FILE)) as handle:
        assert handle.read().split()[0] == str(os.getpid())


def test_a_reused_pid_is_not_its_old_owner(tmp_dir):
    path = make_training_dir("w-1")
    with open(os.path.join(path, OWNER_FILE), "w") as handle:  # this pid, but started at another time
        handle.write(f"{os.getpid()} 1")
    assert sweep_stale("w-1") == [path]


def test_a_directory_without_an_owner_is_left_alone(tmp_dir):
    path = tmp_dir / "launcher-w-1-torchrun-old"
    path.mkdir()
    assert sweep_stale("w-1") == [] and path.is_dir()
    assert training_dirs._identity(os.getpid()).startswith(f"{os.getpid()} ")
