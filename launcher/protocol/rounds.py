"""Membership rounds: how the nodes of a recovering run agree, again and again, on who trains together.

Layout under ``{work dir}/{run id}/``::

  rounds/{r}.json                 the decision of round r (r = 00000, 00001, ...): members and ranks,
                                  main, MASTER_ADDR/PORT, restarts so far, and why the run stops, if so
  rounds/{r}/nodes/{registration} a node asking to train in round r (the key format of launcher.protocol.rendezvous)
  rounds/{r}/end/{node}.{kind}.json why round r ended, as a member saw it, or a supervisor for a dead member,
                                  or a node asking to join, or one leaving on request (``launcher scale``)

A round's decision is created once (create-if-absent) from one listing of that round's
registrations, so every node reads the same members: a node never trains in a round it is not a
member of, and a registration that missed the decision joins the next round (and ends this one).
A decision is made when the registered nodes include every member of the previous round that
was not lost and at least ``minNodes``, or, with at least ``minNodes``, once no new node has
registered for the settle time (and no lost member's replacement is still coming, for at most
``recovery.replacementWait``). A node that leaves on request ends the round it is in (or waits in)
with a leave: it is neither waited for nor taken in, and a leave by a node that is no member of the
round changes nothing. See docs/protocol.md ("Recovery: membership rounds", "Scaling").
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Callable, Collection, Sequence

from launcher.protocol.rendezvous import (Decision, Listed, PollPolicy, Registration, RendezvousError,
                                      RendezvousStopped, RendezvousTimeout, decide_static, parse_node_key)
from launcher import node_names
from launcher.wording import plural
from launcher.protocol.control import LEFT, ControlWatch
from launcher.protocol.status import status_key
from launcher.protocol.store import WorkDir
from launcher.protocol.recovery import CAUSES, FAILURE, JOIN, LEAVE, LOST, PEER, Policy, RoundEnd, said

ROUNDS_PREFIX = "rounds"


class RunOver(Exception):
    """Every member of the previous round succeeded while this node waited to join: nothing is left to do."""


class Superseded(Exception):
    """A newer start of this node (its replacement, started while this one still ran) is a member of the round:
    this start steps aside, or the two would end each other's rounds by joining, without end."""


def round_name(number: int) -> str:
    return f"{number:05d}"


def decision_key(number: int) -> str:
    return f"{ROUNDS_PREFIX}/{round_name(number)}.json"


def end_key(number: int, end: RoundEnd) -> str:
    """One record per node and kind: a lost node's end and its replacement's join are both kept."""
    return f"{ROUNDS_PREFIX}/{round_name(number)}/end/{end.node}.{end.kind}.json"


@dataclass(frozen=True)
class Round:
    number: int
    decision: Decision | None  # None when the run stops instead (give_up)
    restarts: int = 0
    give_up: str | None = None
    history: tuple[str, ...] = ()  # why each earlier round ended, in order
    cause: RoundEnd | None = None  # with give_up: the end that made the run stop (not the node that says so)
    # with give_up: too few nodes are left, though the policy had a restart left (a whole-run retry may still come)
    short_of_nodes: bool = False
    at: float = 0.0  # when it was decided (Unix time, by the clock of the node that decided it; 0: not recorded)

    @property
    def members(self) -> list[str]:
        return list(self.decision.ranks) if self.decision else []

    def failure_details(self) -> dict:
        """What a node stopping on this round's give_up records with its failure: why every round ended, and the
        end that stopped the run, which the run's summary names as its cause."""
        return {"rounds": list(self.history), "stopped_by": asdict(self.cause) if self.cause else None}

    def to_bytes(self) -> bytes:
        body = {"number": self.number, "decision": asdict(self.decision) if self.decision else None,
                "restarts": self.restarts, "give_up": self.give_up, "history": list(self.history),
                "cause": asdict(self.cause) if self.cause else None, "short_of_nodes": self.short_of_nodes, "at": self.at}
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Round":
        body = json.loads(data)
        decision = Decision(**body["decision"]) if body.get("decision") else None
        cause = RoundEnd.from_record(body["cause"]) if body.get("cause") else None
        return cls(body["number"], decision, body.get("restarts", 0), body.get("give_up"),
                   tuple(body.get("history") or ()), cause, bool(body.get("short_of_nodes")), float(body.get("at") or 0.0))


def latest_round(store: WorkDir) -> Round | None:
    """The run's newest decided round, or None before the first decision."""
    numbers = sorted(int(name[:-5]) for name in store.list(ROUNDS_PREFIX) if name.endswith(".json")
                     and name[:-5].isdigit())
    data = store.get(decision_key(numbers[-1])) if numbers else None
    return Round.from_bytes(data) if data else None


@dataclass
class Timing:
    settle: float  # seconds without a new registration before deciding with whoever is there (>= minNodes)
    first_settle: float  # the same for round 0, where nodes may still be starting
    end_check: float  # seconds between checks of the current round's end markers while training

    @classmethod
    def for_store(cls, store: WorkDir) -> "Timing":
        return cls(1.0, 10.0, 0.5) if store.is_local else cls(5.0, 30.0, 2.0)


@dataclass
class Rounds:
    """One node's view of the run's rounds."""

    store: WorkDir
    order: Sequence[str]  # the spec's node names, in the spec's order (rank order)
    policy: Policy
    timing: Timing = field(default_factory=lambda: Timing(1.0, 10.0, 0.5))
    clock: Callable[[], float] = time.monotonic
    grows: str | None = None  # the group `launcher scale` adds nodes to: its names after ``order`` are nodes too

    def latest(self) -> Round | None:
        return latest_round(self.store)

    def read(self, number: int) -> Round | None:
        data = self.store.get(decision_key(number))
        return Round.from_bytes(data) if data else None

    def end(self, number: int, end: RoundEnd) -> None:
        """Record why round ``number`` ends, as ``end.node`` sees it (the members stop and meet in the next)."""
        self.end_for(self.store, number, end)

    @staticmethod
    def end_for(store: WorkDir, number: int, end: RoundEnd) -> None:
        store.put(end_key(number, end), json.dumps(asdict(end)).encode())

    def ends(self, number: int, *kinds: str) -> list[RoundEnd]:
        """Round ``number``'s end records, of ``kinds`` only when given: the kind is in the key, so the others
        are not read (a round a crash ended may hold a peer end from every member)."""
        prefix = f"{ROUNDS_PREFIX}/{round_name(number)}/end"
        suffixes = tuple(f".{kind}.json" for kind in kinds) or (".json",)
        return [RoundEnd.from_record(self.store.get_record(f"{prefix}/{name}")) for name in self.store.list(prefix)
                if name.endswith(suffixes)]

    def ended(self, number: int, members: Collection[str] = ()) -> bool:
        """Whether round ``number`` has ended: any end record but a leave by a node that is not a member."""
        return any(not (name.endswith(f".{LEAVE}.json") and name[:-len(f".{LEAVE}.json")] not in members)
                   for name in self.store.list(f"{ROUNDS_PREFIX}/{round_name(number)}/end"))

    def join(self, number: int, me: Registration, *, timeout: float, control: ControlWatch | None = None,
             poll: PollPolicy | None = None) -> Round:
        """Register in round ``number`` (or, when it was decided without this node, the next) and return the
        round this node is a member of, or one that says the run stops."""
        poll = poll or PollPolicy.for_store(self.store)
        deadline = self.clock() + timeout
        while True:
            me = me.again()  # a fresh nonce per round
            self.store.create(f"{ROUNDS_PREFIX}/{round_name(number)}/nodes/{me.entry}",
                              json.dumps(asdict(me)).encode())
            try:
                decided = self._await(number, me, deadline, control, poll)
            except RendezvousStopped as stop:
                if stop.request.state == LEFT:  # ends the round should it be decided with this node after all
                    self.end(number, RoundEnd(me.name, LEAVE, stop.request.reason, None, time.time()))
                raise
            if decided.give_up or decided.decision.nonces.get(me.name) == me.nonce:
                return decided
            newer = self._newer_start(number, me, decided.decision.nonces.get(me.name))
            if newer is not None:
                raise Superseded(f"incarnation {newer} of node {me.name} is a member of round {number} in place of "
                                 f"this one (incarnation {me.incarnation}): this one ends")
            # decided without this node: ask to join the next round, and end this one so its members come too
            self.end(number, RoundEnd(me.name, JOIN, f"node {me.name} joins", None, time.time()))
            number += 1

    def _await(self, number: int, me: Registration, deadline: float, control: ControlWatch | None,
               poll: PollPolicy) -> Round:
        """Wait for round ``number``'s decision, or make it. The registrations are listed right after registering
        (the last node to register decides at once), then every ``poll.list_interval(N, settle / 2)`` seconds:
        a listing reads all N registrations, so listing at every poll made the run's work grow with N squared,
        while this makes it linear. A decision by settling comes up to one such interval after the settle time."""
        previous = self.read(number - 1) if number > 0 else None
        expected = self._expected(number, previous)
        settle = self.timing.first_settle if number == 0 else self.timing.settle
        seen: frozenset[str] = frozenset()
        changed = began = next_list = self.clock()
        for delay in poll.delays():
            data = self.store.get(decision_key(number))
            if data is not None:
                return Round.from_bytes(data)
            now = self.clock()
            if control is not None and (stop := control.check()) is not None:
                raise RendezvousStopped(stop)
            if now >= next_list or now >= deadline:
                registered = self._registered(number)
                next_list = now + poll.list_interval(max(len(expected), len(registered)), settle / 2)
                if previous is not None and previous.decision and self._all_succeeded(previous.members, registered):
                    raise RunOver(f"round {previous.number} finished training before this node could join")
                if frozenset(registered) != seen:
                    seen, changed = frozenset(registered), now
                if previous is not None and (coming := self._coming(number, previous, registered)) is not None:
                    return self._publish(number, registered, previous, coming)  # the run stops, at once
                if self._ready(number, registered, expected, now - changed >= settle, now - began):
                    for name in self._leaving(number):  # asked once it is ready: the end records take a LIST
                        registered.pop(name, None)
                    if self._ready(number, registered, expected, now - changed >= settle, now - began):
                        return self._publish(number, registered, previous)
                if now >= deadline:
                    missing = [name for name in node_names.rank_order(self.order, self.grows, expected)
                               if name not in registered]
                    raise RendezvousTimeout(missing, len(registered), max(self.policy.min_nodes, len(expected)),
                                            deadline - changed)
            time.sleep(delay)

    def _ready(self, number: int, registered: dict[str, Listed], expected: set[str], settled: bool,
               waited: float) -> bool:
        if len(registered) < self.policy.min_nodes:
            return False
        return expected <= set(registered) or (settled and not self._awaits_replacement(number, registered, waited))

    def _awaits_replacement(self, number: int, registered: dict[str, Listed], waited: float) -> bool:
        """A member of the previous round was lost and its replacement is starting but not registered yet, and the
        round has waited less than ``recovery.replacementWait``: a round decided without it would end at its join,
        one more torchrun start for everyone. Read anew each time: the lost record may come after the survivors."""
        if number == 0 or waited >= self.policy.replacement_wait:
            return False
        return any(end.replaced and end.node not in registered for end in self.ends(number - 1, LOST))

    def _coming(self, number: int, previous: Round, registered: Collection[str]) -> set[str] | None:
        """The nodes that may still come to round ``number`` (those registered and the previous members neither
        lost for good nor gone) where the round can only stop the run, whoever else registers (None: it may go on):
        the previous round's ends already use up the restarts (or one is not retried), or fewer than ``minNodes``
        can come. Waiting for the rendezvous timeout changed neither; it kept the survivors waiting, unsaid why."""
        coming = set(registered) | self._expected(number, previous)
        return coming if self._verdict(number, previous, self.ends(number - 1, *CAUSES), coming)[1] else None

    def _verdict(self, number: int, previous: Round, ends: list[RoundEnd], coming: Collection[str]
                 ) -> tuple[int, str | None, RoundEnd | None, bool]:
        """(restarts after round ``number - 1``, why the run stops instead or None, the end that stops it, and
        whether it stops short of nodes while the policy had a restart left)."""
        restarts, give_up, cause = self.policy.next_round(ends, previous.restarts)
        if give_up is None and len(coming) < self.policy.min_nodes:
            return (restarts, *_too_few(number, coming, self.policy.min_nodes, ends), True)
        return restarts, give_up, cause, False

    def _leaving(self, number: int) -> set[str]:
        """Nodes that left on request while waiting in round ``number``: none of them is taken in."""
        suffix = f".{LEAVE}.json"
        return {name[:-len(suffix)] for name in self.store.list(f"{ROUNDS_PREFIX}/{round_name(number)}/end")
                if name.endswith(suffix)}

    def _all_succeeded(self, members: list[str], registered: Collection[str]) -> bool:
        """Every member ended well (those that left on request included) and one at least trained to the end. A
        member registered for the next round did not (its round ended otherwise): then no status is read, a GET per
        member that every waiting node would make at each listing."""
        if any(name in registered for name in members):
            return False
        states = [self.store.get_record(status_key(name)).get("state") for name in members]
        return "succeeded" in states and all(state in ("succeeded", LEFT) for state in states)

    def _expected(self, number: int, previous: Round | None) -> set[str]:
        """Who round ``number`` is decided with as soon as they are all there: everyone at first, then the previous
        members that neither left nor were lost, or were lost and are being replaced (see _awaits_replacement)."""
        if previous is None:
            return set(self.order)
        gone = {end.node for end in self.ends(number - 1, LEAVE, LOST) if end.kind == LEAVE or not end.replaced}
        return set(previous.members) - gone

    def _registered(self, number: int) -> dict[str, Listed]:
        registered: dict[str, Listed] = {}
        for entry in self.store.list(f"{ROUNDS_PREFIX}/{round_name(number)}/nodes"):
            listed = parse_node_key(entry)
            if listed is None or not self._is_node(listed.name):
                continue
            held = registered.get(listed.name)
            # a name twice (a node and its replacement): the newer start, whatever the listing's order
            if held is None or self._incarnation(number, listed) >= self._incarnation(number, held):
                registered[listed.name] = listed
        return registered

    @cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(self.order)

    def _is_node(self, name: str) -> bool:
        """Whether ``name`` is one of the run's nodes, as node_names.rank_order decides it, for one name: that
        called per listed entry scanned the whole order, N x N steps for a listing of N registrations."""
        return name in self._names or (self.grows is not None and node_names.number_in(self.grows, name) is not None)

    def _incarnation(self, number: int, listed: Listed) -> int:
        """Which start of its node a registration of round ``number`` is (its body says; 0 where it does not)."""
        try:
            body = json.loads(self.store.get(f"{ROUNDS_PREFIX}/{round_name(number)}/nodes/{listed.entry}") or b"{}")
            return int(body.get("incarnation") or 0)
        except (ValueError, TypeError, AttributeError):
            return 0

    def _newer_start(self, number: int, me: Registration, holder: str | None) -> int | None:
        """The incarnation of the start of ``me``'s node that holds its place in round ``number`` (the decision's
        ``holder`` nonce), where that is a newer one than ``me``."""
        if holder is None:
            return None
        for entry in self.store.list(f"{ROUNDS_PREFIX}/{round_name(number)}/nodes"):
            listed = parse_node_key(entry)
            if listed is not None and listed.name == me.name and listed.nonce == holder:
                incarnation = self._incarnation(number, listed)
                return incarnation if incarnation > me.incarnation else None
        return None

    def _publish(self, number: int, registered: dict[str, Listed], previous: Round | None,
                 coming: Collection[str] = ()) -> Round:
        """Create round ``number``'s decision from ``registered`` (or the run's stop, where ``coming``, the nodes
        that may still come, are too few), unless another node did first; the round decided."""
        restarts, history, give_up, cause, short = 0, (), None, None, False
        if previous is not None:
            ends = self.ends(number - 1)
            restarts, give_up, cause, short = self._verdict(number, previous, ends, coming or registered)
            history = previous.history + (_summary(number - 1, ends),)
        try:
            decision = None if give_up else decide_static(registered, node_names.rank_order(self.order, self.grows,
                                                                                             registered))
        except RendezvousError as exc:
            decision, give_up = None, str(exc)
        decided = Round(number, decision, restarts, give_up, history, cause, short, time.time())
        if self.store.create(decision_key(number), decided.to_bytes()):
            return decided
        return Round.from_bytes(self.store.get(decision_key(number)) or decided.to_bytes())


def _too_few(number: int, coming: Collection[str], min_nodes: int, ends: list[RoundEnd]
             ) -> tuple[str, RoundEnd | None]:
    """Why round ``number`` cannot start with the nodes ``coming``, and the earliest end that took a node for good."""
    gone = sorted((end for end in ends if end.kind == LOST and not end.replaced), key=lambda end: end.at)
    cause = gone[0] if gone else None
    names = ", ".join(sorted(coming)) or "none"
    words = (f"round {number} cannot start: {plural(len(coming), 'node')} left ({names}), fewer than "
             f"recovery.minNodes ({min_nodes}), and no replacement is coming")
    return (f"{words}: {said(cause)}" if cause else words), cause


def _summary(number: int, ends: list[RoundEnd]) -> str:
    """``round 0: node w-1: ...``: why round ``number`` ended, each cause once: the first, then up to two other
    ones; nodes that ended the same way (one error every rank raised) are named, not repeated."""
    causes = sorted((end for end in ends if end.kind in CAUSES), key=lambda end: end.at)
    shown = causes or sorted(ends, key=lambda end: end.at)
    if not shown:
        return f"round {number}: no reason recorded"
    first, same, others = shown[0], [], []
    for end in shown[1:]:
        (same if _what(end) == _what(first) else others).append(end)
    return (f"round {number}: {said(first)}" + "".join(f"\n    on node {end.node} too" for end in same)
            + "".join(f"\n    and {said(end)}" for end in others[:2]))


def describe_end(end: RoundEnd) -> str:
    """``node w-1 lost: node process killed by SIGKILL``: one end of a round, as a node that sees it says."""
    words = {LOST: " lost", FAILURE: " failed", PEER: " lost a peer", JOIN: " joins", LEAVE: " leaves"}
    return f"node {end.node}{words.get(end.kind, '')}: {end.reason}"  # KILLED: the reason says what was killed


def _what(end: RoundEnd) -> tuple[str, str]:
    """An end without the rank that saw it: every rank raising one error is one cause."""
    return end.kind, re.sub(r"^rank \d+(:|'s)? ", "", end.reason)


def grouped_history(history: Sequence[str], cause: str | None = None) -> list[str]:
    """``history`` with rounds in a row that ended the same way shown once (``rounds 0, 1 and 2: ...``); those
    that ended with ``cause`` (the run's, shown apart) say so instead of repeating it."""
    groups: list[tuple[list[str], str]] = []
    for entry in history:
        label, _, text = entry.partition(": ")
        if groups and groups[-1][1] == text:
            groups[-1][0].append(label.removeprefix("round "))
        else:
            groups.append(([label.removeprefix("round ")], text))
    lines = []
    for numbers, text in groups:
        label = f"round {numbers[0]}" if len(numbers) == 1 else f"rounds {', '.join(numbers[:-1])} and {numbers[-1]}"
        if cause and text.startswith(cause):
            text = "the same cause" + text[len(cause):]
        lines.append(f"{label}: {text}")
    return lines
