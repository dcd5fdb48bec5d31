"""What a run's failures cost it: every end of a round or of an attempt that training came back from is an incident,
with its cause, when training stopped, when the end was noticed, when every rank trained again, and the steps
trained twice; and the run's effective training time ratio (ETTR): the seconds spent on steps that count over the
run's wall time. Read from the run's timeline events (:mod:`launcher.runs.timeline`), for ``launcher status``,
``status --json`` and ``launcher timeline``.

An incident's cost is the time from the last step before it (any rank's: in synchronous training they stop together)
to every rank's first step after it, plus the steps trained again times a step's time before it. Steps trained again
are known where the script reports its step numbers (``launcher.data.report(step)``): the last step reported before,
less the first reported after, plus one; without them the cost leaves them out (``recomputed_steps`` is None), and
says so. Each training process writes its progress once a second, so every time here is known to within a second.

ETTR is the training time (from every rank's first step to the last step) less the incidents' costs (what of each came
after that first step: one before it is part of the start; a fault may end round 0 before any rank stepped), over the wall
time from submission to the run's end (or now): an undisturbed run reads 100% less its start (imports, rendezvous,
the script's own start) and its end (the final sync). Pure: tested on records without a run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Mapping

from launcher.protocol import events as node_events
from launcher.runs import recoveries as rec
from launcher.runs import timeline as tl
from launcher.wording import plural

Segment = tuple[int, int]  # (attempt, round): a start of the training processes (a static run's round is 0)


@dataclass(frozen=True)
class Incident:
    attempt: int  # the attempt, and the round, that trained again after it
    round: int
    kind: str  # how the round before ended: lost, failure, join, leave, ...; "attempt" for a whole-run retry
    node: str | None  # the node whose end that was
    cause: str
    stopped_at: float | None  # the last step before it (any rank's)
    noticed_at: float | None  # the end of the round (or attempt) before, as recorded
    again_at: float | None  # every rank's first step after it; None: not (yet)
    recomputed_steps: int | None  # None: not known (the script reports no step numbers)
    step_s: float | None  # a step's time before it
    members: int  # the nodes of the round that trained again
    accelerators: int  # their GPUs
    trained_again: bool = True  # False: its round ended before it trained; then ``again_at`` is when that end came

    @property
    def lost_s(self) -> float | None:
        """From the last step before (else the end noticed) to training again."""
        since = self.stopped_at if self.stopped_at is not None else self.noticed_at
        return None if since is None or self.again_at is None else max(0.0, self.again_at - since)

    @property
    def recomputed_s(self) -> float | None:
        return None if self.recomputed_steps is None or self.step_s is None else self.recomputed_steps * self.step_s

    @property
    def cost_s(self) -> float | None:
        return None if self.lost_s is None else self.lost_s + (self.recomputed_s or 0.0)

    def cost_after(self, began: float) -> float:
        """Its cost once training had begun (an incident before that is part of the run's start)."""
        since = self.stopped_at if self.stopped_at is not None else self.noticed_at
        if since is None or self.again_at is None:
            return 0.0
        return max(0.0, self.again_at - max(since, began)) + (self.recomputed_s or 0.0)

    def line(self) -> str:
        """``round 1 (lost: t-worker-0): 0.4s from the last step to training again + 5 steps trained again (0.5s)
        = 0.9s``."""
        where = f"attempt {self.attempt}" if self.kind == "attempt" else f"round {self.round}"
        what = f"{self.kind}: {self.node}" if self.node else self.kind
        if self.lost_s is None:
            return f"{where} ({what}): not training again (yet)"
        since = "the last step" if self.stopped_at is not None else "the end noticed"
        until = "training again" if self.trained_again else "its round's end, before it trained"
        if self.recomputed_steps is None:
            recomputed = " + steps trained again not known"
        elif self.recomputed_steps:
            recomputed = (f" + {plural(self.recomputed_steps, 'step')} trained again "
                          f"({_duration(self.recomputed_s)}) = {_duration(self.cost_s)}")
        else:
            recomputed = ""
        return f"{where} ({what}): {_duration(self.lost_s)} from {since} to {until}{recomputed}"

    def to_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "round": self.round, "kind": self.kind, "node": self.node,
                "cause": self.cause, "stopped_at": self.stopped_at, "noticed_at": self.noticed_at,
                "training_again_at": self.again_at, "lost_s": _rounded(self.lost_s),
                "recomputed_steps": self.recomputed_steps, "step_s": _rounded(self.step_s),
                "recomputed_s": _rounded(self.recomputed_s), "cost_s": _rounded(self.cost_s),
                "members": self.members, "accelerators": self.accelerators,
                "accelerator_hours": _rounded(_hours(self.cost_s, self.accelerators)),
                "node_hours": _rounded(_hours(self.cost_s, self.members))}


@dataclass(frozen=True)
class Costs:
    incidents: list[Incident]
    wall_s: float  # submission to the run's end, or to now
    start_s: float | None  # submission to every rank's first step
    training_s: float | None  # every rank's first step to the last step (or now)
    began_at: float | None = None  # every rank's first step: when training began

    @property
    def cost_s(self) -> float:
        return sum(incident.cost_s or 0.0 for incident in self.incidents)

    @property
    def ettr(self) -> float | None:
        if self.training_s is None or self.began_at is None or self.wall_s <= 0:
            return None
        lost = sum(incident.cost_after(self.began_at) for incident in self.incidents)
        return min(1.0, max(0.0, (self.training_s - lost) / self.wall_s))

    @property
    def accelerator_hours(self) -> float:
        return sum(_hours(incident.cost_s, incident.accelerators) or 0.0 for incident in self.incidents)

    @property
    def node_hours(self) -> float:
        return sum(_hours(incident.cost_s, incident.members) or 0.0 for incident in self.incidents)

    def line(self) -> str:
        """``3 incidents cost 1m12s, 0.4 GPU-hours; ETTR 96.8%`` (node-hours where the run has no GPU)."""
        ettr = "ETTR not known yet (no step counted)" if self.ettr is None else f"ETTR {self.ettr:.1%}"
        if not self.incidents:
            return f"no incident; {ettr} (its start took {_duration(self.start_s)})"
        hours = (f"{self.accelerator_hours:.2g} GPU-hours" if any(i.accelerators for i in self.incidents)
                 else f"{self.node_hours:.2g} node-hours")
        unknown = sum(1 for incident in self.incidents if incident.recomputed_steps is None)
        note = (f" ({'1' if unknown == 1 else unknown} of them without the steps trained again: the script reports no "
                "step numbers, launcher.data.report(step) gives them)" if unknown else "")
        count = len(self.incidents)
        return (f"{count} incident{'s' if count != 1 else ''} cost {_duration(self.cost_s)}, {hours}; {ettr}{note}")

    def to_dict(self) -> dict[str, Any]:
        return {"ettr": _rounded(self.ettr, 4), "wall_s": _rounded(self.wall_s), "start_s": _rounded(self.start_s),
                "training_s": _rounded(self.training_s), "cost_s": _rounded(self.cost_s),
                "accelerator_hours": _rounded(self.accelerator_hours), "node_hours": _rounded(self.node_hours),
                "incidents": [incident.to_dict() for incident in self.incidents]}


def costs(timeline: tl.Timeline, accelerators: Mapping[str, int], ended_at: float | None) -> Costs:
    """The incidents and ETTR of ``timeline``; ``accelerators``: each node's GPUs; ``ended_at``: the run's end, None
    while it runs."""
    by_segment = _segments(timeline.events)
    order = sorted(by_segment)
    recovered = rec.recoveries(timeline)
    trained = sorted({(each.attempt, each.round) for each in recovered if each.phase(rec.FIRST_STEP).at is not None}
                     | {segment for segment in order if segment[1] == 0})
    incidents = [_from_recovery(recovery, by_segment, trained, accelerators) for recovery in recovered]
    incidents += [_from_attempt(timeline, before, after, by_segment, accelerators)
                  for before, after in zip(order, order[1:]) if after[0] != before[0]]
    incidents = _chained(sorted(incidents, key=lambda incident: (incident.attempt, incident.round)))
    end = ended_at if ended_at is not None else timeline.read_at
    # training began at the first segment whose ranks stepped (a fault may end round 0 before any did)
    first = next((at for segment in order if (at := _every_rank_stepped(by_segment[segment])) is not None), None)
    last_steps = [event.at for event in timeline.events if event.phase == node_events.LAST_STEP]
    last = max(last_steps) if ended_at is not None and last_steps else end
    training = None if first is None else max(0.0, last - first)
    return Costs(incidents, max(0.0, end - timeline.submitted),
                 None if first is None else first - timeline.submitted, training, first)


def _segments(events: list[tl.Event]) -> dict[Segment, list[tl.Event]]:
    found: dict[Segment, list[tl.Event]] = {}
    for event in events:
        if event.node is not None and event.phase in (node_events.FIRST_STEP, node_events.LAST_STEP,
                                                       node_events.DECIDED):
            found.setdefault((event.attempt, event.round or 0), []).append(event)
    return {segment: found[segment] for segment in found
            if any(event.phase == node_events.FIRST_STEP for event in found[segment])
            or any(event.phase == node_events.DECIDED for event in found[segment])}


def _every_rank_stepped(events: list[tl.Event]) -> float | None:
    """When the last rank of a segment counted its first step."""
    firsts: dict[tuple, float] = {}
    for event in events:
        if event.phase == node_events.FIRST_STEP:
            key = (event.node, event.rank)
            firsts[key] = min(firsts.get(key, event.at), event.at)
    return max(firsts.values()) if firsts else None


def _chained(incidents: list[Incident]) -> list[Incident]:
    """A round that ended before it trained (another fault came first) makes its incident last until that end: the
    run trained in neither, and the next incident goes on from there. Their costs add up to the time from the last
    step before the first of them to training again after the last, with no second counted twice."""
    chained = []
    for index, incident in enumerate(incidents):
        following = incidents[index + 1] if index + 1 < len(incidents) else None
        if (incident.again_at is None and following is not None and following.attempt == incident.attempt
                and following.noticed_at is not None):
            incident = replace(incident, again_at=following.noticed_at, trained_again=False)
        chained.append(incident)
    return chained


def _from_recovery(recovery: rec.Recovery, by_segment: dict[Segment, list[tl.Event]], trained: list[Segment],
                   accelerators: Mapping[str, int]) -> Incident:
    """``trained``: the segments whose every rank stepped. The steps trained again are counted against the incident
    whose round before trained, up to the round that trains at the end of its chain."""
    before_segment = (recovery.attempt, recovery.round - 1)
    before = by_segment.get(before_segment, []) if before_segment in trained else []
    resumed = next((segment for segment in trained if segment[0] == recovery.attempt and segment[1] >= recovery.round),
                   None)
    after = by_segment.get(resumed, []) if resumed else []
    members = by_segment.get((recovery.attempt, recovery.round), [])
    again = recovery.phase(rec.FIRST_STEP).at
    found = _incident(recovery.attempt, recovery.round, recovery.kind, recovery.node, recovery.cause, recovery.ended,
                      again, before, after, accelerators, members)
    # a round that never trained had no steps to train again: those of the round before it count at the chain's head
    return found if before_segment in trained else replace(found, recomputed_steps=0)


def _from_attempt(timeline: tl.Timeline, before: Segment, after: Segment, by_segment: dict[Segment, list[tl.Event]],
                  accelerators: Mapping[str, int]) -> Incident:
    ended = next((event for event in timeline.events if event.phase == tl.ATTEMPT_ENDED
                  and event.attempt == before[0]), None)
    events = by_segment[after]
    return _incident(after[0], after[1], "attempt", None, ended.detail if ended else "", ended.at if ended else None,
                     _every_rank_stepped(events), by_segment[before], events, accelerators)


def _incident(attempt: int, number: int, kind: str, node: str | None, cause: str, noticed: float | None,
              again: float | None, before: list[tl.Event], after: list[tl.Event],
              accelerators: Mapping[str, int], members_of: list[tl.Event] | None = None) -> Incident:
    lasts = [event for event in before if event.phase == node_events.LAST_STEP]
    reported_before = [event.step for event in lasts if event.step is not None]
    reported_after = [event.step for event in after if event.phase == node_events.FIRST_STEP and event.step is not None]
    recomputed = (max(0, max(reported_before) - min(reported_after) + 1)
                  if reported_before and reported_after else None)
    members = sorted({event.node for event in (after if members_of is None else members_of)
                      if event.phase == node_events.DECIDED and event.node})
    return Incident(attempt, number, kind, node, cause, max((event.at for event in lasts), default=None), noticed,
                    again, recomputed, _step_seconds(before), len(members),
                    sum(accelerators.get(member, 0) for member in members))


def _step_seconds(events: list[tl.Event]) -> float | None:
    """The median over the ranks of a segment of a step's time: first to last step over the steps between."""
    firsts = {(event.node, event.rank): event for event in events if event.phase == node_events.FIRST_STEP}
    times = []
    for event in events:
        first = firsts.get((event.node, event.rank))
        if event.phase != node_events.LAST_STEP or first is None or event.steps is None:
            continue
        steps = event.step - first.step if event.step is not None and first.step is not None else event.steps - 1
        if steps > 0 and event.at > first.at:
            times.append((event.at - first.at) / steps)
    return statistics.median(times) if times else None


def _hours(seconds: float | None, count: int) -> float | None:
    return None if seconds is None else seconds * count / 3600


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not known"
    whole = int(round(seconds))
    return f"{seconds:.1f}s" if seconds < 60 else f"{whole // 60}m{whole % 60:02d}s" if whole < 3600 else \
        f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def read(info: Any, view: Any, timeline: tl.Timeline | None = None) -> Costs:
    """The costs of the run ``info`` (a :class:`launcher.runs.state.RunInfo`) whose view is ``view``
    (:class:`launcher.runs.view.RunView`), from its ``timeline`` (read when not given)."""
    accelerators = {node: int((record.get("accelerators") or {}).get("count") or 0)
                    for node, record in view.statuses.items()}
    timeline = timeline or tl.read_timeline(info, health=False)
    ended = max((event.at for event in timeline.events), default=None) if view.ended else None
    return costs(timeline, accelerators, ended)
