"""The parent of a local run's node processes; see :mod:`launcher.backends.local.processes`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.backends.local.processes import (ProcessRef, console_log_path, exit_record_path,
                                               kill_groups, write_processes)
from launcher.fileio import atomic_write
from launcher.node.control import CANCEL, CONTROL_PREFIX, record_failure
from launcher.node.exits import killed_by, signal_name
from launcher.node.outputs import OutputsSync
from launcher.node.status import FINAL_STATES, status_key

CONSOLE_PREFIX = "console"
from launcher.node.store import StoreError, WorkDir


def describe(returncode: int) -> tuple[int, str]:
    """Exit status and reason for a node process that ended without reporting."""
    if returncode < 0:
        return killed_by(-returncode), f"node process killed by {signal_name(-returncode)}"
    return returncode, f"node process exited with status {returncode} without reporting"


def record_on_behalf(run: WorkDir, name: str, returncode: int, console_log: str) -> None:
    """A node that died without writing a final status: record its end, and fail the run unless cancelled."""
    status = json.loads(run.get(status_key(name)) or b"{}")
    pgid = status.get("training_pgid")
    if pgid:
        kill_groups([pgid])  # what the dead node left running
    if status.get("state") in FINAL_STATES:
        return
    # Same machine: save what the node could not. Its console holds every line it printed, also
    # those of its last seconds that never reached a log chunk.
    run.upload(console_log, f"{CONSOLE_PREFIX}/{name}.log")
    if status.get("training_logs"):  # what its training processes wrote that the node had not read yet
        logs = Path(status["training_logs"])
        for path in sorted(logs.glob("*/attempt_*/*/std*.log")):
            run.upload(str(path), f"{CONSOLE_PREFIX}/{name}/{path.relative_to(logs).as_posix()}")
        shutil.rmtree(logs, ignore_errors=True)
    if status.get("outputs_dir"):
        OutputsSync(run, name, status["outputs_dir"]).sync()
    cancelled = CANCEL in run.list(CONTROL_PREFIX)
    exit_code, reason = describe(returncode)
    status.update({"node": name, "state": "cancelled" if cancelled else "failed", "exit_code": exit_code,
                   "reason": reason, "ended_at": time.time(), "updated_at": time.time(), "reported_by": "supervisor"})
    run.put(status_key(name), json.dumps(status).encode())
    if not cancelled:
        record_failure(run, name, status.get("rank"), exit_code, reason)


def main(state_dir: str, run_url: str) -> int:
    requests = json.loads(sys.stdin.read())  # all or nothing: a client killed mid-write starts no node
    logs_dir = os.path.join(state_dir, "nodes")
    os.makedirs(logs_dir, exist_ok=True)
    children: dict[int, str] = {}
    refs: dict[str, ProcessRef] = {}
    for request in requests:
        with open(console_log_path(state_dir, request["name"]), "ab") as console:
            proc = subprocess.Popen(request["argv"], cwd=request["cwd"], env={**os.environ, **request["env"]},
                                    stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        children[proc.pid] = request["name"]
        refs[request["name"]] = ProcessRef.of(proc.pid)
    # Recorded before the client hears of it: every verb finds the processes even if the client is gone.
    recorded = write_processes(state_dir, ProcessRef.of(os.getpid()), refs)
    try:
        sys.stdout.write(json.dumps(recorded) + "\n")
        sys.stdout.close()
    except BrokenPipeError:  # the client was interrupted; the run is recorded and goes on
        pass
    run = WorkDir(run_url)
    while children:
        pid, wait_status = os.wait()
        name = children.pop(pid, None)
        if name is None:
            continue
        returncode = os.waitstatus_to_exitcode(wait_status)
        ended_at = time.time()
        print(f"{time.strftime('%H:%M:%S')} node {name} (pid {pid}) ended: {returncode}", file=sys.stderr, flush=True)
        try:
            record_on_behalf(run, name, returncode, str(console_log_path(state_dir, name)))
        except StoreError as exc:
            print(f"could not record the end of node {name}: {exc}", file=sys.stderr, flush=True)
        finally:
            # Written last: a reader that sees it knows the node's outputs and logs are saved, or never will be.
            exit_code, reason = describe(returncode)
            atomic_write(exit_record_path(state_dir, name),
                         json.dumps({"returncode": returncode, "exit_code": exit_code, "reason": reason,
                                     "at": ended_at}))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(main(*sys.argv[1:3]))
