"""The watcher of a docker run's containers, a detached process on the client machine.

It gets ``{"run_id", "containers": {node: id}, "keep", "since"}`` on stdin, answers with its own
process identity, then follows the engine's ``die`` events for the run (replayed from ``since``,
so a container that died before it subscribed is not missed). For each node that ends it saves
the container's output to ``nodes/{node}.log``, records the node's failure in the work dir when
the node could not (``docker kill``, OOM), and writes the exit record. When every node has ended
it removes the containers and the network, unless asked to keep them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict

from launcher.backends.docker.containers import NODE_LABEL, RUN_LABEL
from launcher.backends.docker.launch import describe_exit, remove_run
from launcher.dockerengine import api_error_text, connect
from launcher.fileio import atomic_write
from launcher.node.status import status_key
from launcher.node.store import StoreError, WorkDir
from launcher.runs.supervision import (ProcessRef, console_log_path, record_on_behalf,
                                       write_exit_record)

SUPERVISOR_FILE = "supervisor.json"


def node_ended(client, run: WorkDir, state_dir: str, name: str, container_id: str, event_exit_code: int,
               ended_at: float) -> None:
    """Save the container's output, record the node's end for it when it could not, write the exit record."""
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
    print(f"{time.strftime('%H:%M:%S')} node {name} ({container_id[:12]}) ended: {exit_code}", file=sys.stderr,
          flush=True)
    try:
        status = run.get_record(status_key(name))
        record_on_behalf(run, name, status, exit_code, reason, str(console), at=ended_at)
    except StoreError as exc:
        print(f"could not record the end of node {name}: {exc}", file=sys.stderr, flush=True)
    finally:  # written last: a reader that sees it knows the node's console is saved
        write_exit_record(state_dir, name, exit_code, reason, ended_at, oom_killed=oom)


def main(state_dir: str, run_url: str) -> int:
    order = json.loads(sys.stdin.read())
    me = {"supervisor": asdict(ProcessRef.of(os.getpid()))}
    atomic_write(os.path.join(state_dir, SUPERVISOR_FILE), json.dumps(me))
    try:
        sys.stdout.write(json.dumps(me) + "\n")
        sys.stdout.close()
    except BrokenPipeError:
        pass
    client = connect()
    run = WorkDir(run_url)
    waiting = dict(order["containers"])  # node -> container id
    events = client.events(since=int(order["since"]) - 1, decode=True,
                           filters={"type": "container", "event": "die", "label": f"{RUN_LABEL}={order['run_id']}"})
    try:
        for event in events:
            attributes = event.get("Actor", {}).get("Attributes", {})
            name = attributes.get(NODE_LABEL)
            if name in waiting:
                ended_at = event.get("timeNano", time.time_ns()) / 1e9  # when the engine saw it die
                try:
                    node_ended(client, run, state_dir, name, waiting.pop(name), int(attributes.get("exitCode", -1)),
                               ended_at)
                except Exception as exc:  # noqa: BLE001 - one node's trouble must not leave the others unrecorded
                    print(f"could not record the end of node {name}: {type(exc).__name__}: {exc}", file=sys.stderr,
                          flush=True)
            if not waiting:
                break
    finally:
        events.close()
    if not order.get("keep"):
        removed = remove_run(client, order["run_id"])
        print(f"removed {', '.join(removed) or 'nothing (already gone)'}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(main(*sys.argv[1:3]))
