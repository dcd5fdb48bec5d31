"""Start, observe and stop local runs. A detached supervisor process owns the nodes.

The supervisor (``python -m launcher.backends.local.supervisor``) gets the spawn requests
on its stdin (so secrets in env values never touch the disk), starts every node in its
own session, records who it started in ``processes.json`` of the run's state directory,
and then waits for them: it writes each node's end to ``nodes/{node}.exit.json`` and, when a
node died without reporting (SIGKILL, OOM), records that node's failure in the work dir for
it. It runs in its own session, so closing the terminal does not stop the run.

``launcher scale`` adds nodes as :mod:`launcher.runs.additions` says (:func:`request_nodes`); the
supervisor waits on its nodes' pidfds and on the signal in one ``select``, starts them with the env
of the run's last node, and records them in ``processes.json``.

What every supervisor shares (process identity, exit records) is in :mod:`launcher.runs.supervision`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from launcher.errors import BackendError
from launcher.fileio import atomic_write
from launcher.runs import additions
from launcher.runs.supervision import ProcessRef, start_supervisor

PROCESSES_FILE = "processes.json"


def write_processes(state_dir: str, supervisor: ProcessRef, nodes: dict[str, ProcessRef]) -> dict[str, Any]:
    record = {"supervisor": asdict(supervisor), "nodes": {name: asdict(ref) for name, ref in nodes.items()}}
    atomic_write(Path(state_dir) / PROCESSES_FILE, json.dumps(record))
    return record


def read_processes(state_dir: str | os.PathLike) -> tuple[ProcessRef | None, dict[str, ProcessRef]]:
    try:
        data = json.loads((Path(state_dir) / PROCESSES_FILE).read_text())
        return ProcessRef(**data["supervisor"]), {name: ProcessRef(**ref) for name, ref in data["nodes"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None, {}


def supervisor_problem(state_dir: str | os.PathLike) -> str | None:
    """Why the run's supervisor cannot start more nodes (None: it runs)."""
    supervisor, _ = read_processes(state_dir)
    if supervisor is None or not supervisor.running():
        return (f"its supervisor (recorded in {Path(state_dir) / PROCESSES_FILE}) is not running: every node of the "
                "run has ended, or the supervisor was killed")
    return None


def request_nodes(state_dir: str | os.PathLike, names: Sequence[str], timeout: float = 30.0) -> list[str]:
    """Ask the run's supervisor to start ``names``; return once ``processes.json`` records them all."""
    problem = supervisor_problem(state_dir)
    if problem:
        raise BackendError(f"cannot add nodes: {problem}")
    supervisor, _ = read_processes(state_dir)
    assert supervisor is not None
    return additions.request_nodes(state_dir, supervisor, names, lambda: read_processes(state_dir)[1], timeout)


def start(dryrun: Any, state_dir: str) -> dict[str, Any]:
    """Start the supervisor and return once it has started every node (their refs are in the state dir)."""
    requests = [{"name": r.target, **r.body} for r in dryrun.requests]
    return start_supervisor("launcher.backends.local.supervisor", state_dir,
                            f"{dryrun.plan.work_dir.rstrip('/')}/{dryrun.plan.run_id}", requests)
