"""Start, observe and stop local runs. A detached supervisor process owns the nodes.

The supervisor (``python -m launcher.backends.local.supervisor``) gets the spawn requests
on its stdin (so secrets in env values never touch the disk), starts every node in its
own session, records who it started in ``processes.json`` of the run's state directory,
and then waits for them: it writes each node's end to ``nodes/{node}.exit.json`` and, when a
node died without reporting (SIGKILL, OOM), records that node's failure in the work dir for
it. It runs in its own session, so closing the terminal does not stop the run.

What every supervisor shares (process identity, exit records) is in :mod:`launcher.runs.supervision`.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

from launcher.fileio import atomic_write
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


def start(dryrun: Any, state_dir: str) -> dict[str, Any]:
    """Start the supervisor and return once it has started every node (their refs are in the state dir)."""
    requests = [{"name": r.target, **r.body} for r in dryrun.requests]
    return start_supervisor("launcher.backends.local.supervisor", state_dir,
                            f"{dryrun.plan.work_dir.rstrip('/')}/{dryrun.plan.run_id}", requests)


def kill_groups(pgids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            continue
