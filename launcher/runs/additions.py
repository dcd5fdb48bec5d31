"""How ``launcher scale`` asks a run's supervisor (local processes, docker containers) for more nodes.

Only the supervisor holds the nodes' env (secrets included, never on disk), so only it can start one
more node like them. The client appends the new names to ``added.json`` in the run's state directory
and sends the supervisor :data:`ADD_SIGNAL`; the supervisor starts every name there it has not
started yet and records it where its backend's verbs (status, cancel, clean) find it, which is what
the client waits for. Where launcher shared this machine's GPUs out among the nodes, the new node gets
GPUs none of the running nodes holds (:func:`added_node_gpus`), or none, said in a note the supervisor
leaves in ``nodes/{node}.added.json`` and the client shows.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from launcher import node_names
from launcher.errors import BackendError
from launcher.fileio import atomic_write
from launcher.wording import plural

if TYPE_CHECKING:
    from launcher.runs.supervision import ProcessRef

ADDED_FILE = "added.json"  # the names of the nodes `launcher scale` asked for, in order
ADD_SIGNAL = signal.SIGUSR1  # tells the supervisor to read ADDED_FILE


def read_added(state_dir: str | os.PathLike) -> list[str]:
    try:
        names = json.loads((Path(state_dir) / ADDED_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def added_node_env(env: Mapping[str, str], name: str) -> dict[str, str]:
    """The env of node ``name`` that `launcher scale` adds, from that of the node it is modelled on: its own name,
    and the groups grown to hold it (:func:`launcher.node_names.including`)."""
    groups = node_names.including(json.loads(env["LAUNCHER_NODE_GROUPS"]), name)
    return {**env, "LAUNCHER_NODE_NAME": name, "LAUNCHER_NODE_GROUPS": json.dumps(groups)}


def added_node_gpus(name: str, template: str | None, running: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The GPUs (a CUDA_VISIBLE_DEVICES value, host ids) for node ``name`` added to a run whose ``running`` nodes
    hold theirs, as many as ``template`` (the share of the node it is modelled on; None: launcher does not choose
    the run's devices, "" none: it runs on CPU), and a note when it gets none because none are free."""
    from launcher.gpus import free_share, visible_gpus

    if not template:
        return template, None
    gpus = [gpu.index for gpu in visible_gpus()]
    share = free_share(gpus, running.values(), len(template.split(",")))
    if share is not None:
        return share, None
    held = "; ".join(f"{node}: {devices}" for node, devices in running.items() if devices)
    return "", (f"node {name} gets no GPU: it would need {plural(len(template.split(',')), 'GPU')}, and the run's "
                f"nodes hold the {plural(len(gpus), 'GPU')} here ({held}); its training processes run on CPU")


def added_record_path(state_dir: str | os.PathLike, name: str) -> Path:
    return Path(state_dir) / "nodes" / f"{name}.added.json"


def write_added_record(state_dir: str | os.PathLike, name: str, gpus: str | None, note: str | None) -> None:
    """What the supervisor gave an added node; written before it records the node (the client waits for that)."""
    atomic_write(added_record_path(state_dir, name), json.dumps({"gpus": gpus, "note": note}))


def request_nodes(state_dir: str | os.PathLike, supervisor: ProcessRef, names: Sequence[str],
                  recorded: Callable[[], Iterable[str]], timeout: float) -> list[str]:
    """Ask ``supervisor`` to start ``names``; return once ``recorded()`` (the nodes its record names) holds
    them all. The supervisor writes no other notice, so its record is polled."""
    earlier = read_added(state_dir)
    atomic_write(Path(state_dir) / ADDED_FILE, json.dumps(earlier + [n for n in names if n not in earlier]))
    os.kill(supervisor.pid, ADD_SIGNAL)
    deadline = time.monotonic() + timeout
    while not set(names) <= set(recorded()):
        if time.monotonic() >= deadline or not supervisor.running():
            raise BackendError(f"the supervisor did not start {', '.join(names)} within {timeout:g}s; see "
                               f"{Path(state_dir) / 'supervisor.log'}")
        time.sleep(0.05)
    for name in names:
        try:
            note = json.loads(added_record_path(state_dir, name).read_text()).get("note")
        except (OSError, ValueError, AttributeError):
            note = None
        if note:
            sys.stderr.write(f"note: {note}\n")
    return list(names)
