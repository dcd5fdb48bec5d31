"""Whole-run retries driven by the client's commands, for any backend that can start a run again as a unit.

Where a backend has no process of its own beside the nodes (OCI's job runs, Slurm's jobs), whichever command
reads the engine (``run`` while it follows, ``watch``, ``status``, ``cancel``) moves a recovering run on from
one attempt (:mod:`launcher.runs.attempts`) to the next, in two steps:

1. Once the current attempt n has ended without succeeding (every node reported its end, or the engine
   ended it: a node that had not reported is lost), it creates ``attempts/{n+1}.json`` if absent
   (create-if-absent: of several commands at once, on one machine or several, exactly one decides)
   with the policy's answer, started or why not, and records the nodes of attempt n that died
   without reporting. From then on every verb reads attempt n+1's namespace.
2. Once everything attempt n ran has ended (the two never hold machines at once: a quota, a
   partition's limit), the first command to see it creates ``attempts/{n+1}.start.json`` if absent,
   then starts attempt n+1 (:meth:`AttemptEngine.start`) and records what it started in
   ``attempts/{n+1}.json``.

A start claim left without its units for :data:`CLAIM_STALE_SECONDS` (its command died) is taken over: the
engine must make a second start of the same attempt find the first's (OCI: the same retry token; Slurm: the
job's unique name). A cancel seen before the new attempt starts means it never does; one that comes while it
starts stops it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from launcher.backends.base import NodeFate
from launcher.interrupts import held_interrupts
from launcher.protocol.recovery import FAILURE, KILLED, LOST, NEVER_STARTS, Policy, RoundEnd
from launcher.runs import attempts
from launcher.runs.attempts import Attempt

if TYPE_CHECKING:
    from launcher.protocol.store import WorkDir
    from launcher.runs.state import RunInfo
    from launcher.runs.view import RunView

CLAIM_STALE_SECONDS = 120.0
KILL_SIGNALS = ("SIGKILL", "SIGTERM")  # a training process ended by these was killed from outside


class AttemptEngine(Protocol):
    """What a backend does for the driver; ``units``: node -> what runs it in one attempt (a job run, a job)."""

    unit: str  # what an attempt's start creates, in the engine's words: "job run", "Slurm job"

    def first_units(self, info: RunInfo) -> dict[str, str]:
        """The units of attempt 1: the run as submitted."""

    def fates(self, info: RunInfo, units: dict[str, str], store: WorkDir) -> dict[str, NodeFate] | None:
        """Each node's fate in the attempt whose units are ``units`` and whose namespace is ``store``; None when the
        engine cannot say now (it is unreachable, or does not know the units)."""

    def ended(self, info: RunInfo, units: dict[str, str]) -> bool | None:
        """Whether everything these units ran has ended (None: the engine cannot say now)."""

    def start(self, info: RunInfo, attempt: Attempt) -> Attempt:
        """Start ``attempt`` (its nodes' env: :func:`launcher.runs.attempts.node_env`); it with its units, or with
        the engine's refusal as its error."""

    def stop(self, info: RunInfo, attempt: Attempt) -> None:
        """Stop what :meth:`start` started for ``attempt``: the run was cancelled while it started."""


def fates(engine: AttemptEngine, info: RunInfo) -> dict[str, NodeFate]:
    """The nodes' fates in the run's current attempt, which this command moves on as described above."""
    from launcher.runs.preflight import reading_work_dir
    from launcher.runs.view import read_view, record_lost

    top = reading_work_dir(info.run_url)
    records = attempts.read(top)
    now = attempts.current(records)
    if now is not None and not now.units:  # decided, not started yet
        now = _start(top, engine, info, now, units_of(engine, info, records, now.number - 1))
        if now.running and not now.units:
            attempts.follow(info, now)
            return _starting(engine, info, now)
        records = [now if attempt.number == now.number else attempt for attempt in records]
        now = attempts.current(records)
    attempts.follow(info, now)
    store = reading_work_dir(attempts.current_url(info))
    seen = engine.fates(info, units_of(engine, info, records, now.number if now else 1), store)
    if seen is None:
        return {}
    view = read_view(info, store, fates=seen)
    if not view.ended or view.result in ("succeeded", "cancelled"):
        return seen
    number = (now.number if now else 1) + 1
    if any(attempt.number == number for attempt in records):  # decided before: not started, or refused
        return seen
    following = next_attempt(view, store, info.backend_ids["recovery"], now)
    if not top.create(attempts.key(number), following.to_bytes()):  # another command decided an instant earlier
        taken = Attempt.from_record(top.get_record(attempts.key(number)))
        if taken is None or not taken.running:
            return seen
        attempts.follow(info, taken)
        return _starting(engine, info, taken)
    record_lost(view, store)  # nobody reads this attempt's records as the current ones again
    if not following.started:
        return seen
    following = _start(top, engine, info, following, units_of(engine, info, records, number - 1))
    if following.error:
        return _refused(following, seen)
    attempts.follow(info, following)
    return _starting(engine, info, following)


def units_of(engine: AttemptEngine, info: RunInfo, records: list[Attempt], number: int) -> dict[str, str]:
    """The units of attempt ``number`` (1: the run as submitted)."""
    if number == 1:
        return engine.first_units(info)
    return next((attempt.units for attempt in records if attempt.number == number), {})


def later_units(info: RunInfo) -> list[dict[str, str]]:
    """The units of each attempt after the first that was started, in order, for clean-up."""
    from launcher.runs.preflight import reading_work_dir

    later = attempts.read(reading_work_dir(info.run_url)) if info.backend_ids.get("recovery") else []
    return [attempt.units for attempt in later if attempt.units]


def current_units(info: RunInfo, first: dict[str, str]) -> dict[str, str]:
    """The units of the attempt the run is in, as this command last saw it (``first``: attempt 1's); none yet:
    nothing of it to stop."""
    now = info.backend_ids.get(attempts.CURRENT)
    return first if now is None else dict(now.get("units") or {})


def _starting(engine: AttemptEngine, info: RunInfo, attempt: Attempt) -> dict[str, NodeFate]:
    started = ", ".join(dict.fromkeys(attempt.units.values()))
    what = (f"{engine.unit} {started}" if started else
            f"its {engine.unit} comes once what the attempt before ran has ended")
    return {node: NodeFate(True, reason=f"attempt {attempt.number} starting ({what})") for node in info.nodes}


def _refused(attempt: Attempt, seen: dict[str, NodeFate]) -> dict[str, NodeFate]:
    print(f"note: attempt {attempt.number} of the run could not be started: {attempt.error}", file=sys.stderr)
    return {node: replace(fate, reason=f"{fate.reason}; attempt {attempt.number} could not be started: "
                                       f"{attempt.error}") for node, fate in seen.items()}


def _start(top: WorkDir, engine: AttemptEngine, info: RunInfo, attempt: Attempt,
           previous: dict[str, str]) -> Attempt:
    """Start ``attempt`` once everything of the attempt before (``previous``: its units) has ended, unless another
    command does (its start claim); the attempt as it is now, recorded."""
    before = attempts.namespace(info.run_url, info.run_id, attempt.number - 1)
    if _cancelled(before, attempt.url):
        return _recorded(top, replace(attempt, error="the run was cancelled before it started"))
    if not engine.ended(info, previous):  # still ending, or the engine cannot say now: a later look starts it
        return attempt
    claim = attempts.start_key(attempt.number)
    if not top.create(claim, json.dumps({"at": time.time()}).encode()) and \
            time.time() - float(top.get_record(claim).get("at") or 0.0) < CLAIM_STALE_SECONDS:
        return attempt  # another command is starting it
    with held_interrupts() as interrupted:  # a Ctrl-C to the command that follows waits until the start is recorded
        started = engine.start(info, attempt)
        if started.units and _cancelled(before, attempt.url):  # cancelled while it was being started
            from launcher.protocol.control import request_cancel
            from launcher.runs.preflight import reading_work_dir

            request_cancel(reading_work_dir(attempt.url), "the run was cancelled while this attempt started")
            engine.stop(info, started)
        recorded = _recorded(top, started)
    if interrupted:
        raise KeyboardInterrupt
    return recorded


def _cancelled(*urls: str) -> bool:
    from launcher.protocol.control import cancel_requested
    from launcher.runs.preflight import reading_work_dir

    return any(cancel_requested(reading_work_dir(url)) for url in urls)


def _recorded(top: WorkDir, attempt: Attempt) -> Attempt:
    top.put(attempts.key(attempt.number), attempt.to_bytes())
    return attempt


def attempt_end(view: RunView, store: WorkDir) -> RoundEnd | str:
    """Why the attempt seen in ``view`` (read from ``store``) failed, as the round end the policy weighs: a node
    lost first (the others' failures follow from it), else the first failure (killed, when its processes were
    killed from outside); or why it is not retried at all (a cancel; the run's own limit; rounds that gave up under
    the policy already; an engine that can never start the run as submitted)."""
    from launcher.protocol.rounds import latest_round

    if view.cancel is not None:
        return f"not retried: the run was cancelled ({view.cancel.get('reason', 'by user')})"
    if view.limit is not None:
        return f"not retried: {view.limit.get('reason')} (a limit of the run's own)"
    latest = latest_round(store)
    if latest is not None and latest.give_up and not latest.short_of_nodes:  # short of nodes: weigh the loss
        return f"not retried: {latest.give_up}"
    lost = [{**status, "node": name} for name, status in view.statuses.items() if status.get("state") == "lost"]
    lost += list(view.lost.values())
    if lost:
        first = min(lost, key=lambda record: float(record.get("ended_at") or record.get("at") or 0.0))
        return RoundEnd(first["node"], LOST, str(first.get("reason") or "lost"), first.get("exit_code"),
                        float(first.get("ended_at") or first.get("at") or 0.0))
    root = view.root_failure()
    if root is None:
        return "not retried: no node failed"
    if root.get("kind") == NEVER_STARTS:  # the cause, shown with the run's result, names the job, not a node
        return "not retried: the same submission can never start"
    killed = (root.get("cause") or {}).get("signal") in KILL_SIGNALS
    # an engine that took the machines (Slurm's time limit, a node failure, preemption) records its end as lost
    kind = root.get("kind") if root.get("kind") in (LOST, KILLED) else KILLED if killed else FAILURE
    return RoundEnd(str(root.get("node")), kind, str(root.get("reason")), root.get("exit_code"),
                    float(root.get("at") or 0.0))


def next_attempt(view: RunView, store: WorkDir, recovery: Mapping[str, Any], before: Attempt | None) -> Attempt:
    """Attempt ``n + 1`` after the failed attempt ``before`` (None: the first) seen in ``view``: started when the
    policy has a restart left for how it ended. Restarts are counted across attempts, with those the attempt's
    own rounds used."""
    from launcher.protocol.rounds import latest_round

    number = (before.number if before else 1) + 1
    info = view.info
    url = attempts.namespace(info.run_url, info.run_id, number)
    end = attempt_end(view, store)
    latest = latest_round(store)
    used = (before.restarts if before else 0) + (latest.restarts if latest else 0)
    if isinstance(end, str):
        return Attempt(number, url, {}, False, used, given_up=end, at=time.time())
    restarts, given_up, _ = Policy.from_settings(recovery).next_round([end], used)
    return Attempt(number, url, asdict(end), given_up is None, restarts, given_up=given_up, at=time.time())
