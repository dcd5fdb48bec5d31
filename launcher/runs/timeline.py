"""A run's timeline: every phase of every node with its time, from the work dir's records.

The nodes record the phases no other record times (:mod:`launcher.protocol.events`); the others come from
the records that already hold their time: ``run.json`` (submitted), the status records (the final state,
and for a node that died without reporting, its death as its supervisor saw it), the round end records
(deaths seen, rounds ended, nodes joining or leaving), the control markers (cancel, leave requests) and
the scale requests. :func:`derive` is pure, so that what each record means is tested without a run;
:func:`read_timeline` gathers the records, of every attempt of a run retried whole, each event marked with its
attempt, and the attempt records (``attempts/{n}.json``) for when and why each attempt before the last ended,
and each node's health record of every attempt (:mod:`launcher.runs.timeline_health`), drawn under its lane.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from launcher.data.rankprogress import SOURCES
from launcher.protocol import events as node_events
from launcher.protocol.control import CANCEL, CONTROL_PREFIX, LIMIT
from launcher.protocol.rounds import ROUNDS_PREFIX, Round, decision_key
from launcher.protocol.status import FINAL_STATES, STATUS_PREFIX
from launcher.protocol.store import WorkDir
from launcher.protocol.recovery import JOIN, LEAVE, LOST
from launcher.runs.timeline_health import Utilisation, read_utilisation

if TYPE_CHECKING:
    from launcher.runs.attempts import Attempt
    from launcher.runs.state import RunInfo

# Phases derived from records (the nodes' own are launcher.protocol.events').
SUBMITTED = "submitted"  # the client wrote run.json, just before it started the nodes
ATTEMPT = "attempt"  # a run retried whole: attempt n was started (its start claim)
ATTEMPT_ENDED = "attempt-ended"  # a run retried whole: attempt n ended (its cause's time), and what came of it
ROUND_DECIDED = "round-decided"  # the first node learned the decision of a round
ROUND_ENDED = "round-ended"  # a round ended (run-level: the first end record; node-level: that node's)
DEATH = "death"  # a node died without reporting, as its supervisor (or a reader) saw it
JOINS = "joins"  # a node (a replacement, one `launcher scale` added) asked to join the next round
LEAVE_ASKED = "asked-to-leave"  # `launcher scale` asked a node to leave (control/leave.{node}.json)
LEAVES = "leaves"  # a node asked to leave ended its round to go
TRAINING_AGAIN = "training-again"  # a round after the first trains: every rank's first step (else its first line)
SCALE = "scale"  # `launcher scale` asked for a size
CANCELLED = "cancel"  # `launcher cancel` (or an interrupt) asked every node to stop
LIMIT_REACHED = "limit"  # the run reached its maxRuntime
RECORDED = "recorded"  # the node's final status was written
RUN_STOPPED = "run-stopped"  # a round was decided as the run's stop (restarts used up, too few nodes left)
RUN_ENDS = (ROUND_ENDED, ATTEMPT_ENDED, RUN_STOPPED)  # run-level, with why: the table and the picture say it

LABELS = {
    SUBMITTED: "submitted", ROUND_DECIDED: "decided", ROUND_ENDED: "round ended",
    DEATH: "death seen", JOINS: "asks to join", LEAVE_ASKED: "asked to leave", LEAVES: "leaves",
    TRAINING_AGAIN: "training again",
    SCALE: "scale requested", CANCELLED: "cancel requested", LIMIT_REACHED: "maxRuntime reached",
    RECORDED: "final status recorded", RUN_STOPPED: "run stopped",
    node_events.STARTED: "process started", node_events.REGISTERED: "registered",
    node_events.DECIDED: "rank learned", node_events.RESTORED: "outputs restored",
    node_events.TORCHRUN: "torchrun started", node_events.RANK_STARTED: "training process started",
    node_events.FIRST_LINE: "first training line", node_events.FIRST_STEP: "first step",
    node_events.LAST_STEP: "last step",
    node_events.LAST_LINE: "last training line", node_events.RANK_EXITED: "training processes exited",
    node_events.EXITED: "torchrun exited",
    node_events.SYNCED: "outputs synced",
}


@dataclass(frozen=True)
class Event:
    at: float  # Unix time, by the clock of the machine that recorded it
    phase: str
    node: str | None = None  # None: the run's own
    round: int | None = None  # recovering runs: the membership round
    rank: int | None = None  # a training process's global rank (first and last lines)
    incarnation: int = 0  # 0: the node as first started; n: its n-th replacement
    attempt: int = 1  # runs retried whole: the attempt
    detail: str = ""
    step: int | None = None  # first and last steps: the step number the script reported (launcher.data.report)
    steps: int | None = None  # last steps: how many steps the training process counted

    @property
    def label(self) -> str:
        if self.phase in (ATTEMPT, ATTEMPT_ENDED):
            return f"attempt {self.attempt} {'started' if self.phase == ATTEMPT else 'ended'}"
        return LABELS.get(self.phase, self.phase)


@dataclass
class Records:
    """What one attempt's namespace holds that has a time: the raw records, as read."""

    run: dict[str, Any] = field(default_factory=dict)  # run.json
    batches: list[dict[str, Any]] = field(default_factory=list)  # events/{node}/*.json
    scales: list[dict[str, Any]] = field(default_factory=list)  # events/scale.*.json
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    rounds: list[int] = field(default_factory=list)  # decided rounds
    ends: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # round -> its end records
    leaves: list[dict[str, Any]] = field(default_factory=list)  # control/leave.*.json
    cancel: dict[str, Any] | None = None
    limit: dict[str, Any] | None = None
    stopped: Round | None = None  # the latest round, where it was decided as the run's stop


@dataclass(frozen=True)
class Timeline:
    run_id: str
    submitted: float  # the time every other is measured from
    nodes: list[str]  # the lanes, in rank order
    events: list[Event]  # by time
    read_at: float  # when the records were read: where the lanes of nodes still running end
    recovering: bool = False  # trained in membership rounds
    attempts: int = 1  # runs retried whole: the attempts that were started
    health: list[Utilisation] = field(default_factory=list)  # the nodes' health records, each attempt's its own

    def attempt_started(self, attempt: int) -> float | None:
        """When ``attempt`` (2 or later) was started; None: the first, or one never started."""
        return next((event.at for event in self.events if event.phase == ATTEMPT and event.attempt == attempt), None)

    def seconds(self, at: float) -> float:
        return at - self.submitted

    def node_events(self, node: str) -> list[Event]:
        return [event for event in self.events if event.node == node]

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "submitted_at": self.submitted, "nodes": self.nodes,
                "recovering": self.recovering, "attempts": self.attempts,
                "events": [{**asdict(event), "seconds": round(self.seconds(event.at), 6)} for event in self.events],
                "health": {node: [drawn.to_dict() for drawn in self.health if drawn.node == node]
                           for node in self.nodes if any(drawn.node == node for drawn in self.health)}}


def derive(records: Records, attempt: int = 1) -> list[Event]:
    """Every event the records of one attempt hold, by time."""
    found: list[Event] = []
    submitted = _time(records.run.get("created_at"))
    if submitted is not None:
        found.append(Event(submitted, SUBMITTED, attempt=attempt))
    for batch in records.batches:
        found += _node_events(batch, attempt)
    found = _first_steps(found)
    starts = _starts(found)
    for number, ends in sorted(records.ends.items()):
        found += _round_ends(number, ends, starts, attempt)
    for name, status in sorted(records.statuses.items()):
        found += _final(name, status, starts, attempt)
    for leave in records.leaves:
        if _time(leave.get("at")) is not None and leave.get("node"):
            found.append(Event(float(leave["at"]), LEAVE_ASKED, str(leave["node"]), attempt=attempt,
                               incarnation=_incarnation(starts, str(leave["node"]), float(leave["at"])),
                               detail=str(leave.get("reason") or "")))
    for wish in records.scales:
        if _time(wish.get("at")) is not None:
            found.append(Event(float(wish["at"]), SCALE, attempt=attempt, detail=_scale_words(wish)))
    for marker, phase in ((records.cancel, CANCELLED), (records.limit, LIMIT_REACHED)):
        if marker and _time(marker.get("at")) is not None:
            found.append(Event(float(marker["at"]), phase, attempt=attempt, detail=str(marker.get("reason") or "")))
    found += _rounds(found, records.rounds, attempt)
    if records.stopped is not None and records.stopped.at:
        found.append(Event(records.stopped.at, RUN_STOPPED, None, records.stopped.number, attempt=attempt,
                           detail=str(records.stopped.give_up)))
    return sorted(found, key=lambda event: (event.at, event.node or ""))


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _node_events(batch: dict[str, Any], attempt: int) -> list[Event]:
    node, incarnation = batch.get("node"), batch.get("incarnation")
    if not isinstance(node, str) or not isinstance(incarnation, int):
        return []
    found = []
    for event in batch.get("events") or []:
        at = _time(event.get("at")) if isinstance(event, dict) else None
        if at is None or event.get("phase") not in node_events.NODE_PHASES:
            continue
        found.append(Event(at, event["phase"], node, _int(event.get("round")), _int(event.get("rank")), incarnation,
                           attempt, _node_detail(event), _int(event.get("step")), _int(event.get("steps"))))
    return found


def _first_steps(found: list[Event]) -> list[Event]:
    """``found`` with one first step per rank and round: the one counted by the source steps are read from (the
    script's report, else an optimizer's, else a DataLoader's: launcher.data.rankprogress.SOURCES)."""
    best: dict[tuple, Event] = {}
    for event in found:
        if event.phase == node_events.FIRST_STEP:
            key = (event.node, event.incarnation, event.round, event.rank)
            held = best.get(key)
            if held is None or _precedence(event.detail) < _precedence(held.detail):
                best[key] = event
    kept = set(map(id, best.values()))
    return [event for event in found if event.phase != node_events.FIRST_STEP or id(event) in kept]


def _precedence(source: str) -> int:
    return SOURCES.index(source) if source in SOURCES else len(SOURCES)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _node_detail(event: dict[str, Any]) -> str:
    phase = event["phase"]
    if phase == node_events.EXITED:
        return f"exit status {event.get('code')}"
    if phase == node_events.RESTORED:
        return f"{event.get('files', 0)} files"
    if phase == node_events.SYNCED and event.get("failed"):
        return "failed"
    if phase == node_events.DECIDED and event.get("rank") is not None:
        return f"node rank {event['rank']}"
    if phase == node_events.STARTED and event.get("pid"):
        return f"pid {event['pid']}"
    if phase == node_events.FIRST_STEP:
        return str(event.get("source") or "")
    if phase == node_events.LAST_STEP:
        return f"{event.get('steps')} steps" + (f", step {event['step']}" if _int(event.get("step")) else "")
    if phase == node_events.TORCHRUN and event.get("spare"):
        # events written before the spare said when its imports were done carry no spare_imported
        return "a spare, still importing" if event.get("spare_imported") is False else "a spare, its imports done"
    return ""


def _starts(found: list[Event]) -> dict[str, list[tuple[float, int]]]:
    """Per node, when each of its incarnations started."""
    starts: dict[str, list[tuple[float, int]]] = {}
    for event in found:
        if event.phase == node_events.STARTED and event.node:
            starts.setdefault(event.node, []).append((event.at, event.incarnation))
    return {node: sorted(times) for node, times in starts.items()}


def _incarnation(starts: dict[str, list[tuple[float, int]]], node: str, at: float) -> int:
    """The incarnation of ``node`` that was there at ``at``: the latest started before it."""
    before = [incarnation for started, incarnation in starts.get(node, []) if started <= at]
    return before[-1] if before else 0


def _round_ends(number: int, ends: list[dict[str, Any]], starts: dict[str, list[tuple[float, int]]],
                attempt: int) -> list[Event]:
    found = []
    for end in ends:
        at, node = _time(end.get("at")), end.get("node")
        if at is None or not isinstance(node, str):
            continue
        kind = end.get("kind")
        phase = DEATH if kind == LOST else JOINS if kind == JOIN else LEAVES if kind == LEAVE else ROUND_ENDED
        found.append(Event(at, phase, node, number, incarnation=_incarnation(starts, node, at), attempt=attempt,
                           detail=f"{kind}: {end.get('reason', '')}"))
    causes = [event for event in found if event.phase in (DEATH, ROUND_ENDED, JOINS, LEAVES)]
    if causes:
        first = min(causes, key=lambda event: event.at)
        found.append(Event(first.at, ROUND_ENDED, None, number, attempt=attempt,
                           detail=f"node {first.node}: {first.detail}"))
    return found


def _final(name: str, status: dict[str, Any], starts: dict[str, list[tuple[float, int]]],
           attempt: int) -> list[Event]:
    """A final status: when it was recorded; for a node that did not record it itself, also when it died."""
    state = status.get("state")
    written = _time(status.get("updated_at"))
    if state not in FINAL_STATES or written is None:
        return []
    found = [Event(written, RECORDED, name, _int(status.get("round")), incarnation=_incarnation(starts, name, written),
                   attempt=attempt, detail=f"{state}" + (f" (exit status {status['exit_code']})"
                                                          if status.get("exit_code") is not None else ""))]
    ended = _time(status.get("ended_at"))
    if status.get("reported_by") and ended is not None and state != "lost":  # lost: its round end says so
        found.append(Event(ended, DEATH, name, _int(status.get("round")), incarnation=_incarnation(starts, name, ended),
                           attempt=attempt, detail=f"{status.get('reason', '')} (seen by {status['reported_by']})"))
    return found


def _scale_words(wish: dict[str, Any]) -> str:
    changes = [f"+{name}" for name in wish.get("add") or []] + [f"-{name}" for name in wish.get("remove") or []]
    size = f"{len(wish.get('from') or [])} -> {wish.get('nodes')} nodes"
    return f"{size} ({' '.join(changes)})" if changes else size


def _rounds(found: list[Event], decided: Iterable[int], attempt: int) -> list[Event]:
    """The run's own marks of each round: decided (the first node to learn it), training again (rounds after the
    first: once every rank that counts its steps has counted its first, else the first training line; and how long
    after the round before ended)."""
    marks = []
    learned = [event for event in found if event.phase == node_events.DECIDED]
    for number in sorted(set(decided) | {event.round for event in learned if event.round is not None}):
        of_round = [event for event in learned if event.round == number]
        if of_round:
            marks.append(Event(min(event.at for event in of_round), ROUND_DECIDED, None, number, attempt=attempt))
        again = training_again(found, number)
        ended = [event.at for event in found if event.phase == ROUND_ENDED and event.node is None
                 and event.round == number - 1]
        if number > 0 and again is not None:
            after = f"{again - ended[0]:.2f} s after round {number - 1} ended" if ended else ""
            marks.append(Event(again, TRAINING_AGAIN, None, number, attempt=attempt, detail=after))
    if not decided and learned:  # a static run: one decision, no rounds
        marks.append(Event(min(event.at for event in learned), ROUND_DECIDED, None, None, attempt=attempt))
    return marks


def training_again(events: Iterable[Event], number: int) -> float | None:
    """When round ``number`` trains: its last rank's first step, where its ranks count steps; else its first training
    line (a script that neither steps an optimizer nor iterates a DataLoader, nor reports); None: neither yet."""
    steps, lines = [], []
    for event in events:
        if event.round == number and event.phase == node_events.FIRST_STEP:
            steps.append(event.at)
        elif event.round == number and event.phase == node_events.FIRST_LINE:
            lines.append(event.at)
    return max(steps) if steps else min(lines) if lines else None


def read_records(store: WorkDir) -> Records:
    """The records of one namespace that :func:`derive` reads; damaged ones are left out (a help, never a failure)."""
    from launcher.runs.preflight import RUN_RECORD

    records = Records(run=store.get_record(RUN_RECORD))
    event_keys = store.find(node_events.EVENTS_PREFIX)
    round_keys = store.find(ROUNDS_PREFIX)
    control = store.list(CONTROL_PREFIX)
    status_keys = [f"{STATUS_PREFIX}/{name}" for name in store.list(STATUS_PREFIX) if name.endswith(".json")]
    end_keys = [key for key in round_keys if "/end/" in key and key.endswith(".json")]
    keys = ([f"{node_events.EVENTS_PREFIX}/{key}" for key in event_keys if key.endswith(".json")] + status_keys
            + [f"{ROUNDS_PREFIX}/{key}" for key in end_keys]
            + [f"{CONTROL_PREFIX}/{name}" for name in control if name.startswith("leave.") or name in (CANCEL, LIMIT)])
    with ThreadPoolExecutor(max_workers=8) as pool:  # an object store answers many small GETs faster side by side
        bodies = dict(zip(keys, pool.map(store.get_record, keys)))
    for key in keys:
        body = bodies[key]
        if not body:
            continue
        if key.startswith(f"{node_events.EVENTS_PREFIX}/{node_events.SCALE_PREFIX}"):
            records.scales.append(body)
        elif key.startswith(f"{node_events.EVENTS_PREFIX}/"):
            records.batches.append(body)
        elif key.startswith(f"{STATUS_PREFIX}/"):
            records.statuses[key[len(STATUS_PREFIX) + 1:-len(".json")]] = body
        elif key.startswith(f"{ROUNDS_PREFIX}/"):
            records.ends.setdefault(int(key.split("/")[1]), []).append(body)
        elif key == f"{CONTROL_PREFIX}/{CANCEL}":
            records.cancel = body
        elif key == f"{CONTROL_PREFIX}/{LIMIT}":
            records.limit = body
        else:
            records.leaves.append(body)
    records.rounds = sorted(int(key[:-5]) for key in round_keys if "/" not in key and key[:-5].isdigit())
    latest = Round.from_bytes(data) if records.rounds and (data := store.get(decision_key(records.rounds[-1]))) \
        else None
    records.stopped = latest if latest is not None and latest.give_up else None
    return records


def read_timeline(info: RunInfo, health: bool = True) -> Timeline:
    """The timeline of the run ``info``, over all its attempts; ``health``: with the nodes' health records (drawn
    under their lanes; not needed for the events alone)."""
    from launcher.runs.attempts import read as read_attempts
    from launcher.runs.preflight import reading_work_dir

    top = reading_work_dir(info.run_url)
    found = derive(read_records(top))
    namespaces = [(top, 1)]
    max_restarts = int((info.backend_ids.get("recovery") or {}).get("maxRestarts", 0))
    for attempt in read_attempts(top):
        found.append(Event(_attempt_end(attempt), ATTEMPT_ENDED, attempt=attempt.number - 1,
                           detail=attempt.outcome(max_restarts)))
        if attempt.running:
            found.append(Event(_attempt_start(top, attempt), ATTEMPT, attempt=attempt.number,
                               detail=f"after {attempt.cause.get('node')}: {attempt.cause.get('reason')}"))
            namespaces.append((reading_work_dir(attempt.url), attempt.number))
            found += [event for event in derive(read_records(namespaces[-1][0]), attempt.number)
                      if event.phase != SUBMITTED]
    found.sort(key=lambda event: (event.at, event.node or ""))
    submitted = next((event.at for event in found if event.phase == SUBMITTED), info.created_at)
    named = [event.node for event in found if event.node]
    nodes = list(dict.fromkeys([*info.nodes, *named]))
    recovering = any(event.round is not None and event.phase == ROUND_DECIDED for event in found)
    attempts = max((event.attempt for event in found if event.phase != ATTEMPT_ENDED), default=1)
    drawn = [each for store, number in namespaces for each in read_utilisation(store, nodes, number)] if health else []
    return Timeline(info.run_id, float(submitted), nodes, found, time.time(), recovering, attempts, drawn)


def _attempt_start(top: WorkDir, attempt: Attempt) -> float:
    """When ``attempt`` was started: its start claim's time (made once the attempt before had ended everywhere),
    else when a command took it on."""
    from launcher.runs.attempts import start_key

    return _time(top.get_record(start_key(attempt.number)).get("at")) or attempt.at


def _attempt_end(attempt: Attempt) -> float:
    """When the attempt before ``attempt`` ended: when its cause happened, else when a command saw it end."""
    return _time(attempt.cause.get("at")) or attempt.at


# What a node does between two of its events: the state each event begins.
STARTING = "starting"  # process started -> registered: the interpreter, launcher's imports, finding its address
WAITING = "waiting"  # registered -> rank learned: the rendezvous (or a membership round's decision)
PREPARING = "preparing"  # rank learned -> torchrun started: restoring outputs (checkpoints)
LAUNCHING = "launching"  # torchrun started -> first training line: torchrun, interpreters, import torch, the script
TRAINING = "training"  # first training line -> last training line (the node's earliest and latest rank)
STOPPING = "stopping"  # last training line -> training processes exited: the script's own end, the interpreter's
ENDING = "ending"  # training processes exited -> torchrun exited: torchrun noticing, its exit barrier, its exit
SYNCING = "syncing"  # torchrun exited -> outputs synced (between rounds: -> registered in the next)
RECORDING = "recording"  # outputs synced -> final status recorded: the last log chunk, the status
STATES = (STARTING, WAITING, PREPARING, LAUNCHING, TRAINING, STOPPING, ENDING, SYNCING, RECORDING)
_BEGINS = {node_events.STARTED: STARTING, node_events.REGISTERED: WAITING, node_events.DECIDED: PREPARING,
           node_events.RESTORED: PREPARING, node_events.TORCHRUN: LAUNCHING, node_events.FIRST_LINE: TRAINING,
           node_events.LAST_LINE: STOPPING, node_events.RANK_EXITED: ENDING, node_events.EXITED: SYNCING,
           node_events.SYNCED: RECORDING}
_ENDS = (DEATH, RECORDED)
LATEST_OF_RANKS = (node_events.LAST_LINE, node_events.RANK_EXITED)  # a node's stands for its latest rank's


@dataclass(frozen=True)
class Segment:
    node: str
    incarnation: int
    state: str
    start: float
    end: float
    attempt: int = 1


def segments(timeline: Timeline) -> list[Segment]:
    """Each node's states over time, one stretch per state, from its events: an incarnation's lane ends at its
    death or final status, else at its next incarnation's start, else at the next attempt's start, else (still
    running) when the records were read."""
    found = []
    # Grouped once: a scan of every event per node cost 1,024 nodes' timeline 40 s (benchmarks/scale_client.py)
    by_node: dict[str, list[Event]] = {node: [] for node in timeline.nodes}
    for event in timeline.events:
        by_node.get(event.node, []).append(event)
    attempt_starts: dict[int, float | None] = {}  # each looked up once, for the same reason
    for node in timeline.nodes:
        mine = by_node[node]
        for attempt, incarnation in sorted({(event.attempt, event.incarnation) for event in mine}):
            chain = _transitions([event for event in mine
                                  if (event.attempt, event.incarnation) == (attempt, incarnation)])
            later = [event.at for event in mine if event.phase == node_events.STARTED
                     and event.attempt == attempt and event.incarnation > incarnation]
            if attempt + 1 not in attempt_starts:
                attempt_starts[attempt + 1] = timeline.attempt_started(attempt + 1)
            next_attempt = attempt_starts[attempt + 1]
            open_end = min(later) if later else next_attempt if next_attempt is not None else timeline.read_at
            for (start, state), (end, _) in zip(chain, chain[1:] + [(open_end, None)]):
                if state is not None and end > start:
                    found.append(Segment(node, incarnation, state, start, end, attempt))
    return found


def _transitions(events: list[Event]) -> list[tuple[float, str | None]]:
    """(time, state begun) for one incarnation's events; None once it ended. A round's first training line is that
    of its earliest rank, its last line and its processes' exit those of its latest."""
    earliest: dict[tuple[str, int | None], float] = {}  # (phase, round) -> the time that stands for its ranks
    for event in events:
        key = (event.phase, event.round)
        if event.phase == node_events.FIRST_LINE:
            earliest[key] = min(event.at, earliest.get(key, event.at))
        elif event.phase in LATEST_OF_RANKS:
            earliest[key] = max(event.at, earliest.get(key, event.at))
    chain: list[tuple[float, str | None]] = []
    for event in events:
        if (event.phase, event.round) in earliest and event.at != earliest[(event.phase, event.round)]:
            continue
        if event.phase in _ENDS:
            chain.append((event.at, None))
            break
        if event.phase in _BEGINS:
            chain.append((event.at, _BEGINS[event.phase]))
    return chain
