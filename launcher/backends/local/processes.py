"""Start, observe and stop local runs. A detached supervisor process owns the nodes.

The supervisor (``python -m launcher.backends.local.supervisor``) gets the spawn requests
on its stdin (so secrets in env values never touch the disk), starts every node in its
own session, records who it started in ``processes.json`` of the run's state directory,
and then waits for them: it writes each node's end to ``nodes/{node}.exit.json`` and, when a
node died without reporting (SIGKILL, OOM), records that node's failure in the work dir for
it. It runs in its own session, so closing the terminal does not stop the run.

Processes are identified by pid *and* start time, so a reused pid or an unreaped zombie is
never taken for a live node.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from launcher.errors import BackendError
from launcher.fileio import atomic_write

PROCESSES_FILE = "processes.json"


@dataclass(frozen=True)
class ProcessRef:
    pid: int
    start: int  # start time in clock ticks since boot (/proc/PID/stat field 22)

    @classmethod
    def of(cls, pid: int) -> "ProcessRef":
        stat = _stat(pid)
        return cls(pid, stat[1] if stat else 0)

    def running(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[0] not in ("Z", "X") and stat[1] == self.start


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process, or None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    return fields[0], int(fields[19])


def exit_record_path(state_dir: str | os.PathLike, node: str) -> Path:
    return Path(state_dir) / "nodes" / f"{node}.exit.json"


def console_log_path(state_dir: str | os.PathLike, node: str) -> Path:
    return Path(state_dir) / "nodes" / f"{node}.log"


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
    os.makedirs(state_dir, exist_ok=True)
    requests = [{"name": r.target, **r.body} for r in dryrun.requests]
    with open(os.path.join(state_dir, "supervisor.log"), "ab") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "launcher.backends.local.supervisor", state_dir,
             f"{dryrun.plan.work_dir.rstrip('/')}/{dryrun.plan.run_id}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    assert supervisor.stdin is not None and supervisor.stdout is not None
    supervisor.stdin.write(json.dumps(requests).encode())
    supervisor.stdin.close()
    line = supervisor.stdout.readline()
    supervisor.stdout.close()
    if not line:
        raise BackendError(f"the local supervisor did not start the nodes; see {state_dir}/supervisor.log")
    return json.loads(line)


def wait_for_exit(refs: Iterable[ProcessRef], timeout: float) -> list[ProcessRef]:
    """Wait until the processes exit (pidfd events, not polling); return those still running at the timeout."""
    fds: dict[int, ProcessRef] = {}
    for ref in refs:
        try:
            fd = os.pidfd_open(ref.pid)
        except ProcessLookupError:
            continue
        if ref.running():  # checked after opening: the fd cannot follow a reused pid
            fds[fd] = ref
        else:
            os.close(fd)
    deadline = time.monotonic() + timeout
    try:
        while fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select(list(fds), [], [], remaining)
            for fd in ready:  # readable once the process has exited, reaped or not
                os.close(fd)
                fds.pop(fd)
        return sorted(fds.values(), key=lambda ref: ref.pid)
    finally:
        for fd in fds:
            os.close(fd)


def kill_groups(pgids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            continue
