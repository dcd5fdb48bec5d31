"""One node of a recovering run: it trains in membership rounds (:mod:`launcher.protocol.rounds`) until training
succeeds or the run must stop, and says why each round ended. The node program (:mod:`launcher.node.main`)
starts, supervises and ends each round's training; this module decides which round comes next."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Protocol

from launcher.protocol.control import LEFT
from launcher.protocol.exits import EXIT_PEER_FAILED, EXIT_STORE
from launcher.protocol.events import REGISTERED
from launcher.node.netutil import free_port
from launcher.node.diagnosis.outcome import Outcome
from launcher.protocol.rendezvous import Registration, RendezvousStopped
from launcher.protocol.rounds import Round, Rounds, RunOver, Superseded, Timing, describe_end
from launcher.protocol.store import StoreError
from launcher.runs.attempts import restarts_before
from launcher.protocol.recovery import JOIN, PEER, Policy, RoundEnd
from launcher.wording import plural

if TYPE_CHECKING:
    from launcher.node.settings import NodeSettings
    from launcher.protocol.control import ControlWatch
    from launcher.protocol.events import EventLog
    from launcher.protocol.rendezvous import Decision
    from launcher.protocol.status import StatusRecord
    from launcher.protocol.store import WorkDir

PEER_ROOT_SECONDS = 1.0  # how long a node whose ranks lost a peer looks for what happened to it, for its message


class Node(Protocol):
    """What the rounds need of the node program (:class:`launcher.node.main.Node`), named here so that this module
    does not import the one that runs it."""

    settings: NodeSettings
    run: WorkDir
    status: StatusRecord
    events: EventLog
    control: ControlWatch

    def say(self, message: str) -> None: ...
    def start_round(self, decision: Decision, number: int | None = None, restarts: int = 0) -> None: ...
    def restore(self, number: int) -> None: ...
    def train(self, decision: Decision, rounds: Rounds | None = None, number: int = 0) -> Outcome: ...
    def conclude(self, outcome: Outcome) -> int: ...
    def sync_failure(self, background: bool = False) -> str | None: ...
    def finish(self, state: str, reason: str | None, exit_code: int, *, mark_failed: bool = False,
               details: dict | None = None) -> int: ...


class RecoveryLoop:
    """The rounds of ``node`` in its recovering run."""

    def __init__(self, node: Node):
        self.node = node
        settings = node.settings
        self.rounds = Rounds(node.run, settings.nodes, Policy.from_settings(settings.recovery),
                             Timing.for_store(node.run),
                             grows=settings.groups[-1][0] if len(settings.groups) > 1 else None)

    def run(self, me: Registration) -> int:
        """Train in membership rounds until training succeeds or the run must stop; the node's exit status."""
        node, settings, rounds = self.node, self.node.settings, self.rounds
        number = self._first_round()
        while True:
            if number > 0:
                me = me.again(settings.master_port or free_port(me.address))
            node.status.update(state="waiting", round=number)
            node.events.record(REGISTERED, round=number)
            try:
                current = rounds.join(number, me, timeout=settings.rendezvous_timeout, control=node.control)
            except RunOver as over:
                return node.finish("succeeded", str(over), 0)
            except Superseded as newer:  # the status record is the newer start's now: this one writes no end
                node.say(str(newer))
                return 0
            except RendezvousStopped as stop:
                if stop.request.state != LEFT:
                    raise
                node.say(f"leaving the run while waiting for round {number}: {stop.request.reason}")
                return node.conclude(Outcome(LEFT, stop.request.reason, 0))
            number = current.number
            if current.give_up:
                return node.finish("failed", current.give_up, EXIT_PEER_FAILED, mark_failed=True,
                                   details=current.failure_details())
            node.start_round(current.decision, number, current.restarts)
            if current.history:
                node.say(f"round {number} after {current.history[-1]}: {self._members_text(current)}")
            node.restore(number)
            outcome = node.train(current.decision, rounds, number)
            if not outcome.next_round:
                return node.conclude(outcome)
            if outcome.round_end is not None:
                rounds.end(number, outcome.round_end)
            node.say(f"round {number} ended: {self._end_words(outcome, number)}")
            failure = node.sync_failure()  # what it wrote reaches the work dir, for the next round's restore
            if failure:
                return node.finish("failed", failure, EXIT_STORE, mark_failed=True)
            number += 1

    def _first_round(self) -> int:
        """0 while the run has no round yet; a node that finds the rounds begun (a replacement, a node added by
        `launcher scale`, a late one) joins the round after the latest, and ends that one."""
        latest = self.rounds.latest()
        if latest is None:
            return 0
        if latest.give_up:  # the run has stopped: joining its last round says so
            return latest.number
        settings = self.node.settings
        incarnation = settings.incarnation
        self.rounds.end(latest.number, RoundEnd(settings.node, JOIN, f"replacement {incarnation} joins" if incarnation
                                                else "a new node joins the run", None, time.time()))
        return latest.number + 1

    def _members_text(self, current: Round) -> str:
        policy = self.rounds.policy
        elastic = self.node.settings.recovery and self.node.settings.recovery.get("maxNodes")  # static: every node
        bounds = f" (min {policy.min_nodes}, max {elastic})" if elastic else ""
        before = restarts_before(self.node.settings.recovery)  # the run's count, as its summary says it
        return f"continuing with {plural(len(current.members), 'node')}{bounds}, restart {before + current.restarts} " \
               f"of {before + policy.max_restarts}"

    def _end_words(self, outcome: Outcome, number: int) -> str:
        """Why the round ended here. Ranks that only lost a peer (a gloo or NCCL connection error) name what
        happened to it when another record says so within a moment, as the node that saw it first does."""
        if outcome.round_end is None or outcome.round_end.kind != PEER:
            return outcome.reason or "another node ended it"
        deadline = time.monotonic() + PEER_ROOT_SECONDS
        while True:
            try:
                roots = [end for end in self.rounds.ends(number) if end.kind not in (PEER, JOIN)]
            except StoreError:
                roots = []
            if roots or time.monotonic() >= deadline:
                break
            time.sleep(self.rounds.timing.end_check)  # the work dir offers no change notification: poll it
        if not roots:
            return outcome.reason or "a peer was lost"
        return f"{describe_end(min(roots, key=lambda end: end.at))} (its ranks here lost their connection to it)"


def round_ended(rounds: Rounds, number: int, members: list[str], say: Callable[[str], None]) -> bool:
    """Whether round ``number`` has ended, as read while training in it (an unreadable work dir: not yet)."""
    try:
        return rounds.ended(number, members)
    except StoreError as exc:  # keep training through a store outage; the next check may succeed
        say(f"could not read round {number}'s end markers: {exc}")
        return False


def round_end_text(rounds: Rounds, number: int) -> str:
    """Why round ``number`` ended, as its first three end records say (for the message that stops training)."""
    try:
        ends = sorted(rounds.ends(number), key=lambda end: end.at)
    except StoreError:
        return "a member was lost, failed, or a node joins"
    return "; ".join(describe_end(end) for end in ends[:3])
