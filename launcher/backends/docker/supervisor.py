"""The watcher of a docker run's containers, a detached process on the client machine.

It gets ``{"run_id", "containers": {node: id}, "specs": {node: containers.create arguments}, "keep",
"since"}`` on stdin (the specs hold the nodes' env, secrets included: they never touch the disk),
answers with its own process identity, then follows the engine's ``die`` events for the run
(replayed from ``since``, so a container that died before it subscribed is not missed). For each
node that ends it saves the container's output to ``nodes/{node}.log``, records the node's failure
in the work dir when the node could not (``docker kill``, OOM), and writes the exit record. A lost
member of a recovering run is replaced instead, while the policy allows: a new container for the
same node (:func:`~launcher.backends.docker.containers.replacement_spec`), followed as its first
was. ``launcher scale`` adds nodes as :mod:`launcher.runs.additions` says: each gets a container like
the run's last node's. The
engine's events are read by a thread and the signal handler only queues a wake-up, so both are
handled in order by one loop. ``supervisor.json`` records each node's current container. When
every node has ended it removes the containers (replaced ones too) and the network, unless asked
to keep them.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Iterable

from launcher.backends.docker.containers import (NODE_LABEL, RUN_LABEL, added_node_spec, gpu_share,
                                                 replacement_spec)
from launcher.backends.docker.launch import describe_exit, remove_run, start_container
from launcher.dockerengine import api_error_text, connect
from launcher.fileio import atomic_write
from launcher.protocol.status import status_key
from launcher.protocol.store import StoreError, WorkDir
from launcher.runs.additions import ADD_SIGNAL, added_node_gpus, read_added, write_added_record
from launcher.runs.supervision import (EndRecorder, ProcessRef, console_log_path, record_on_behalf,
                                       replacement_refused, replacement_wanted, write_exit_record)

SUPERVISOR_FILE = "supervisor.json"  # the supervisor's identity and each node's current container
STREAM_ENDED = "the engine's event stream ended"  # queued by the events thread when the stream ends under it


def node_ended(client, ends: EndRecorder, state_dir: str, name: str, container_id: str, event_exit_code: int,
               ended_at: float, replace: Callable[[], bool] | None = None,
               wants_replacement: Callable[[], bool] | None = None, recovering: bool = False) -> None:
    """Save the container's output, record the node's end for it when it could not (in the work dir ``ends`` gives
    for its exit status), write the exit record; unless the node was lost, ``wants_replacement`` said so and
    ``replace`` started its replacement (the node goes on: no exit record)."""
    import docker.errors

    console = console_log_path(state_dir, name)
    exit_code, oom = event_exit_code, False
    try:
        container = client.containers.get(container_id)
        state = container.attrs["State"]
        exit_code, oom = int(state.get("ExitCode", event_exit_code)), bool(state.get("OOMKilled"))
        atomic_write(console, container.logs(stdout=True, stderr=True))
    except docker.errors.APIError as exc:  # removed by hand (docker rm -f) or being removed: the event says how
        atomic_write(console, f"(the container's output could not be saved: {api_error_text(exc)})\n".encode())
    reason = describe_exit(exit_code, oom)
    _say(f"node {name} ({container_id[:12]}) ended: {exit_code}")
    replaced = False
    run = ends.store_for(exit_code)
    try:
        status = run.get_record(status_key(name))
        wanted = record_on_behalf(run, name, status, exit_code, reason, str(console), at=ended_at,
                                  wants_replacement=wants_replacement, recovering=recovering)
        replaced = wanted and replace is not None and replace()
        if wanted and not replaced:
            replacement_refused(run, name, status)
    except StoreError as exc:
        _say(f"could not record the end of node {name}: {exc}")
    finally:  # written last: a reader that sees it knows the node's console is saved
        if not replaced:
            write_exit_record(state_dir, name, exit_code, reason, ended_at, oom_killed=oom)


def record(state_dir: str, me: dict[str, Any], containers: dict[str, str]) -> None:
    """``supervisor.json``: this supervisor's identity and each node's current container."""
    atomic_write(os.path.join(state_dir, SUPERVISOR_FILE), json.dumps({**me, "containers": containers}))


class Nodes:
    """Starts lost nodes again while the run's recovery policy allows, and nodes ``launcher scale`` asks for;
    records each node's current container."""

    def __init__(self, client: Any, run: WorkDir, state_dir: str, order: dict[str, Any], me: dict[str, Any]):
        self.client, self.run, self.state_dir, self.me = client, run, state_dir, me
        self.run_id = order["run_id"]
        self.specs: dict[str, dict[str, Any]] = order.get("specs") or {}
        first = next(iter(self.specs.values()), None)
        self.recovery = json.loads(first["environment"].get("LAUNCHER_RECOVERY") or "null") if first else None
        self.containers: dict[str, str] = dict(order["containers"])
        self.replaced = 0

    def wanted(self, name: str) -> bool:
        """Whether a lost ``name`` is to be started again (the recovery policy, a run neither cancelled nor over)."""
        return name in self.specs and replacement_wanted(self.run, self.recovery, self.replaced)

    def replace(self, name: str) -> bool:
        """Start ``name``'s replacement if wanted; whether it runs."""
        import docker.errors

        if not self.wanted(name):
            return False
        try:
            container_id = start_container(self.client, replacement_spec(self.specs[name], self.replaced + 1))
        except docker.errors.DockerException as exc:
            _say(f"could not replace node {name}: the Docker engine refused its new container: {api_error_text(exc)}")
            return False
        self.replaced += 1
        self.containers[name] = container_id
        record(self.state_dir, self.me, self.containers)
        _say(f"node {name} replaced ({container_id[:12]}, replacement {self.replaced})")
        return True

    def add_requested(self, running: Iterable[str]) -> dict[str, str]:
        """Start the nodes `launcher scale` asked for that were not started yet, each with host GPUs none of the
        ``running`` nodes holds where launcher gave the nodes GPUs; return node -> new container."""
        import docker.errors

        started = {}
        held = {node: gpu_share(self.specs[node]) or "" for node in running if node in self.specs}
        for name in read_added(self.state_dir):
            if name in self.specs or not self.specs:
                continue
            template = list(self.specs.values())[-1]
            gpus, note = added_node_gpus(name, gpu_share(template), held)
            spec = added_node_spec(template, self.run_id, name, gpus)
            try:
                started[name] = start_container(self.client, spec)
            except docker.errors.DockerException as exc:
                _say(f"could not add node {name}: the Docker engine refused its container: {api_error_text(exc)}")
                continue
            self.specs[name] = spec
            held[name] = gpus or ""
            write_added_record(self.state_dir, name, gpus, note)
            _say(f"node {name} added ({started[name][:12]})" + (f"; {note}" if note else ""))
        if started:
            self.containers.update(started)
            record(self.state_dir, self.me, self.containers)
        return started


def main(state_dir: str, run_url: str) -> int:
    inbox: queue.SimpleQueue = queue.SimpleQueue()  # engine events, and None for a scale request
    signal.signal(ADD_SIGNAL, lambda *_: inbox.put(None))  # SimpleQueue.put is safe in a signal handler
    order = json.loads(sys.stdin.read())
    me = {"supervisor": asdict(ProcessRef.of(os.getpid()))}
    record(state_dir, me, order["containers"])
    try:
        sys.stdout.write(json.dumps(me) + "\n")
        sys.stdout.close()
    except BrokenPipeError:
        pass
    client = connect()
    run = WorkDir(run_url)
    nodes = Nodes(client, run, state_dir, order, me)
    ends = EndRecorder(run)
    waiting = dict(order["containers"])  # node -> its current container's id, while it runs
    events = client.events(since=int(order["since"]) - 1, decode=True,
                           filters={"type": "container", "event": "die", "label": f"{RUN_LABEL}={order['run_id']}"})
    threading.Thread(target=_forward, args=(events, inbox), daemon=True).start()
    try:
        while waiting:
            event = inbox.get()
            if event is None:
                waiting.update(nodes.add_requested(waiting))
                continue
            if event == STREAM_ENDED:  # the next command that looks takes over (DockerBackend._take_over)
                raise RuntimeError(f"{STREAM_ENDED} while nodes {', '.join(sorted(waiting))} still ran")
            actor = event.get("Actor", {})
            name = actor.get("Attributes", {}).get(NODE_LABEL)
            if name not in waiting or actor.get("ID") != waiting[name]:  # not a replaced container's late event
                continue
            ended_at = event.get("timeNano", time.time_ns()) / 1e9  # when the engine saw it die
            try:
                node_ended(client, ends, state_dir, name, waiting[name], int(actor["Attributes"].get("exitCode", -1)),
                           ended_at, replace=functools.partial(nodes.replace, name),
                           wants_replacement=functools.partial(nodes.wanted, name), recovering=bool(nodes.recovery))
            except Exception as exc:  # noqa: BLE001 - one node's trouble must not leave the others unrecorded
                _say(f"could not record the end of node {name}: {type(exc).__name__}: {exc}")
            if nodes.containers[name] != waiting[name]:  # replaced: follow its new container
                waiting[name] = nodes.containers[name]
            else:
                waiting.pop(name)
    finally:
        events.close()
    if not order.get("keep"):
        removed = remove_run(client, order["run_id"])
        _say(f"removed {', '.join(removed) or 'nothing (already gone)'}")
    return 0


def _forward(events: Any, inbox: queue.SimpleQueue) -> None:
    try:
        for event in events:
            inbox.put(event)
    except Exception:  # noqa: BLE001 - also how it ends when main closes the stream: nobody reads the inbox then
        pass
    inbox.put(STREAM_ENDED)


def _say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(main(*sys.argv[1:3]))
