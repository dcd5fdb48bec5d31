"""Start, observe and stop local runs. A detached supervisor process owns the nodes.

The supervisor (``python -m launcher.backends.local_supervisor``) gets the spawn requests
on its stdin (so secrets in env values never touch the disk), starts every node in its
own session, reports their process ids on its stdout, and then waits for them: when a
node dies without reporting (SIGKILL, OOM), it records that node's failure in the work dir
for it and kills what the node left behind. It runs in its own session, so closing the
terminal does not stop the run.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, Iterable

from launcher.errors import BackendError


def start(dryrun: Any, state_dir: str) -> dict[str, Any]:
    os.makedirs(state_dir, exist_ok=True)
    requests = [{"name": r.target, **r.body} for r in dryrun.requests]
    with open(os.path.join(state_dir, "supervisor.log"), "ab") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "launcher.backends.local_supervisor", state_dir, dryrun.plan.run_id,
             f"{dryrun.plan.work_dir.rstrip('/')}/{dryrun.plan.run_id}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    assert supervisor.stdin is not None and supervisor.stdout is not None
    supervisor.stdin.write(json.dumps(requests).encode())
    supervisor.stdin.close()
    line = supervisor.stdout.readline()
    supervisor.stdout.close()
    if not line:
        raise BackendError(f"the local supervisor did not start the nodes; see {state_dir}/supervisor.log")
    return {"supervisor_pid": supervisor.pid, "node_pids": json.loads(line)}


def pids_alive(pids: Iterable[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            continue
        except PermissionError:
            alive.append(pid)
    return alive


def wait_for_exit(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until the processes exit (pidfd events, not polling); return those still alive at the timeout."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout
    try:
        while fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select(list(fds), [], [], remaining)
            for fd in ready:
                os.close(fd)
                fds.pop(fd)
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


def kill_groups(pgids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            continue
