"""Per-node OCI runs that recover: a lost node's job run is replaced by a new one for that node alone.

OCI has no supervisor process: whichever client command reads the service (``run`` while it
follows, ``watch``, ``status``, ``cancel``) does what the local supervisor does. When the job run
of a member of a recovering run has ended and the node's status is not final (it died without
reporting: killed, its host lost, cancelled from outside), the command

1. creates ``oci/incarnations/{node}.{n}.json`` (create-if-absent: of several commands at once,
   on one machine or several, exactly one goes on) for incarnation ``n`` of the node, saying
   whether it will be started (``replacement_wanted``: the policy has restarts left, the run is
   neither cancelled nor given up);
2. ends the node's round for it (:func:`launcher.runs.supervision.end_round_for_lost_node`), so
   that the others meet in the next round;
3. creates a job run for that node alone, with the lost run's own settings as the service returns
   them and ``LAUNCHER_NODE_INCARNATION=n`` (an ``opc-retry-token`` per node and incarnation: a
   retry never creates two), and records its OCID in the same object.

Every reader (``node_fates``, ``cancel``, ``clean``) takes a node's job run from its newest
incarnation, and the job's runs for clean-up from all of them.

Native mode: the replicas of a job run cannot be replaced one by one; a replica that died without
reporting is recorded lost once the job run has ended (steps 1 and 2, never 3), so an elastic
run that went on without it ends with the others' result.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

from launcher.backends.base import NodeFate
from launcher.node.control import cancel_requested
from launcher.node.status import FINAL_STATES, status_key
from launcher.node.store import WorkDir

PREFIX = "oci/incarnations"
INCARNATION = "LAUNCHER_NODE_INCARNATION"


@dataclass(frozen=True)
class Incarnation:
    node: str
    number: int
    replaced: bool  # whether a job run is started for it (else the node stays lost)
    job_run: str | None = None  # its job run, once created
    lost_job_run: str | None = None  # the job run of the incarnation before, which ended
    error: str | None = None  # why the service did not create its job run
    at: float = 0.0  # when a command took it on

    def to_bytes(self) -> bytes:
        return json.dumps({"node": self.node, "number": self.number, "replaced": self.replaced,
                           "job_run": self.job_run, "lost_job_run": self.lost_job_run, "error": self.error,
                           "by": f"{socket.gethostname()}:{os.getpid()}", "at": self.at}).encode()


def key(node: str, number: int) -> str:
    return f"{PREFIX}/{node}.{number}.json"


def read(run: WorkDir) -> dict[str, list[Incarnation]]:
    """node -> its incarnations after the first, oldest first."""
    found: dict[str, list[Incarnation]] = {}
    for name in run.list(PREFIX):
        item = _parse(run.get_record(f"{PREFIX}/{name}"))
        if item is not None:
            found.setdefault(item.node, []).append(item)
    return {node: sorted(items, key=lambda item: item.number) for node, items in found.items()}


def _parse(record: dict[str, Any]) -> Incarnation | None:
    if not record.get("node") or not isinstance(record.get("number"), int):
        return None
    return Incarnation(record["node"], record["number"], bool(record.get("replaced")), record.get("job_run"),
                       record.get("lost_job_run"), record.get("error"), float(record.get("at") or 0.0))


def current(first: Mapping[str, str], records: Mapping[str, list[Incarnation]]) -> dict[str, str]:
    """node -> the job run of its newest incarnation that has one."""
    newest = dict(first)
    for node, items in records.items():
        for item in items:
            if item.job_run:
                newest[node] = item.job_run
    return newest


def every_run(first: Mapping[str, str], records: Mapping[str, list[Incarnation]]) -> list[str]:
    """Every job run the run has had: its first ones and every replacement."""
    return list(first.values()) + [item.job_run for items in records.values() for item in items if item.job_run]


def number_of(node: str, records: Mapping[str, list[Incarnation]]) -> int:
    """The incarnation whose job run is the node's current one (0: the first)."""
    return max((item.number for item in records.get(node, []) if item.job_run), default=0)


def recover(run: WorkDir, client: Any, run_id: str, recovery: dict[str, Any], runs: Mapping[str, Any],
            fates: dict[str, NodeFate], records: Mapping[str, list[Incarnation]], *,
            replaceable: bool = True) -> dict[str, NodeFate]:
    """The fates, with every lost member handled: its round ended and, where wanted (and ``replaceable``: a
    per-node run), its replacement created. A node being replaced (by this command or another) reads as
    running: it is not lost to the run."""
    from launcher.runs.supervision import end_round_for_lost_node, replacement_wanted

    result = dict(fates)
    for node, fate in fates.items():
        if fate.running or node not in runs:
            continue
        number = number_of(node, records) + 1
        handled = next((item for item in records.get(node, []) if item.number == number), None)
        if handled is not None:  # another command took it on; its job run may not be recorded yet
            result[node] = _pending(fate, handled)
            continue
        status = run.get_record(status_key(node))
        if not _lost(run, status, records.get(node, [])):
            taken = _parse(run.get_record(key(node, number))) if status.get("state") == "lost" else None
            if taken is not None:  # its "lost" was written by a command that took it on since we looked
                result[node] = _pending(fate, taken)
            continue
        replaced = sum(1 for items in records.values() for item in items if item.replaced)
        wanted = replaceable and replacement_wanted(run, recovery, replaced)
        claim = Incarnation(node, number, wanted, lost_job_run=runs[node].id, at=time.time())
        if not run.create(key(node, number), claim.to_bytes()):
            result[node] = _pending(fate, claim)  # another command won the claim an instant earlier
            continue
        end_round_for_lost_node(run, node, status, fate.exit_code,  # type: ignore[arg-type] - None: not stated
                                fate.reason or "its job run ended", "", fate.ended_at)
        if not wanted:
            continue
        claim = _start(client, run_id, claim)
        run.put(key(node, number), claim.to_bytes())
        if claim.error:
            print(f"note: node {node} was lost and OCI refused its replacement: {claim.error}", file=sys.stderr)
            result[node] = replace(fate, reason=f"{fate.reason}; its replacement was refused: {claim.error}")
        else:
            result[node] = NodeFate(True, reason=f"replaced by job run {claim.job_run} (incarnation {number})")
    return result


def _lost(run: WorkDir, status: dict[str, Any], earlier: list[Incarnation]) -> bool:
    """A member of a recovering run whose job run ended before it reported its end: killed, its host lost, or a
    replacement that died before it wrote any status (its status is still its predecessor's "lost")."""
    if status.get("round") is None or cancel_requested(run):
        return False
    if status.get("state") not in FINAL_STATES:
        return True
    started = [item.at for item in earlier if item.job_run]
    return status.get("state") == "lost" and bool(started) and float(status.get("ended_at") or 0) < max(started)


def _pending(fate: NodeFate, item: Incarnation) -> NodeFate:
    if not item.replaced or item.error:
        return fate
    return NodeFate(True, reason=f"being replaced (incarnation {item.number})")


def _start(client: Any, run_id: str, claim: Incarnation) -> Incarnation:
    """Create the job run of ``claim``: the lost run's settings, as the service returns them, with the incarnation."""
    from launcher.backends.oci import service

    job_run, error = service.run_like(
        client, str(claim.lost_job_run), lambda env: {**env, INCARNATION: str(claim.number)},
        display_name=f"{run_id}-{claim.node}-{claim.number}", tags={"launcher-incarnation": str(claim.number)},
        token=service.token(run_id, f"run/{claim.node}/{claim.number}"))
    return replace(claim, job_run=job_run, error=error)
