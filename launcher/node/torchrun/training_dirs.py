"""The directory each round's torchrun writes to (its logs, the ranks' output pipes, their stacks), one per round
in the machine's temporary directory, removed when the round ends.

A node killed together with everything around it (a machine Slurm took out of a job, then gave back; a
container's host process killed with its parent) never removes its own, and the named pipes in it block anyone
who reads them. Each directory names its node process (pid and start time, which tell a reused pid apart), and
the next start of a node of the same name on the machine removes those whose process is gone.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

from launcher.procinfo import start_ticks

OWNER_FILE = "owner"


def make_training_dir(node: str) -> str:
    """A new directory for this round of ``node``, after removing those of its earlier starts that died here."""
    sweep_stale(node)
    path = tempfile.mkdtemp(prefix=_prefix(node))
    with open(os.path.join(path, OWNER_FILE), "w") as handle:
        handle.write(_identity(os.getpid()) or "")
    return path


def sweep_stale(node: str) -> list[str]:
    """Remove the directories of ``node``'s starts on this machine whose process is gone; the ones removed.
    One without an owner (being made this instant, or made by an older launcher) is left alone."""
    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), glob.escape(_prefix(node)) + "*")):
        try:
            with open(os.path.join(path, OWNER_FILE)) as handle:
                owner = handle.read().strip()
        except OSError:
            continue
        pid = owner.split(" ", 1)[0]
        if owner and pid.isdigit() and _identity(int(pid)) != owner:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _prefix(node: str) -> str:
    return f"launcher-{node}-torchrun-"


def _identity(pid: int) -> str | None:
    """``PID STARTTIME`` of a live process (its start in clock ticks since boot), None when there is none."""
    ticks = start_ticks(pid)
    return None if ticks is None else f"{pid} {ticks}"
