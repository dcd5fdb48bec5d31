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

from launcher.backends.local.processes import kill_groups, write_processes
from launcher.node.exits import killed_by, signal_name
from launcher.node.outputs import OutputsSync, remove_temporary
from launcher.node.status import FINAL_STATES, status_key
from launcher.node.store import StoreError, WorkDir
from launcher.runs.supervision import (CONSOLE_PREFIX, ProcessRef, console_log_path, record_on_behalf,
                                       replacement_wanted, write_exit_record)


def describe(returncode: int) -> tuple[int, str]:
    """Exit status and reason for a node process that ended without reporting."""
    if returncode < 0:
        return killed_by(-returncode), f"node process killed by {signal_name(-returncode)}"
    return returncode, f"node process exited with status {returncode} without reporting"


def save_leftovers(run: WorkDir, name: str, status: dict) -> None:
    """What only this machine can do for a node that died without a final status: stop its training
    processes, save their unread logs and sync its outputs (the node shared this file system)."""
    if status.get("training_pgid"):
        kill_groups([status["training_pgid"]])
    if status.get("state") in FINAL_STATES:
        return
    if status.get("training_logs"):
        logs = Path(status["training_logs"])
        for path in sorted(logs.glob("*/attempt_*/*/std*.log")):
            run.upload(str(path), f"{CONSOLE_PREFIX}/{name}/{path.relative_to(logs).as_posix()}")
        shutil.rmtree(logs, ignore_errors=True)
    if status.get("outputs_dir"):
        OutputsSync(run, name, status["outputs_dir"]).sync()  # raises if the store fails: nothing is removed then
        if status.get("outputs_temporary"):  # launcher chose the directory; every file is in the work dir now
            remove_temporary(status["outputs_dir"])


def main(state_dir: str, run_url: str) -> int:
    requests = json.loads(sys.stdin.read())  # all or nothing: a client killed mid-write starts no node
    logs_dir = os.path.join(state_dir, "nodes")
    os.makedirs(logs_dir, exist_ok=True)
    children: dict[int, str] = {}
    refs: dict[str, ProcessRef] = {}
    for request in requests:
        pid = _spawn(request, state_dir)
        children[pid] = request["name"]
        refs[request["name"]] = ProcessRef.of(pid)
    # Recorded before the client hears of it: every verb finds the processes even if the client is gone.
    recorded = write_processes(state_dir, ProcessRef.of(os.getpid()), refs)
    try:
        sys.stdout.write(json.dumps(recorded) + "\n")
        sys.stdout.close()
    except BrokenPipeError:  # the client was interrupted; the run is recorded and goes on
        pass
    run = WorkDir(run_url)
    by_name = {request["name"]: request for request in requests}
    recovery = json.loads(requests[0]["env"].get("LAUNCHER_RECOVERY") or "null") if requests else None
    replaced = 0
    while children:
        pid, wait_status = os.wait()
        name = children.pop(pid, None)
        if name is None:
            continue
        returncode = os.waitstatus_to_exitcode(wait_status)
        ended_at = time.time()
        print(f"{time.strftime('%H:%M:%S')} node {name} (pid {pid}) ended: {returncode}", file=sys.stderr, flush=True)
        exit_code, reason = describe(returncode)
        status: dict = {}
        try:
            status = run.get_record(status_key(name))
            save_leftovers(run, name, status)
            record_on_behalf(run, name, status, exit_code, reason, str(console_log_path(state_dir, name)),
                             at=ended_at)
            if status.get("state") == "lost" and replacement_wanted(run, recovery, replaced):
                replaced += 1
                pid = _spawn(by_name[name], state_dir, incarnation=replaced)
                children[pid], refs[name] = name, ProcessRef.of(pid)
                write_processes(state_dir, ProcessRef.of(os.getpid()), refs)
                print(f"{time.strftime('%H:%M:%S')} node {name} replaced (pid {pid}, replacement {replaced})",
                      file=sys.stderr, flush=True)
                continue  # no exit record: the node goes on
        except StoreError as exc:
            print(f"could not record the end of node {name}: {exc}", file=sys.stderr, flush=True)
        # Written last: a reader that sees it knows the node's outputs and logs are saved, or never will be.
        write_exit_record(state_dir, name, exit_code, reason, ended_at, returncode=returncode)
    return 0


def _spawn(request: dict, state_dir: str, incarnation: int = 0) -> int:
    """Start one node process in its own session, its output appended to its console log."""
    env = {**os.environ, **request["env"], **({"LAUNCHER_NODE_INCARNATION": str(incarnation)} if incarnation else {})}
    with open(console_log_path(state_dir, request["name"]), "ab") as console:
        proc = subprocess.Popen(request["argv"], cwd=request["cwd"], env=env, stdin=subprocess.DEVNULL,
                                stdout=console, stderr=subprocess.STDOUT, start_new_session=True)
    return proc.pid


if __name__ == "__main__":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(main(*sys.argv[1:3]))
