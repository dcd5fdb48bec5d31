"""What every backend's supervisor shares: identifying its processes, and recording a node's end.

A supervisor is a detached process on the client machine that owns a run's nodes (local
processes, or containers). It records each node's end in ``nodes/{node}.exit.json`` of the
run's state directory, written last, after the node's console and outputs are saved; and
when a node died without a final status (SIGKILL, OOM, ``docker kill``) it records that
node's failure in the work dir, so that its peers stop.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from launcher.backends.base import NodeFate
from launcher.errors import BackendError
from launcher.fileio import atomic_write
from launcher.protocol.control import cancel_requested, record_failure
from launcher.protocol.exits import EXIT_STORE
from launcher.protocol.status import FINAL_STATES, status_key
from launcher.protocol.store import WorkDir

CONSOLE_PREFIX = "console"  # in the work dir: consoles of nodes that could not save their own logs
# A node that exited EXIT_STORE gave up on the work dir (unreachable for LAUNCHER_STORE_DEADLINE, or unusable):
# recording the ends of such nodes there gets this long in all, not a whole new outage each, so that whatever
# watches the nodes (a supervisor, Slurm's task keeper) ends soon after them.
GAVE_UP_DEADLINE_SECONDS = 5.0
CONSOLE_TAIL_BYTES = 4096


@dataclass(frozen=True)
class ProcessRef:
    """A process on this machine, by pid *and* start time: a reused pid or a zombie is never taken for it."""

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


def console_log_path(state_dir: str | os.PathLike, node: str) -> Path:
    return Path(state_dir) / "nodes" / f"{node}.log"


def exit_record_path(state_dir: str | os.PathLike, node: str) -> Path:
    return Path(state_dir) / "nodes" / f"{node}.exit.json"


def write_exit_record(state_dir: str | os.PathLike, node: str, exit_code: int, reason: str, at: float,
                      **extra: Any) -> None:
    atomic_write(exit_record_path(state_dir, node),
                 json.dumps({"exit_code": exit_code, "reason": reason, "at": at, **extra}))


def recorded_fate(state_dir: str | os.PathLike, node: str) -> NodeFate | None:
    """The node's end as its supervisor recorded it, or None when none is recorded."""
    try:
        ended = json.loads(exit_record_path(state_dir, node).read_text())
        return NodeFate(False, ended["exit_code"], ended["reason"], str(console_log_path(state_dir, node)),
                        ended["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


ERROR_LINE = re.compile(r"Error|error|Exception|Fatal|FATAL|failed|not found|No such file|denied|Killed")


def console_tail(path: str | None, lines: int = 5) -> list[str]:
    """The last non-empty lines a node printed, for a node that could not report them itself."""
    if not path:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, Path(path).stat().st_size - CONSOLE_TAIL_BYTES))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def error_line(tail: list[str]) -> str | None:
    """The line of a dead node's last output that says why, where one does (the last such line)."""
    return next((line.strip() for line in reversed(tail) if ERROR_LINE.search(line)), None)


def with_error_line(reason: str, console_log: str) -> str:
    """``reason`` and, where the node's console says why it ended, that line too."""
    said = error_line(console_tail(console_log))
    return f"{reason}: {said}" if said else reason


def end_round_for_lost_node(run: WorkDir, name: str, status: dict[str, Any], exit_code: int, reason: str,
                            console_log: str, at: float | None, *, replaced: bool = False) -> None:
    """A member of a recovering run died: end its round (the others meet in the next, waiting for its
    replacement where ``replaced``: its supervisor starts one) and mark it lost."""
    from launcher.protocol.rounds import Rounds
    from launcher.protocol.recovery import LOST, RoundEnd

    ended_at = time.time() if at is None else at
    Rounds.end_for(run, int(status["round"]), RoundEnd(name, LOST, reason, exit_code, ended_at, replaced))
    status.update({"node": name, "state": "lost", "exit_code": exit_code, "reason": reason, "ended_at": ended_at,
                   "updated_at": time.time(), "reported_by": "supervisor", "console_log": console_log})
    run.put(status_key(name), json.dumps(status).encode())


def replacement_refused(run: WorkDir, name: str, status: dict[str, Any]) -> None:
    """The replacement of lost node ``name`` could not be started: its end record stops saying one is coming, so
    the next round no longer waits for it (recovery.replacementWait)."""
    from launcher.protocol.rounds import end_key
    from launcher.protocol.recovery import LOST, RoundEnd

    if status.get("round") is None:
        return
    key = end_key(int(status["round"]), RoundEnd(name, LOST, ""))
    record = run.get_record(key)
    if record.get("replaced"):
        run.put(key, json.dumps({**record, "replaced": False}).encode())


def replacement_wanted(run: WorkDir, recovery: dict[str, Any] | None, replaced: int) -> bool:
    """Whether a backend should start a lost node again: the run recovers, has restarts left, goes on."""
    from launcher.protocol.rounds import latest_round
    from launcher.protocol.recovery import Policy

    if not recovery or not Policy.from_settings(recovery).replaces(replaced) or cancel_requested(run):
        return False
    latest = latest_round(run)
    return latest is None or latest.give_up is None


def start_supervisor(module: str, state_dir: str, run_url: str, payload: Any) -> dict[str, Any]:
    """Start ``python -m module STATE_DIR RUN_URL`` in its own session, hand it ``payload`` on stdin
    (so that secrets in env values never touch the disk) and return the JSON line it answers once
    it has recorded what it owns."""
    os.makedirs(os.path.join(state_dir, "nodes"), exist_ok=True)
    with open(os.path.join(state_dir, "supervisor.log"), "ab") as log:
        supervisor = subprocess.Popen([sys.executable, "-m", module, state_dir, run_url],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                      start_new_session=True)
    assert supervisor.stdin is not None and supervisor.stdout is not None
    supervisor.stdin.write(json.dumps(payload).encode())
    supervisor.stdin.close()
    line = supervisor.stdout.readline()
    supervisor.stdout.close()
    if not line:
        raise BackendError(f"the supervisor did not start the nodes; see {state_dir}/supervisor.log")
    return json.loads(line)


def record_on_behalf(run: WorkDir, name: str, status: dict[str, Any], exit_code: int, reason: str,
                     console_log: str, at: float | None = None, *,
                     wants_replacement: Callable[[], bool] | None = None, recovering: bool = False) -> bool:
    """A node that ended without a final status: save its console, record its end, and fail the run
    unless it was cancelled. ``status`` is the node's last status record; ``at`` when it ended; ``recovering``:
    the run trains in rounds. Returns whether the node is to be started again: it was lost and
    ``wants_replacement`` (asked only then) says so; the end record this writes says so too, and the next round
    waits for it."""
    if status.get("state") in FINAL_STATES:  # a node that recorded itself lost is replaced all the same
        return status.get("state") == "lost" and wants_replacement is not None and wants_replacement()
    # Its console holds every line it printed, also those of its last seconds that never reached a log chunk.
    run.upload(console_log, f"{CONSOLE_PREFIX}/{name}.log")
    cancelled = cancel_requested(run)
    if (status.get("round") is not None or recovering) and not cancelled:  # its round ends, the run goes on
        return _lost(run, name, status, exit_code, reason, console_log, at, wants_replacement)
    reason = with_error_line(reason, console_log)
    details = {"console_log": console_log, "last_output": console_tail(console_log)}
    # The marker before the final status, as a node writes its own: a reader that sees the node failed finds its cause.
    if not cancelled:
        record_failure(run, name, status.get("rank"), exit_code, reason, details, at=at)
    status.update({"node": name, "state": "cancelled" if cancelled else "failed", "exit_code": exit_code,
                   "reason": reason, "ended_at": time.time() if at is None else at, "updated_at": time.time(),
                   "reported_by": "supervisor", **details})
    run.put(status_key(name), json.dumps(status).encode())
    return False


def _lost(run: WorkDir, name: str, status: dict[str, Any], exit_code: int, reason: str, console_log: str,
          at: float | None, wants_replacement: Callable[[], bool] | None) -> bool:
    """A node of a recovering run died: its round ends. One that died before its status named a round (a
    replacement killed while it joins, a node still starting) ends the latest round only where that round was
    decided with it and no loss of that name ended it already (its predecessor's); otherwise the round before
    is over already, and what is left to say is whether another replacement comes (the survivors wait for one
    only while its predecessor's end record says so)."""
    from launcher.protocol.recovery import LOST, RoundEnd
    from launcher.protocol.rounds import end_key, latest_round

    replaced = wants_replacement is not None and wants_replacement()
    if status.get("round") is None:
        latest = latest_round(run)
        lost_before = latest is not None and run.get(end_key(latest.number, RoundEnd(name, LOST, ""))) is not None
        if latest is None or lost_before or name not in latest.members:
            if not replaced and latest is not None:
                replacement_refused(run, name, {"round": latest.number})
            status.update({"node": name, "state": "lost", "exit_code": exit_code, "reason": reason,
                           "ended_at": time.time() if at is None else at, "updated_at": time.time(),
                           "reported_by": "supervisor", "console_log": console_log})
            run.put(status_key(name), json.dumps(status).encode())
            return replaced
        status = {**status, "round": latest.number}
    end_round_for_lost_node(run, name, status, exit_code, reason, console_log, at, replaced=replaced)
    return replaced


class EndRecorder:
    """The work dir a node's watcher records the node's end in: ``run`` itself, or for a node that gave up on it,
    one client on a clock of GAVE_UP_DEADLINE_SECONDS shared by every such node (once it has run out, the others'
    ends are not tried: each ends at once, and the watcher within that bound of its last node)."""

    def __init__(self, run: WorkDir):
        self.run = run
        self._after_give_up: WorkDir | None = None

    def store_for(self, exit_code: int) -> WorkDir:
        if exit_code != EXIT_STORE:
            return self.run
        if self._after_give_up is None:
            self._after_give_up = WorkDir(self.run.url, deadline=GAVE_UP_DEADLINE_SECONDS)
        return self._after_give_up
