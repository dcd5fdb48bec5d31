"""Where each recovery's seconds went: every round after the first, broken down into phases timed from the end of
the round before (a death, as its supervisor saw it, or whatever else ended it), from the run's timeline events
(:mod:`launcher.runs.timeline`). Shown by ``launcher timeline`` and ``status --json`` (``recoveries``).

Phases, in the order they happen; each is when the last member (or, for the training processes, the last rank)
got there, since the round can go on no sooner, and names that member, the one the round waited for:

- ``ended``: the round before ended (its first end record: ``death seen`` for a lost node);
- ``registered``: every member of the new round registered in it (the survivors stopped their torchrun and synced,
  a replacement started);
- ``decided``: the first node learned the round's decision;
- ``torchrun``: every member started torchrun, or handed the round to its spare;
- ``rank-started``: every training process is about to run the script (its interpreter started, or a warm one was
  handed its rank), as its progress record says;
- ``first-step``: every training process counted its first step (the script's report, an optimizer's step, else a
  DataLoader's batch): training again.

A phase is None where it is not known (yet): a member without it, a script whose steps nothing counts. Pure: what
each record means is tested without a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from launcher.protocol import events as node_events
from launcher.runs import timeline as tl

ENDED = "ended"
REGISTERED = node_events.REGISTERED
DECIDED = tl.ROUND_DECIDED
TORCHRUN = node_events.TORCHRUN
RANK_STARTED = node_events.RANK_STARTED
FIRST_STEP = node_events.FIRST_STEP
PHASES = (ENDED, REGISTERED, DECIDED, TORCHRUN, RANK_STARTED, FIRST_STEP)
LABELS = {ENDED: "round ended", REGISTERED: "members registered", DECIDED: "round decided",
          TORCHRUN: "torchrun started", RANK_STARTED: "training processes started", FIRST_STEP: "first step"}


@dataclass(frozen=True)
class Phase:
    name: str
    at: float | None  # Unix time; None: not known (yet)
    node: str | None = None  # the member that got there last: the one the round waited for

    @property
    def label(self) -> str:
        return LABELS[self.name]


@dataclass(frozen=True)
class Recovery:
    round: int  # the round that trained again
    attempt: int
    kind: str  # how the round before ended (its first end record): lost, killed, failure, join, leave, ...
    node: str | None  # the node whose end that was
    cause: str  # in words
    phases: tuple[Phase, ...]  # PHASES, in order
    first_line: float | None = None  # the round's first training line (what marked "training again" before steps)
    cold: tuple[str, ...] = ()  # members whose torchrun started without a spare (imports and all)

    def phase(self, name: str) -> Phase:
        return next(phase for phase in self.phases if phase.name == name)

    @property
    def ended(self) -> float | None:
        return self.phase(ENDED).at

    @property
    def ended_label(self) -> str:
        return "death seen" if self.kind == "lost" else LABELS[ENDED]

    def after(self, at: float | None) -> float | None:
        """Seconds from the end of the round before to ``at``."""
        return None if at is None or self.ended is None else at - self.ended

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "attempt": self.attempt, "kind": self.kind, "node": self.node,
                "cause": self.cause, "ended_at": self.ended,
                "phases": [{"phase": phase.name, "label": self.ended_label if phase.name == ENDED else phase.label,
                            "at": phase.at, "after_s": _rounded(self.after(phase.at)), "node": phase.node}
                           for phase in self.phases],
                "first_line_at": self.first_line, "first_line_after_s": _rounded(self.after(self.first_line)),
                "cold_torchrun": list(self.cold)}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def recoveries(timeline: tl.Timeline) -> list[Recovery]:
    """One record per round after the first that was decided (not the run's stop), by attempt and round."""
    by_round: dict[tuple[int, int], list[tl.Event]] = {}
    for event in timeline.events:
        if event.round is not None:
            by_round.setdefault((event.attempt, event.round), []).append(event)
    found = []
    for (attempt, number), events in sorted(by_round.items()):
        decided = [event.at for event in events if event.phase == tl.ROUND_DECIDED and event.node is None]
        if number > 0 and decided:
            found.append(_recovery(attempt, number, min(decided), events, by_round.get((attempt, number - 1), [])))
    return found


def _recovery(attempt: int, number: int, decided: float, events: list[tl.Event],
              before: list[tl.Event]) -> Recovery:
    ended = next((event for event in before if event.phase == tl.ROUND_ENDED and event.node is None), None)
    causes = sorted((event for event in before if event.node is not None
                     and event.phase in (tl.DEATH, tl.ROUND_ENDED, tl.JOINS, tl.LEAVES)), key=lambda event: event.at)
    first = causes[0] if causes else None
    members = sorted({event.node for event in events if event.phase == node_events.DECIDED and event.node})
    def last(name: str) -> Phase:
        return _last(name, members, [event for event in events if event.phase == name])

    phases = [Phase(ENDED, ended.at if ended else None, first.node if first else None), last(REGISTERED),
              Phase(DECIDED, decided), last(TORCHRUN), last(RANK_STARTED), last(FIRST_STEP)]
    lines = [event.at for event in events if event.phase == node_events.FIRST_LINE]
    cold = tuple(sorted({event.node for event in events if event.phase == node_events.TORCHRUN and event.node
                         and not event.detail.startswith("a spare")}))
    kind = first.detail.split(":", 1)[0] if first else ""
    cause = ended.detail if ended else ""
    return Recovery(number, attempt, kind, first.node if first else None, cause, tuple(phases),
                    min(lines) if lines else None, cold)


def _last(name: str, members: Iterable[str], events: list[tl.Event]) -> Phase:
    """Phase ``name`` (its ``events``) once every member has it: the latest, and whose it was; else not known."""
    members = list(members)
    if not members or any(not any(event.node == member for event in events) for member in members):
        return Phase(name, None)
    latest = max((event for event in events if event.node in members), key=lambda event: event.at)
    return Phase(name, latest.at, latest.node)


def read(info: Any) -> list[Recovery]:
    """The recoveries of the run ``info`` (a :class:`launcher.runs.state.RunInfo`), from its work dir's records."""
    return recoveries(tl.read_timeline(info, health=False))
