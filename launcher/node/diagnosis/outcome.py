"""How training ended for this node, and so how the node ends: its state, reason and exit status, or, in a
recovering run, the next membership round.

Several ends can happen at once (this node's hang, the work dir lost, a leave, the run's limit, a cancel, a
peer's failure, a rank's own error); the order of the checks in :func:`decide` is which one wins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from launcher.node.diagnosis.cause import Cause, describe, describe_kill, lost_a_peer
from launcher.protocol.control import LEFT, StopRequest
from launcher.protocol.exits import EXIT_CANCELLED, EXIT_PEER_FAILED, EXIT_STORE, EXIT_TIMED_OUT
from launcher.protocol.rendezvous import Decision
from launcher.node.torchrun.shim import EXIT_NO_MAIN
from launcher.protocol.recovery import FAILURE, KILLED, PEER, RoundEnd


@dataclass(frozen=True)
class Ended:
    """How torchrun's run ended: its exit status, and whether this node stopped it (and why)."""
    code: int
    own_failure: str | None = None  # the hang watchdog: this node is the cause
    stopped: bool = False  # stopped on request (a signal after training ended changes nothing)
    limit: str | None = None  # the run's own limit (maxRuntime) was reached: no node is the cause
    round_over: bool = False  # another node ended the membership round (recovering runs)
    store_failure: str | None = None  # the work dir could not be used (gone for good, full): this node's failure


@dataclass(frozen=True)
class Outcome:
    """This node's final state, reason and exit status; ``mark_failed``: its own failure, to be marked."""
    state: str
    reason: str | None
    exit_code: int
    mark_failed: bool = False
    details: dict | None = None
    next_round: bool = False  # recovering runs: training goes on in the next membership round
    round_end: RoundEnd | None = None  # why this node ends the round, to record (None: others ended it)


def decide(ended: Ended, decision: Decision, *, node: str, rendezvous_timeout: float, recovering: bool,
           stop_request: StopRequest | None, cause_here: Callable[[], Cause],
           peer_stop: Callable[[Cause], StopRequest | None]) -> Outcome:
    """How training ended for ``node``. ``cause_here`` reads torchrun's and the ranks' output (called only where a
    cause is needed, and while the rank logs exist); ``peer_stop`` reads a cancel or a peer's failure marker, waiting
    a moment for it when this node's ranks only lost a peer."""
    if ended.own_failure and recovering and not stop_request:  # a hang ends the round: the policy decides
        return Outcome("waiting", ended.own_failure, EXIT_TIMED_OUT, next_round=True,
                       round_end=RoundEnd(node, FAILURE, ended.own_failure, EXIT_TIMED_OUT, time.time()))
    if ended.own_failure:
        return Outcome("failed", ended.own_failure, EXIT_TIMED_OUT, mark_failed=True)
    if ended.store_failure:
        return Outcome("failed", ended.store_failure, EXIT_STORE, mark_failed=True)
    if stop_request and stop_request.state == LEFT:  # asked to leave: nothing failed
        return Outcome(LEFT, stop_request.reason, 0)
    if ended.limit:
        return Outcome("failed", f"stopped: {ended.limit}", EXIT_TIMED_OUT)
    if ended.code == 0 and not ended.stopped and not ended.round_over:  # ended on its own, successfully: a
        return Outcome("succeeded", None, 0)  # later SIGTERM (compose stopping the others) changes nothing
    if recovering and not stop_request:
        return round_outcome(ended, node, cause_here)
    cause = cause_here()
    # Did training fail because the run was cancelled or a peer failed first? Then that is the cause; but a
    # rank here that raised an error of its own (not a lost peer) failed on its own too: "also failed".
    # torchrun signalled along with this node (Slurm's scancel or time limit signals a whole step) ended on its
    # own as the node was stopping: the stop is the cause, not torchrun's SignalException.
    stopping = stop_request is not None and cause.torchrun
    if not ended.stopped and cause.exception and not lost_a_peer(cause) and not stopping:
        return _failed(cause, ended)
    request = stop_request or peer_stop(cause)
    if request:
        code = EXIT_CANCELLED if request.state == "cancelled" else EXIT_TIMED_OUT if request.limit \
            else EXIT_PEER_FAILED
        return Outcome(request.state, request.reason, code)
    if ended.code == EXIT_NO_MAIN:
        reason = (f"the main node {decision.main} did not open {decision.master_addr}:{decision.master_port} "
                  f"within {rendezvous_timeout:g}s")
        return Outcome("failed", reason, EXIT_PEER_FAILED, mark_failed=True)
    return _failed(cause, ended)


def round_outcome(ended: Ended, node: str, cause_here: Callable[[], Cause]) -> Outcome:
    """A recovering run whose round ended: why, as ``node`` saw it (killed / failure / a lost peer), or by others.
    (A hang here ends the round as a failure of exit status 124, retried where ``recovery.retryOn`` has
    ``failure`` or 124; the work dir lost ends the run: :func:`decide` returns those first.)"""
    if ended.round_over:
        return Outcome("waiting", None, 0, next_round=True)
    cause = cause_here()
    kind = PEER if lost_a_peer(cause) else KILLED if cause.signal in ("SIGKILL", "SIGTERM") else FAILURE
    reason = describe_kill(cause) if kind == KILLED else describe(cause.to_dict())
    code = cause.exit_code or ended.code
    return Outcome("waiting", reason, code, next_round=True, round_end=RoundEnd(node, kind, reason, code, time.time()))


def _failed(cause: Cause, ended: Ended) -> Outcome:
    return Outcome("failed", describe(cause.to_dict()), cause.exit_code or ended.code, mark_failed=True,
                   details={"cause": cause.to_dict()})
