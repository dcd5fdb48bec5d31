"""What the parent of a node's bootstrap on the node's own machine does when the bootstrap died without reporting
(SIGKILL, OOM): say how it ended, stop its training processes and sync its outputs. The local backend's
supervisor is that parent for local nodes, :mod:`launcher.node.engines.slurm` for a Slurm node's task."""

from __future__ import annotations

import os
import shutil
import signal
from typing import Iterable

from launcher.protocol.exits import killed_by, signal_name
from launcher.protocol.outputs import OutputsSync, remove_temporary
from launcher.node.diagnosis.stacks import live_training_pids
from launcher.protocol.status import FINAL_STATES
from launcher.protocol.store import WorkDir


def describe(returncode: int) -> tuple[int, str]:
    """Exit status and reason for a node process that ended without reporting."""
    if returncode < 0:
        return killed_by(-returncode), f"node process killed by {signal_name(-returncode)}"
    return returncode, f"node process exited with status {returncode} without reporting"


def save_leftovers(run: WorkDir, name: str, status: dict) -> None:
    """What only this machine can do for a node that died without a final status: stop its training
    processes, remove their pipes and error files, and sync its outputs (the node shared this file system).
    Their unread lines are in the node's console log, which the caller saves."""
    if status.get("training_pgid"):
        kill_groups([status["training_pgid"]])
    if status.get("training_logs"):  # torchrun starts each rank in a session of its own: it may outlive torchrun
        kill_groups(live_training_pids(os.path.join(status["training_logs"], "stacks")))
    if status.get("state") in FINAL_STATES:
        return
    if status.get("training_logs"):
        shutil.rmtree(status["training_logs"], ignore_errors=True)
    if status.get("outputs_dir"):
        OutputsSync(run, name, status["outputs_dir"]).sync()  # raises if the store fails: nothing is removed then
        if status.get("outputs_temporary"):  # launcher chose the directory; every file is in the work dir now
            remove_temporary(status["outputs_dir"])


def kill_groups(pgids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """``sig`` to each process group, or to the process of that id where it leads no group."""
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            try:
                os.kill(pgid, sig)
            except (ProcessLookupError, PermissionError):
                continue
        except PermissionError:
            continue
