"""Whole-run retries: a run that cannot go on is started again as a new *attempt* that resumes where it stopped.

Where a backend cannot start one lost node again (OCI native mode: a job run's replicas start and end
together), a run whose node is lost, or whose training fails, ends its attempt. The recovery policy
(:mod:`launcher.protocol.recovery`: ``maxRestarts``, ``retryOn``) then decides, as it does for rounds, whether
the run is started again: the new attempt's nodes first restore the newest copy of every output file of
every attempt before (checkpoints included), as ``--resume-from`` does, without the user asking.

Layout under the run's directory ``{work dir}/{run id}/`` (attempt 1 is that directory itself)::

  attempts/{n}.json           attempt n (n >= 2), created if absent by the command that saw attempt n-1 end
                              (so that however many see it, one goes on): how n-1 ended, whether n was
                              started (else why not), the restarts used, and what the backend started
  attempts/{run id}.{n}/...   attempt n's namespace: its nodes are told run id ``{run id}.{n}`` in the work
                              dir ``{work dir}/{run id}/attempts``, so the protocol (statuses, logs, rounds,
                              outputs) starts afresh there; they restore from ``LAUNCHER_RESTORE_FROM``
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from launcher.protocol.recovery import RoundEnd, said

if TYPE_CHECKING:
    from launcher.protocol.store import WorkDir
    from launcher.runs.state import RunInfo

PREFIX = "attempts"
CURRENT = "attempt"  # backend_ids key: the attempt the run's nodes are in now (absent: attempt 1)
RESTORE_FROM = "LAUNCHER_RESTORE_FROM"  # the earlier attempts' namespaces, a JSON list (nodes restore from them)
RESTARTS_BEFORE = "restartsBefore"  # in a later attempt's LAUNCHER_RECOVERY: the run's restarts before its rounds


@dataclass(frozen=True)
class Attempt:
    number: int  # 2, 3, ...
    url: str  # its namespace, as this machine reaches the work dir
    cause: dict[str, Any]  # how attempt number - 1 ended: a RoundEnd's fields
    started: bool  # whether it was started; False: the run stopped (why: given_up)
    restarts: int = 0  # restarts the run had used once it began, this retry included
    given_up: str | None = None
    units: dict[str, str] = field(default_factory=dict)  # what the backend started for it, once it has: node ->
    # its unit (OCI: the job run, keyed by the run id; Slurm: each node's job); empty until then
    error: str | None = None  # why the backend could not start it
    at: float = 0.0  # when a command took it on

    def to_bytes(self) -> bytes:
        return json.dumps({**asdict(self), "by": f"{socket.gethostname()}:{os.getpid()}"}).encode()

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Attempt | None":
        if not isinstance(record.get("number"), int) or not isinstance(record.get("cause"), dict):
            return None
        return cls(record["number"], str(record.get("url")), record["cause"], bool(record.get("started")),
                   int(record.get("restarts") or 0), record.get("given_up"), dict(record.get("units") or {}),
                   record.get("error"), float(record.get("at") or 0.0))

    @property
    def running(self) -> bool:
        """Started, and not refused: the run's nodes are (or are about to be) in it."""
        return self.started and not self.error

    def said(self, max_restarts: int) -> str:
        """How the attempt before it ended and what came of it, for summaries."""
        return f"attempt {self.number - 1}: {self.outcome(max_restarts)}"

    def outcome(self, max_restarts: int) -> str:
        """How the attempt before it ended and what came of it, without naming that attempt."""
        if not self.started:
            return str(self.given_up)
        cause = said(RoundEnd.from_record(self.cause))
        if self.error:
            return f"{cause}; attempt {self.number} could not be started: {self.error}"
        return f"{cause}; retried as attempt {self.number} (restart {self.restarts} of {max_restarts})"


def history(info: RunInfo, records: list[Attempt]) -> list[str]:
    """How each attempt of the run that ended, ended, and what came of it: a line each."""
    max_restarts = int((info.backend_ids.get("recovery") or {}).get("maxRestarts", 0))
    return [attempt.said(max_restarts) for attempt in records]


def key(number: int) -> str:
    return f"{PREFIX}/{number}.json"


def start_key(number: int) -> str:
    """The claim of the command that starts attempt ``number`` (``{"at": when}``)."""
    return f"{PREFIX}/{number}.start.json"


def namespace(run_url: str, run_id: str, number: int) -> str:
    """Where attempt ``number`` of the run at ``run_url`` keeps its records."""
    return run_url if number == 1 else f"{run_url}/{PREFIX}/{run_id}.{number}"


def read(top: WorkDir) -> list[Attempt]:
    """The run's attempts after the first, in order (``top``: the run's own directory)."""
    found = []
    for name in top.list(PREFIX):
        if name.endswith(".json") and name[:-5].isdigit():
            attempt = Attempt.from_record(top.get_record(f"{PREFIX}/{name}"))
            if attempt is not None:
                found.append(attempt)
    return sorted(found, key=lambda attempt: attempt.number)


def current(records: list[Attempt]) -> Attempt | None:
    """The attempt the run's nodes are in (or about to be): the newest that was started; None: the first."""
    return next((attempt for attempt in reversed(records) if attempt.running), None)


def current_url(info: RunInfo) -> str:
    """The namespace of the run's nodes as its backend last saw them: that of its newest attempt, else its own."""
    return str((info.backend_ids.get(CURRENT) or {}).get("url") or info.run_url)


def follow(info: RunInfo, attempt: Attempt | None) -> None:
    """Record in ``info`` (and its info.yaml, where this machine keeps one) the attempt the nodes are in now, so
    that every verb reads that attempt's namespace (:func:`current_url`)."""
    from launcher.runs import state

    now = None if attempt is None else {"number": attempt.number, "url": attempt.url, "units": attempt.units,
                                        "at": attempt.at,
                                        "cause": attempt.cause, "restarts": attempt.restarts}
    if info.backend_ids.get(CURRENT) == now:
        return
    recorded = state.reread(info)  # as it is now: another command may have changed it
    for record in (info, recorded):
        if now is None:
            record.backend_ids.pop(CURRENT, None)
        else:
            record.backend_ids[CURRENT] = now
    if info.recorded:
        state.save(recorded)


def node_env(env: Mapping[str, str], number: int, restarts: int, max_restarts: int) -> dict[str, str]:
    """The env of attempt ``number``'s nodes, from that of attempt 1's (the run as submitted): their own run id and
    namespace, every earlier attempt to restore from, and what is left of ``maxRestarts`` for their rounds once the
    run has used ``restarts`` (and that count, for what they say)."""
    run_id, top = env["LAUNCHER_RUN_ID"], f"{env['LAUNCHER_WORK_DIR'].rstrip('/')}/{env['LAUNCHER_RUN_ID']}"
    changed = {**env, "LAUNCHER_RUN_ID": f"{run_id}.{number}", "LAUNCHER_WORK_DIR": f"{top}/{PREFIX}",
               RESTORE_FROM: json.dumps([namespace(top, run_id, earlier) for earlier in range(1, number)])}
    if env.get("LAUNCHER_RECOVERY"):
        rounds = json.loads(env["LAUNCHER_RECOVERY"])
        changed["LAUNCHER_RECOVERY"] = json.dumps({**rounds, "maxRestarts": max(0, max_restarts - restarts),
                                                   RESTARTS_BEFORE: restarts})
    return changed


def restarts_before(recovery: Mapping[str, Any] | None) -> int:
    """The restarts a run had used before the attempt whose nodes were told ``recovery``: its rounds count from 0,
    the run's count (what users read) from this."""
    return int((recovery or {}).get(RESTARTS_BEFORE) or 0)


def started_line(info: RunInfo) -> str:
    """What ``watch`` says when the run's nodes move to a new attempt."""
    now = info.backend_ids.get(CURRENT) or {}
    max_restarts = (info.backend_ids.get("recovery") or {}).get("maxRestarts", 0)
    ended = said(RoundEnd.from_record(now["cause"]))
    return (f"run {info.run_id}: attempt {now.get('number', 1) - 1} ended ({ended}); "
            f"attempt {now.get('number')} started, restart {now.get('restarts')} of {max_restarts}: its nodes "
            "restore the outputs of the attempts before")
