"""What a test session left behind: processes it started, containers of launcher runs it created.

The session's main process (the only one, or pytest-xdist's controller) puts ``LAUNCHER_TEST_SESSION=<id>``
into its environment before anything starts, so every process started from it (its xdist workers, what
they start, what those start, daemons included) carries the mark, whoever its parent is by now. While a
test runs, ``LAUNCHER_TEST_STARTED_BY`` names it: a leftover says which test started it (one started by a
session fixture names the test that first needed it).

At the session's end, after the workers and every fixture are gone (the services stopped by their
fixtures, dockerd by :func:`dockerenv.release_engine`), the main process lists what still carries its mark
or still descends from it, and the containers with launcher's run label created during the session
(bind-mounting a path under the session's base temp dir, or any on an engine this session started and no
other session used), then stops them and fails the session. A process may take a moment to go: the list
is read again for a few seconds. A dockerd this session started that goes on for another session (and its
containers' shims) is not this session's leftover.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

SESSION_VAR = "LAUNCHER_TEST_SESSION"
TEST_VAR = "LAUNCHER_TEST_STARTED_BY"
RUN_LABEL = "launcher.run-id"  # launcher.backends.docker.containers.RUN_LABEL
GRACE_S = 10  # processes that are ending (a worker's children as it exits) are given this long


def start_session() -> str:
    """Mark this process's environment (and so every process started from now on) as a new session's:
    ``PID-RANDOM``, PID this main process's."""
    session = os.environ[SESSION_VAR] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    return session


def session_pid() -> int | None:
    """The main process of the session this process belongs to."""
    session = os.environ.get(SESSION_VAR, "")
    return int(session.split("-")[0]) if session[:1].isdigit() else None


def carries(pid: int, session: str) -> bool:
    return f"{SESSION_VAR}={session}".encode() in _read(f"/proc/{pid}/environ").split(b"\0")


@dataclass
class Leftover:
    pid: int
    started_by: str
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid} (started during {self.started_by or 'the session, outside a test'}): {self.command}"


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:  # gone meanwhile, or not ours to read
        return b""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid), or None once the process is gone."""
    raw = _read(f"/proc/{pid}/stat").decode(errors="replace")
    if not raw:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0], int(fields[1])


def processes(session: str, spared: set[int] = frozenset()) -> list[Leftover]:
    """Live processes of the session other than this one: marked with ``session``, or descending from here.
    Zombies are gone already (only their parent's wait is missing); ``spared`` pids and their descendants
    are not listed (a service this session handed on to another user)."""
    mark = f"{SESSION_VAR}={session}".encode()
    me = os.getpid()
    parents: dict[int, int] = {}
    marked: dict[int, dict[str, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        parents[pid] = stat[1]
        environ = _read(f"/proc/{pid}/environ").split(b"\0")
        if mark in environ:
            marked[pid] = dict(item.decode(errors="replace").partition("=")[::2] for item in environ
                               if item.startswith(TEST_VAR.encode() + b"="))

    def line_of(pid: int) -> set[int]:
        seen = set()
        while pid > 1 and pid not in seen:
            seen.add(pid)
            pid = parents.get(pid, 0)
        return seen

    if spared:  # dockerd goes on for another session: so do the shims of its containers (parent: init)
        spared = set(spared) | {pid for pid in parents if _read(f"/proc/{pid}/cmdline").split(b"\0")[0]
                                .rsplit(b"/", 1)[-1].startswith(b"containerd-shim")}
    found = []
    for pid in parents:
        if pid == me:
            continue
        ancestry = line_of(pid)
        if ancestry & spared:
            continue
        if pid not in marked and me not in ancestry:
            continue
        command = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        if parents[pid] == me and "multiprocessing.resource_tracker" in command:
            continue  # this process's own helper: it ends when this process closes its pipe, at its exit
        found.append(Leftover(pid, marked.get(pid, {}).get(TEST_VAR, ""), command[:300]))
    return found


def lingering_processes(session: str, spared: set[int] = frozenset()) -> list[Leftover]:
    """The session's processes still there after up to GRACE_S seconds."""
    deadline = time.monotonic() + GRACE_S
    while True:
        found = processes(session, spared)
        if not found or time.monotonic() > deadline:
            return found
        for leftover in found:  # reap our own children that ended meanwhile, or they stay zombies
            try:
                os.waitpid(leftover.pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.5)  # processes ending: there is nothing to wait on for a process that is not a child


def stop_processes(leftovers: list[Leftover]) -> None:
    for leftover in leftovers:
        try:
            os.kill(leftover.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def containers(since: float, base_temp: Path, engine_is_ours_alone: bool) -> list[str]:
    """Containers with launcher's run label created at or after ``since`` that are this session's: those
    bind-mounting a path under ``base_temp`` (a local work dir, a spec's volume); every one where the engine
    was started by this session and no other session used it."""
    if shutil.which("docker") is None:
        return []
    try:
        listed = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={RUN_LABEL}"], capture_output=True,
                                text=True, timeout=30)
        if listed.returncode != 0 or not listed.stdout.split():
            return []
        inspected = subprocess.run(["docker", "inspect", *listed.stdout.split()], capture_output=True, text=True,
                                   timeout=60)
        details = json.loads(inspected.stdout or "[]")
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []
    found = []
    for container in details:
        created = _parse_time(container.get("Created", ""))
        if created is None or created < since:
            continue
        mounts = [mount.get("Source", "") for mount in container.get("Mounts") or []]
        if not engine_is_ours_alone and not any(source.startswith(f"{base_temp}/") for source in mounts):
            continue
        labels = (container.get("Config") or {}).get("Labels") or {}
        found.append(f"container {container.get('Name', '').lstrip('/')} ({container['Id'][:12]}, "
                     f"{(container.get('State') or {}).get('Status', '?')}, run {labels.get(RUN_LABEL)})")
    return found


def remove_containers(descriptions: list[str]) -> None:
    ids = [description.split("(", 1)[1].split(",", 1)[0] for description in descriptions]
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=120)


def _parse_time(text: str) -> float | None:
    """Docker's RFC 3339 time with nanoseconds, as a POSIX timestamp."""
    try:
        head, _, rest = text.partition(".")
        fraction = rest.rstrip("Z")[:6] if rest else "0"
        stamp = datetime.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
        return stamp.timestamp() + float(f"0.{fraction or 0}")
    except ValueError:
        return None
