"""The recovery policy, in one place: which ends of a membership round are retried, how many restarts a run
gets, and whether a lost node is replaced. Pure: used by the nodes when they decide a round
(:mod:`launcher.protocol.rounds`) and by the backends' supervisors when a node process dies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

LOST = "lost"  # the node was killed from outside, or died (written by its supervisor)
KILLED = "killed"  # one of its training processes was killed from outside, the node alive: retried as LOST is
FAILURE = "failure"  # training exited non-zero on its own (an exception, an exit code)
PEER = "peer"  # this node's ranks only lost a peer: a consequence, never a cause
JOIN = "join"  # a node (a replacement, or one more) asks to join: no failure at all
LEAVE = "leave"  # a node leaves on request (`launcher scale`): no failure at all, and it is not waited for
# the engine can never start the run as submitted (a Slurm job asking more than its partition has): never retried
NEVER_STARTS = "never starts"
CAUSES = (LOST, KILLED, FAILURE)  # the ends that cost a restart (or stop the run)


@dataclass(frozen=True)
class RoundEnd:
    """Why a round ended, as one node (or a supervisor, for a dead node) recorded it."""

    node: str
    kind: str  # LOST, KILLED, FAILURE, PEER, JOIN or LEAVE
    reason: str
    exit_code: int | None = None
    at: float = 0.0
    replaced: bool = False  # LOST: its supervisor starts a replacement, which the next round waits for

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "RoundEnd":
        return cls(str(record.get("node")), str(record.get("kind")), str(record.get("reason")),
                   record.get("exit_code"), float(record.get("at") or 0.0), bool(record.get("replaced")))


@dataclass(frozen=True)
class Policy:
    max_restarts: int
    retry_on: tuple[str | int, ...] = (LOST,)
    min_nodes: int = 1
    replacement_wait: float = 30.0  # seconds a round waits for a lost member's replacement before going on

    @classmethod
    def from_settings(cls, recovery: Mapping[str, Any]) -> "Policy":
        return cls(int(recovery.get("maxRestarts", 0)), tuple(recovery.get("retryOn") or (LOST,)),
                   int(recovery.get("minNodes", 1)), float(recovery.get("replacementWait", 30)))

    def retried(self, end: RoundEnd) -> bool:
        if end.kind in (JOIN, LEAVE, PEER):
            return True
        if end.kind in (LOST, KILLED):
            return LOST in self.retry_on
        return FAILURE in self.retry_on or end.exit_code in self.retry_on

    def next_round(self, ends: Iterable[RoundEnd], restarts: int) -> tuple[int, str | None, RoundEnd | None]:
        """(restarts after this round change, why the run must stop instead or None, and the end that made it stop:
        the cause, which need not be the node that says so)."""
        causes = sorted((end for end in ends if end.kind in CAUSES), key=lambda end: end.at)
        refused = next((end for end in causes if not self.retried(end)), None)
        if refused is not None:
            return (restarts, f"not retried ({_kind_words(refused)} is not in recovery.retryOn): {said(refused)}",
                    refused)
        if not causes:
            return restarts, None, None  # a join or a leave: no restart is used up
        if restarts >= self.max_restarts:
            return restarts, f"gave up after {restarts} of {self.max_restarts} restarts: {said(causes[0])}", causes[0]
        return restarts + 1, None, None

    def replaces(self, restarts_so_far: int) -> bool:
        """Whether a backend starts a lost node again (as the same node, a new incarnation)."""
        return restarts_so_far < self.max_restarts and LOST in self.retry_on


def _kind_words(end: RoundEnd) -> str:
    words = {LOST: "a lost node", KILLED: "a training process killed from outside (lost)"}
    return words.get(end.kind) or f"exit status {end.exit_code}"


def said(end: RoundEnd) -> str:
    """``node w-1: node process killed by SIGKILL``: an end as summaries show it."""
    return f"node {end.node}: {end.reason}"
