"""The parent of a local run's node processes; see :mod:`launcher.backends.local.processes`."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

from launcher.backends.local.processes import write_processes
from launcher.node.leftovers import describe, save_leftovers
from launcher.node.health.procfs import TreeReader, read_stat
from launcher.procinfo import FROZEN_STATES, process_state
from launcher.protocol.status import HEARTBEAT_SECONDS, status_key
from launcher.protocol.store import StoreError, WorkDir
from launcher.runs.additions import ADD_SIGNAL, added_node_env, added_node_gpus, read_added, write_added_record
from launcher.runs.supervision import (EndRecorder, ProcessRef, console_log_path, record_on_behalf,
                                       replacement_wanted, with_error_line, write_exit_record)


# A node process that used no CPU time and wrote no status for this long, and is stopped, traced or in
# uninterruptible sleep, is frozen: a live one polls its store and supervises its torchrun every half second, and
# writes its status at least every HEARTBEAT_SECONDS while it trains; one that waits on an unanswering store
# sleeps. It is killed, and so lost (and replaced) like any other node.
FROZEN_AFTER_SECONDS = 3 * HEARTBEAT_SECONDS
FROZEN_CHECK_SECONDS = 5.0


def main(state_dir: str, run_url: str) -> int:
    wake = _wake_on(ADD_SIGNAL)  # before anything is recorded: `launcher scale` signals once it sees the record
    requests = json.loads(sys.stdin.read())  # all or nothing: a client killed mid-write starts no node
    os.makedirs(os.path.join(state_dir, "nodes"), exist_ok=True)
    supervisor = Supervisor(state_dir, WorkDir(run_url), requests)
    for request in requests:
        supervisor.spawn(request)
    # Recorded before the client hears of it: every verb finds the processes even if the client is gone.
    recorded = supervisor.record()
    try:
        sys.stdout.write(json.dumps(recorded) + "\n")
        sys.stdout.close()
    except BrokenPipeError:  # the client was interrupted; the run is recorded and goes on
        pass
    while supervisor.children:
        ready, _, _ = select.select([wake, *supervisor.children], [], [], FROZEN_CHECK_SECONDS)
        if not ready:
            supervisor.stop_frozen()
        for fd in ready:
            if fd == wake:
                os.read(wake, 4096)  # one byte per signal: what they ask for is in the file
                supervisor.add_requested()
            else:
                supervisor.ended(fd)
    return 0


class Supervisor:
    """The run's node processes, each waited on through a pidfd, and what to do when one ends."""

    def __init__(self, state_dir: str, run: WorkDir, requests: list[dict]):
        self.state_dir = state_dir
        self.run = run
        self.by_name = {request["name"]: request for request in requests}
        self.template = requests[-1]  # a node `launcher scale` adds starts like the run's last node
        self.recovery = json.loads(requests[0]["env"].get("LAUNCHER_RECOVERY") or "null") if requests else None
        self.children: dict[int, tuple[str, subprocess.Popen]] = {}  # pidfd -> (node, process)
        self.refs: dict[str, ProcessRef] = {}
        self.replaced = 0
        self.cpu_seen: dict[int, tuple[float | None, float]] = {}  # node pid -> (its CPU time, since when unchanged)
        self.frozen: dict[str, str] = {}  # node -> why its supervisor killed it
        self.ends = EndRecorder(run)

    def spawn(self, request: dict, incarnation: int = 0) -> int:
        proc = _spawn(request, self.state_dir, incarnation)
        self.children[os.pidfd_open(proc.pid)] = (request["name"], proc)
        self.refs[request["name"]] = ProcessRef.of(proc.pid)
        return proc.pid

    def record(self) -> dict:
        return write_processes(self.state_dir, ProcessRef.of(os.getpid()), self.refs)

    def add_requested(self) -> None:
        """Start the nodes `launcher scale` asked for that were not started yet, each with GPUs of its own where
        launcher chose the nodes' GPUs."""
        new = [name for name in read_added(self.state_dir) if name not in self.by_name]
        for name in new:
            running = {node: self.by_name[node].get("gpus", "") for node, _ in self.children.values()}
            gpus, note = added_node_gpus(name, self.template.get("gpus"), running)
            request = {**self.template, "name": name, "env": added_node_env(self.template["env"], name)}
            if gpus is not None:
                request["gpus"] = request["env"]["CUDA_VISIBLE_DEVICES"] = gpus
            self.by_name[name] = request
            pid = self.spawn(request)
            write_added_record(self.state_dir, name, gpus, note)
            _say(f"node {name} added (pid {pid})" + (f"; {note}" if note else ""))
        if new:
            self.record()

    def stop_frozen(self) -> None:
        """Kill the nodes that are frozen (:data:`FROZEN_AFTER_SECONDS`): their CPU time and their status record
        stood still that long, and the process cannot run now."""
        now = time.time()
        for name, proc in list(self.children.values()):
            stat = read_stat(proc.pid)
            cpu = stat.cpu_s if stat else None
            seen = self.cpu_seen.get(proc.pid)
            if seen is None or seen[0] != cpu:
                self.cpu_seen[proc.pid] = (cpu, now)
                continue
            if now - seen[1] < FROZEN_AFTER_SECONDS or process_state(proc.pid) not in FROZEN_STATES:
                continue  # a node that waits on its store (an outage) sleeps: it is not frozen
            try:
                updated = float(self.run.get_record(status_key(name)).get("updated_at") or 0)
            except (StoreError, TypeError, ValueError):
                continue
            if now - updated >= FROZEN_AFTER_SECONDS:
                self.frozen[name] = (f"node process frozen: it used no CPU time and wrote no status for "
                                     f"{now - max(seen[1], updated):.0f}s (stopped, or stuck in the kernel); "
                                     "killed by its supervisor")
                _say(f"node {name} (pid {proc.pid}) is frozen: killing it and every process under it")
                for member in TreeReader(proc.pid).read():  # parents first: stopped, none of them reaps a child
                    try:
                        os.kill(member, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def ended(self, fd: int) -> None:
        name, proc = self.children.pop(fd)
        os.close(fd)
        returncode = proc.wait()  # at once: the pidfd is readable once the process has exited
        ended_at = time.time()
        _say(f"node {name} (pid {proc.pid}) ended: {returncode}")
        exit_code, reason = describe(returncode)
        reason = self.frozen.pop(name, reason)
        self.cpu_seen.pop(proc.pid, None)
        console = str(console_log_path(self.state_dir, name))
        run = self.ends.store_for(returncode)
        try:
            status = run.get_record(status_key(name))
            save_leftovers(run, name, status)
            if record_on_behalf(run, name, status, exit_code, reason, console, at=ended_at,
                                wants_replacement=lambda: replacement_wanted(self.run, self.recovery, self.replaced),
                                recovering=bool(self.recovery)):
                self.replaced += 1
                pid = self.spawn(self.by_name[name], incarnation=self.replaced)
                self.record()
                _say(f"node {name} replaced (pid {pid}, replacement {self.replaced})")
                return  # no exit record: the node goes on
        except StoreError as exc:
            _say(f"could not record the end of node {name}: {exc}")
        # Written last: a reader that sees it knows the node's outputs and logs are saved, or never will be; where the
        # work dir could not take the node's end, readers derive it from this record (with the console's last word).
        write_exit_record(self.state_dir, name, exit_code, with_error_line(reason, console), ended_at,
                          returncode=returncode)


def _wake_on(signum: int) -> int:
    """A file descriptor that becomes readable when ``signum`` arrives (signal.set_wakeup_fd)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    os.set_blocking(read, False)
    signal.signal(signum, lambda *_: None)  # the byte on the wake-up fd is the event
    signal.set_wakeup_fd(write)
    return read


def _say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def _spawn(request: dict, state_dir: str, incarnation: int = 0) -> subprocess.Popen:
    """Start one node process in its own session, its output appended to its console log."""
    env = {**os.environ, **request["env"], **({"LAUNCHER_NODE_INCARNATION": str(incarnation)} if incarnation else {})}
    with open(console_log_path(state_dir, request["name"]), "ab") as console:
        proc = subprocess.Popen(request["argv"], cwd=request["cwd"], env=env, stdin=subprocess.DEVNULL,
                                stdout=console, stderr=subprocess.STDOUT, start_new_session=True)
    return proc


if __name__ == "__main__":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(main(*sys.argv[1:3]))
