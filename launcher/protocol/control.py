"""Run-wide control markers under ``control/``: a cancel request, one marker per failed node, and one leave
request per node asked to leave an elastic run (``launcher scale``).

Peers list ``control/`` every ``interval`` seconds while training (one LIST), so a failure or
cancel is noticed within that interval plus one request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from launcher.protocol.store import WorkDir

CONTROL_PREFIX = "control"
CANCEL = "cancel"
LIMIT = "limit"  # the run reached one of its own limits (maxRuntime): no node is the cause
SCALE = "scale.json"  # the size `launcher scale` last asked for (a record for people; nodes act on leave requests)
LEFT = "left"  # the final state of a node that left on request: the run goes on without it, nothing failed


def engine_end_key(job_id: str) -> str:
    return f"{CONTROL_PREFIX}/failed.slurm-job-{job_id}.json"


def record_engine_end(run: WorkDir, job_id: str, node: str, reason: str, *, lost: bool = True,
                      at: float | None = None, grace: float | None = None) -> None:
    """Slurm ends (or is about to end) job ``job_id`` itself: its time limit, a node's failure, preemption. One
    record for every reader and every node, whoever sees it first (a node told by Slurm, the client reading the
    controller); ``lost``: the machines were taken, the training did no wrong, and a whole-run retry resumes it;
    ``grace``: how long every node's training may take to stop (the time limit's notice)."""
    run.create(engine_end_key(job_id), json.dumps({
        "node": node, "rank": None, "exit_code": None, "reason": reason, "kind": "lost" if lost else "failure",
        "at": time.time() if at is None else at, "reported_by": "slurm",
        **({"grace": grace} if grace else {})}).encode())


def node_label(node: str) -> str:
    """``node w-1``: the node's index among nodes is no rank (its processes have global ranks of their own)."""
    return f"node {node}"


def failure_key(node: str) -> str:
    return f"{CONTROL_PREFIX}/failed.{node}.json"


def leave_key(node: str) -> str:
    return f"{CONTROL_PREFIX}/leave.{node}.json"


def request_leave(run: WorkDir, node: str, reason: str) -> None:
    """Ask ``node`` to leave its elastic run: it ends its round (a leave), syncs its outputs and exits, ``left``."""
    run.put(leave_key(node), json.dumps({"node": node, "reason": reason, "at": time.time()}).encode())


def cancel_requested(run: WorkDir) -> bool:
    return CANCEL in run.list(CONTROL_PREFIX)


def request_cancel(run: WorkDir, reason: str = "cancelled by user") -> None:
    run.put(f"{CONTROL_PREFIX}/{CANCEL}", json.dumps({"reason": reason, "at": time.time()}).encode())


def record_limit(run: WorkDir, reason: str, node: str) -> None:
    """The run reached a limit of its own: every node stops, failed, and no node is blamed. First writer wins."""
    run.create(f"{CONTROL_PREFIX}/{LIMIT}", json.dumps({"reason": reason, "at": time.time(), "seen_by": node}).encode())


def record_failure(run: WorkDir, node: str, rank: int | None, exit_code: int | None, reason: str,
                   details: dict | None = None, at: float | None = None) -> None:
    """The failure marker. ``at``: when the node failed, where someone else records it later (default: now)."""
    body = {"node": node, "rank": rank, "exit_code": exit_code, "reason": reason,
            "at": time.time() if at is None else at, **(details or {})}
    run.put(failure_key(node), json.dumps(body).encode())


@dataclass(frozen=True)
class StopRequest:
    state: str  # "failed", "cancelled" or LEFT (this node was asked to leave)
    reason: str
    limit: bool = False  # the run reached its own limit (maxRuntime)
    grace: float | None = None  # how long training may take to stop (None: the node's default)


class ControlWatch:
    """Rate-limited check of ``control/`` on behalf of one node."""

    def __init__(self, run: WorkDir, node: str, interval: float = 2.0):
        self.run = run
        self.node = node
        self.interval = interval
        self._next = 0.0

    def check(self, force: bool = False) -> StopRequest | None:
        now = time.monotonic()
        if not force and now < self._next:
            return None
        self._next = now + self.interval
        names = self.run.list(CONTROL_PREFIX)
        if CANCEL in names:
            return StopRequest("cancelled", "the run was cancelled")
        if LIMIT in names:
            limit = self.run.get_record(f"{CONTROL_PREFIX}/{LIMIT}")
            return StopRequest("failed", f"stopped: {limit.get('reason', 'the run reached a limit')}", limit=True)
        for name in names:
            if name.startswith("failed.") and name != f"failed.{self.node}.json":
                peer = self.run.get_record(f"{CONTROL_PREFIX}/{name}")
                if peer.get("reported_by"):  # the engine ended the run (Slurm's time limit): its words
                    return StopRequest("failed", f"stopped: {peer.get('reason')}", grace=peer.get("grace"))
                return StopRequest("failed", f"stopped because {node_label(peer.get('node', name))} "
                                   f"failed with exit code {peer.get('exit_code')}")
        if leave_key(self.node).rsplit("/", 1)[1] in names:
            leave = self.run.get_record(leave_key(self.node))  # it stands for a replacement of this node too
            return StopRequest(LEFT, str(leave.get("reason") or "asked to leave the run"))
        return None
