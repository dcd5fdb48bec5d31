"""Lost nodes replaced one by one where no supervisor process watches them (OCI per-node runs, Slurm).

Whichever client command reads the engine (``run`` while it follows, ``watch``, ``status``, ``cancel``) does
what the local supervisor does. When a member of a recovering run has ended (its OCI job run or Slurm job
ended, or the parent of its bootstrap recorded it lost) and its status is not final, or says lost, the command

1. creates ``{prefix}/{node}.{n}.json`` (create-if-absent: of several commands at once, on one machine or
   several, exactly one goes on) for incarnation ``n`` of the node, saying whether it will be started
   (``replacement_wanted``: the policy has restarts left, the run is neither cancelled nor given up);
2. ends the node's round for it (:func:`launcher.runs.supervision.end_round_for_lost_node`), so that the
   others meet in the next round;
3. has the backend start that node alone again (``start``: a job run, a one-node batch job) with
   ``LAUNCHER_NODE_INCARNATION=n``, and records what it started in the same object.

Every reader (``node_fates``, ``cancel``, ``clean``) takes a node's current unit (job run, job) from its newest
incarnation, and every unit the run has had from all of them.

Where a node cannot be started alone (OCI native mode: a job run's replicas start and end together), a node
that died without reporting is recorded lost once its unit has ended (steps 1 and 2, never 3), so an elastic
run that went on without it ends with the others' result.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional

from launcher.backends.base import NodeFate
from launcher.protocol.control import cancel_requested
from launcher.protocol.status import FINAL_STATES, status_key
from launcher.protocol.store import WorkDir

INCARNATION = "LAUNCHER_NODE_INCARNATION"


@dataclass(frozen=True)
class Incarnation:
    node: str
    number: int
    replaced: bool  # whether it is started (else the node stays lost)
    started: str | None = None  # what the engine started for it (job run, job), once it has
    lost: str | None = None  # what ran the incarnation before, which ended
    error: str | None = None  # why the engine did not start it
    at: float = 0.0  # when a command took it on

    def to_bytes(self) -> bytes:
        return json.dumps({"node": self.node, "number": self.number, "replaced": self.replaced,
                           "started": self.started, "lost": self.lost, "error": self.error,
                           "by": f"{socket.gethostname()}:{os.getpid()}", "at": self.at}).encode()


def key(prefix: str, node: str, number: int) -> str:
    return f"{prefix}/{node}.{number}.json"


def read(run: WorkDir, prefix: str) -> dict[str, list[Incarnation]]:
    """node -> its incarnations after the first, oldest first."""
    found: dict[str, list[Incarnation]] = {}
    for name in run.list(prefix):
        item = _parse(run.get_record(f"{prefix}/{name}"))
        if item is not None:
            found.setdefault(item.node, []).append(item)
    return {node: sorted(items, key=lambda item: item.number) for node, items in found.items()}


def _parse(record: dict[str, Any]) -> Incarnation | None:
    if not record.get("node") or not isinstance(record.get("number"), int):
        return None
    return Incarnation(record["node"], record["number"], bool(record.get("replaced")), record.get("started"),
                       record.get("lost"), record.get("error"), float(record.get("at") or 0.0))


def current(first: Mapping[str, str], records: Mapping[str, list[Incarnation]]) -> dict[str, str]:
    """node -> what its newest incarnation that was started runs on (its first unit where none was)."""
    newest = dict(first)
    for node, items in records.items():
        for item in items:
            if item.started:
                newest[node] = item.started
    return newest


def every_unit(first: Mapping[str, str], records: Mapping[str, list[Incarnation]]) -> list[str]:
    """Every unit (job run, job) the run has had: its first ones and every replacement."""
    return list(first.values()) + [item.started for items in records.values() for item in items if item.started]


def number_of(node: str, records: Mapping[str, list[Incarnation]]) -> int:
    """The incarnation whose unit is the node's current one (0: the first)."""
    return max((item.number for item in records.get(node, []) if item.started), default=0)


Start = Callable[[Incarnation], tuple[Optional[str], Optional[str]]]  # -> (what was started, or why it was not)


def recover(run: WorkDir, prefix: str, recovery: dict[str, Any], units: Mapping[str, str],
            fates: dict[str, NodeFate], records: Mapping[str, list[Incarnation]], *, engine: str, unit: str,
            start: Start | None) -> dict[str, NodeFate]:
    """The fates, with every lost member handled: its round ended and, where wanted (and ``start``: the engine
    can start one node alone), its replacement started. ``units``: node -> its current unit (``unit`` names its
    kind: job run, Slurm job). A node being replaced (by this command or another) reads as running: it is not lost to the run."""
    from launcher.runs.supervision import end_round_for_lost_node, replacement_refused, replacement_wanted

    result = dict(fates)
    for node, fate in fates.items():
        if fate.running or node not in units:
            continue
        number = number_of(node, records) + 1
        handled = next((item for item in records.get(node, []) if item.number == number), None)
        if handled is not None:  # another command took it on; what it started may not be recorded yet
            result[node] = _pending(fate, handled)
            continue
        status = run.get_record(status_key(node))
        if not _lost(run, status):
            continue
        replaced = sum(1 for items in records.values() for item in items if item.replaced)
        wanted = start is not None and replacement_wanted(run, recovery, replaced) and not _finished(run, fates)
        claim = Incarnation(node, number, wanted, lost=units[node], at=time.time())
        if not run.create(key(prefix, node, number), claim.to_bytes()):
            result[node] = _pending(fate, claim)  # another command won the claim an instant earlier
            continue
        end_round_for_lost_node(run, node, status, fate.exit_code,  # type: ignore[arg-type] - None: not stated
                                fate.reason or "it ended", "", fate.ended_at, replaced=wanted)
        if not wanted or start is None:
            continue
        started, error = start(claim)
        claim = replace(claim, started=started, error=error)
        run.put(key(prefix, node, number), claim.to_bytes())
        if claim.error:
            replacement_refused(run, node, status)
            print(f"note: node {node} was lost and {engine} refused its replacement: {claim.error}", file=sys.stderr)
            result[node] = replace(fate, reason=f"{fate.reason}; its replacement was refused: {claim.error}")
        else:
            result[node] = NodeFate(True, reason=f"replaced by {unit} {claim.started} (incarnation {number})")
    return result


def _lost(run: WorkDir, status: dict[str, Any]) -> bool:
    """A member of a recovering run whose unit ended before it reported its end (killed, its host lost), or that
    is recorded lost (by the parent of its bootstrap, or it is a replacement that died before it wrote any status
    and its status is still its predecessor's "lost") and not taken on yet (the caller's claim decides that)."""
    if status.get("round") is None or cancel_requested(run):
        return False
    return status.get("state") not in FINAL_STATES or status.get("state") == "lost"


def _finished(run: WorkDir, fates: Mapping[str, NodeFate]) -> bool:
    """A member got to the end of training: the run is over, and a node started now would have nothing to join
    (e.g. one whose late replacement was cancelled once the run ended reads as lost again)."""
    return any(run.get_record(status_key(node)).get("state") == "succeeded" for node in fates)


def _pending(fate: NodeFate, item: Incarnation) -> NodeFate:
    if not item.replaced or item.error:
        return fate
    return NodeFate(True, reason=f"being replaced (incarnation {item.number})")
