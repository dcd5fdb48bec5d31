"""What a run's state is: the work dir's records reconciled with what the backend says is alive.

The work dir says what each node reported (status, decision, failure and cancel markers); the
backend says which node processes still run and how the others ended. A node whose process
is gone without a final status is *lost*: it died without reporting (SIGKILL of node and
supervisor, a store it could not write, ...), and the run cannot succeed.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from typing import Any

from launcher.backends.base import Backend, NodeFate
from launcher.errors import EXIT_BACKEND, EXIT_OK, EXIT_RUN_FAILED
from launcher.protocol.control import CANCEL, CONTROL_PREFIX, LIMIT, node_label, record_failure
from launcher.protocol.rendezvous import DECISION_KEY
from launcher.protocol.status import FINAL_STATES, status_key
from launcher.protocol.store import StoreError, WorkDir
from launcher.runs.attempts import Attempt, current_url, history
from launcher.runs.preflight import reading_work_dir
from launcher.runs.state import RunInfo
from launcher.runs.supervision import console_tail

DEPARTED = ("left", "lost")  # final states of nodes a recovering run went on without


@dataclass
class RunView:
    info: RunInfo
    statuses: dict[str, dict[str, Any]]
    decision: dict[str, Any] | None
    failures: list[dict[str, Any]]
    cancel: dict[str, Any] | None
    fates: dict[str, NodeFate]
    limit: dict[str, Any] | None = None  # the run reached its own limit (maxRuntime)

    @functools.cached_property
    def lost(self) -> dict[str, dict[str, Any]]:
        """Nodes whose process is gone without a final status, described like failure markers.

        Computed once per view: it reads the tail of each lost node's console log, and ``ended``,
        ``result``, ``root_failure`` and the closing line all ask for it."""
        lost = {}
        for name in self.info.nodes:
            fate = self.fates.get(name)
            if fate is None or fate.running or name in self.unstarted or \
                    self.statuses.get(name, {}).get("state") in FINAL_STATES:
                continue
            lost[name] = {"node": name, "rank": self.rank_of(name), "exit_code": fate.exit_code,
                          "departed": self.went_on_without(name),
                          "reason": fate.reason or "node process is gone", "at": fate.ended_at or time.time(),
                          "console_log": fate.console_log,
                          "last_output": list(fate.last_output[-5:]) or console_tail(fate.console_log)}
        return lost

    @property
    def unstarted(self) -> list[str]:
        """Nodes the backend never gave a machine, gone all the same (their job was cancelled while it waited): not
        lost, since none ran; the run's failure or cancel says why."""
        return [name for name in self.info.nodes if (fate := self.fates.get(name)) is not None and
                fate.never_started and self.statuses.get(name, {}).get("state") not in FINAL_STATES]

    def shown_status(self, node: str) -> dict[str, Any]:
        """The node's status as readers show it: its record, with a lost node's end over it, and a state also before
        it has reported (pending, or not started where the backend never gave it a machine)."""
        lost = self.lost
        record = {**self.statuses.get(node, {}), **({"state": "lost", **lost[node]} if node in lost else {})}
        record.setdefault("state", "not started" if self.never_started or node in self.unstarted else "pending")
        return record

    def went_on_without(self, node: str) -> bool:
        """A recovering run whose latest round does not hold ``node``: its end closed an earlier round and the run
        went on without it (where no supervisor recorded it lost then, e.g. a Slurm task killed with its node)."""
        return bool(self.decision and "round" in self.decision and node not in self.decision.get("ranks", {}))

    @functools.cached_property
    def attempts(self) -> list[Attempt]:
        """The run's attempts after the first (a run retried whole: :mod:`launcher.runs.attempts`)."""
        from launcher.runs.attempts import read

        return read(reading_work_dir(self.info.run_url))

    @property
    def never_started(self) -> bool:
        """`run` recorded the run but failed to start it (its error was shown then)."""
        return self.info.submission == "failed" and not self.statuses and not self.fates

    @property
    def ended(self) -> bool:
        if self.never_started:
            return True
        gone = set(self.lost) | set(self.unstarted)
        return all((self.statuses.get(n, {}).get("state") in FINAL_STATES and not self._unexplained_cancel(n))
                   or n in gone for n in self.info.nodes)

    def _unexplained_cancel(self, node: str) -> bool:
        """The node says cancelled (it got a signal) with no cancel on record, while the backend still runs it: the
        engine is ending it, and its word on why (a time limit, say, not a cancel) comes when it has."""
        fate = self.fates.get(node)
        return self.cancel is None and fate is not None and fate.running and \
            self.statuses.get(node, {}).get("state") == "cancelled"

    @property
    def result(self) -> str:
        """pending | running | succeeded | failed | cancelled."""
        states = [self.statuses.get(n, {}).get("state") for n in self.info.nodes]
        if not self.ended:
            return "running" if any(s in ("waiting", "running") or s in FINAL_STATES for s in states) else "pending"
        if self.never_started:
            return "failed to start"
        departed = [self.lost.get(n, {}).get("departed", False) for n in self.info.nodes]
        if "succeeded" in states and all(s in ("succeeded", "lost", "left") or gone for s, gone in zip(states, departed)):
            return "succeeded"  # a recovering run goes on without the members it lost or that left
        root = self.root_failure()
        if root is not None and (self.cancel is None or root.get("at", 0) <= self.cancel.get("at", 0)):
            return "failed"  # a cancel that came after the first failure does not change its cause
        if self.limit is not None:
            return "failed"
        if self.cancel is not None:
            return "cancelled"
        return "failed" if "failed" in states or self.lost else "cancelled"

    @property
    def failed_before_start(self) -> bool:
        """The run failed before any node started: the backend could not give it its nodes (a Slurm job that can
        never start, or waited too long), so no node is to blame."""
        return self.result == "failed" and bool((self.root_failure() or {}).get("before_start"))

    def exit_status(self) -> int:
        """What ``run``, ``watch`` and ``status`` exit with for the run as seen: 0 while it goes on (``status``) or
        once it succeeded; 3 where the backend never started it (a refused submission, a job that can never start or
        waited too long), as ``run`` exits when the backend refuses it; 1 when it failed or was cancelled."""
        if not self.ended or self.result == "succeeded":
            return EXIT_OK
        return EXIT_BACKEND if self.never_started or self.failed_before_start else EXIT_RUN_FAILED

    def rank_of(self, node: str) -> int | None:
        """The node's rank now: none for a node that left the run (scaled down) or was lost while it went on, whose
        last rank another node may hold since."""
        if self.decision and node in self.decision.get("ranks", {}):
            return self.decision["ranks"][node]
        status = self.statuses.get(node, {})
        return None if status.get("state") in DEPARTED else status.get("rank")

    def victims(self) -> list[str]:
        """Nodes stopped because another failed first (their own errors are consequences, not causes)."""
        root = (self.root_failure() or {}).get("node")
        return [name for name in self.info.nodes if name != root
                and str(self.statuses.get(name, {}).get("reason") or "").startswith("stopped because")]

    def also_failed(self) -> list[dict[str, Any]]:
        """Nodes that failed on their own after the first one (the same error, say): not its victims."""
        root = self.root_failure()
        causes = self.failures + [lost for lost in self.lost.values() if not lost["departed"]]
        return sorted((f for f in causes if root is not None and f.get("node") != root.get("node")
                       and f.get("reason") != root.get("reason")),  # the same decision, seen by every node
                      key=lambda f: f.get("at", 0))

    def root_failure(self) -> dict[str, Any] | None:
        """The first node that failed on its own (not stopped because of another), or was lost; None when the
        run's own limit came first (then no node is the cause)."""
        causes = [f for f in self.failures + [lost for lost in self.lost.values() if not lost["departed"]]
                  if self.limit is None or f.get("at", 0) < self.limit.get("at", 0)]
        return min(causes, key=lambda f: f.get("at", 0)) if causes else None


def open_run(info: RunInfo) -> WorkDir:
    """The run's work dir as the client's verbs use it (after a whole-run retry, its current attempt's namespace):
    an unreachable store fails them within seconds."""
    return reading_work_dir(current_url(info))


def read_view(info: RunInfo, run: WorkDir | None = None, backend: Backend | None = None,
              fates: dict[str, NodeFate] | None = None) -> RunView:
    """The run as its work dir and its backend (or ``fates``, what the backend said a moment ago) show it."""
    from launcher.backends import backend_for

    # The backend is asked first: a node that wrote its final status and then exited is seen final.
    # A run opened from its work dir alone has no process facts on this machine to ask for.
    if fates is None:
        fates = (backend or backend_for(info.backend, "local")).node_fates(info) if info.recorded else {}
    if run is None or run.url != current_url(info):  # the backend may have seen a new attempt begin
        run = open_run(info)
    statuses = {}
    for name in info.nodes:
        statuses[name] = run.get_record(status_key(name))
    decision = run.get_record(DECISION_KEY) or _round_decision(run)
    control = run.list(CONTROL_PREFIX)
    failures = [run.get_record(f"{CONTROL_PREFIX}/{name}") for name in control if name.startswith("failed.")]
    cancel = run.get_record(f"{CONTROL_PREFIX}/{CANCEL}") if CANCEL in control else None
    limit = run.get_record(f"{CONTROL_PREFIX}/{LIMIT}") if LIMIT in control else None
    return RunView(info, {n: s for n, s in statuses.items() if s}, decision or None,
                   [f for f in failures if f], cancel, fates, limit or None)


def _round_decision(run: WorkDir) -> dict[str, Any]:
    """A recovering run's current decision: that of its latest membership round, with the round's number."""
    from dataclasses import asdict

    from launcher.protocol.rounds import latest_round

    latest = latest_round(run)
    return {**asdict(latest.decision), "round": latest.number} if latest and latest.decision else {}


def record_lost(view: RunView, run: WorkDir) -> StoreError | None:
    """Write into the work dir what lost nodes could not: a failed status and a failure marker.

    Peers then stop within seconds (they watch the markers), and the record outlives the
    processes that proved it. Skipped for cancelled runs: there, a gone node is expected.
    Only a help: every reader derives the same states from the view, so a work dir that cannot
    be written (full, read-only) is returned, not raised, and reading goes on.
    """
    if view.cancel is not None:
        return None
    try:
        _write_lost(view, run)
    except StoreError as exc:
        return exc
    return None


def not_recorded_note(error: StoreError) -> str:
    """What readers say when the work dir refused ``record_lost``'s records."""
    return f"note: the lost nodes' ends are shown as read, not recorded in the work dir: {error}"


def _write_lost(view: RunView, run: WorkDir) -> None:
    marked = {failure.get("node") for failure in view.failures}
    for name, lost in view.lost.items():
        details = {"console_log": lost["console_log"], "last_output": lost["last_output"]}
        if lost["departed"]:  # the run went on without it: lost, as a supervisor would have recorded it
            run.put(status_key(name), json.dumps({
                **view.statuses.get(name, {}), "node": name, "state": "lost", "exit_code": lost["exit_code"],
                "reason": lost["reason"], "ended_at": lost["at"], "updated_at": time.time(),
                "reported_by": "launcher (the run went on without it)", **details}).encode())
            continue
        if name not in marked:
            record_failure(run, name, lost["rank"], lost["exit_code"], lost["reason"], details, at=lost["at"])
        status = {**view.statuses.get(name, {}), "node": name, "state": "failed", "exit_code": lost["exit_code"],
                  "reason": lost["reason"], "ended_at": lost["at"], "updated_at": time.time(),
                  "reported_by": "launcher (the backend says the node process is gone)", **details}
        run.put(status_key(name), json.dumps(status).encode())


def closing_line(view: RunView) -> str:
    """The run's result and its cause; where outputs the work dir did not get stay; after whole-run retries, how each
    attempt ended too."""
    return _result_line(view) + "".join(f"\n  {line}" for line in kept_outputs(view) + history(view.info,
                                                                                             view.attempts))


def kept_outputs(view: RunView) -> list[str]:
    """``node t-main: not in the work dir, kept in DIR: checkpoints/ck.pt`` for each node that recorded files its
    outputs sync could not upload (in its final status, or its failure marker when the status did not fit)."""
    from launcher.protocol.outputs import KEPT, kept_text

    records = {failure.get("node"): failure for failure in view.failures if failure.get(KEPT)}
    records.update({name: status for name, status in view.statuses.items() if status.get(KEPT)})
    return [f"{node_label(name)}: {kept_text(record)}" for name, record in sorted(records.items())]


def outputs_dirs_note(view: RunView) -> str:
    """For a command that gives up on the work dir while nodes run: where each node writes its outputs, which keep
    what the work dir did not get."""
    dirs = [f"{node_label(name)}: {status['outputs_dir']}" for name, status in sorted(view.statuses.items())
            if status.get("outputs_dir")]
    return f"note: outputs the work dir did not get stay where the nodes wrote them ({'; '.join(dirs)})" if dirs else ""


def _result_line(view: RunView) -> str:
    result = view.result
    run_id = view.info.run_id
    if result == "failed":
        root = view.root_failure()
        if root is None:
            limit = f": {view.limit['reason']}; every node was stopped" if view.limit else ""
            return f"run {run_id} failed{limit}"
        if view.failed_before_start:
            return f"run {run_id} failed before any node started\n  cause: {root.get('reason')}"
        line = f"run {run_id} failed: {_exited(root.get('stopped_by') or root)}\n  cause: {root.get('reason')}"
        line += "".join(f"\n  {earlier}" for earlier in _rounds(root))
        tail = "".join(f"\n  | {text}" for text in root.get("last_output") or [])
        if root.get("console_log"):
            line += f"\n  it did not report its end; its console log is {root['console_log']}{tail}"
        elif tail:  # lines the backend kept for it (a cloud log service)
            line += f"\n  it did not report its end; its last lines, as the backend logged them:{tail}"
        victims = view.victims()
        if victims:
            line += "\n  stopped because of it: " + ", ".join(node_label(n) for n in victims)
        for other in view.also_failed():
            line += f"\n  also failed: {node_label(other.get('node'))}: {other.get('reason')}"
        return line
    if result == "succeeded":
        return f"run {run_id} succeeded; outputs are in {current_url(view.info)}/outputs/"
    if result == "failed to start" and view.info.submission_error:
        return f"run {run_id} failed to start: {view.info.submission_error}"
    if result == "cancelled" and view.cancel:
        return f"run {run_id} cancelled: {view.cancel.get('reason', 'by user')}"
    return f"run {run_id} {result}"


def _exited(failure: dict[str, Any]) -> str:
    """``node w-1 exited with status 137``: the node that failed first, or in a recovering run that stopped, the
    node whose end stopped it (not the node that said so)."""
    status = "" if failure.get("exit_code") is None else f" with status {failure['exit_code']}"
    return f"{node_label(failure.get('node'))} exited{status}"


def _rounds(root: dict[str, Any]) -> list[str]:
    """A recovering run's rounds, each way they ended once; the cause, shown above, is not repeated."""
    from launcher.protocol.rounds import grouped_history
    from launcher.protocol.recovery import RoundEnd, said

    cause = said(RoundEnd.from_record(root["stopped_by"])) if root.get("stopped_by") else None
    return grouped_history(root.get("rounds") or [], cause)
