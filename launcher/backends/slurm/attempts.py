"""Slurm runs that recover, retried as a whole (:mod:`launcher.runs.retries`) when Slurm ended the attempt's job
itself (time limit, a node's failure, preemption): a lost node within a running job is started again alone
(:mod:`launcher.runs.incarnations`), and rounds that gave up are not retried. Each attempt is one batch job of the run's own batch script, named after the
attempt (``launcher:RUN.2``), told its attempt through sbatch's environment (the script stays as submitted), plus
a one-node job for each node `launcher scale` had added. The next attempt is submitted only once every job of
the one before has left the controller's queue, so the two never wait for or hold nodes at once.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from launcher.errors import BackendError

if TYPE_CHECKING:
    from launcher.backends.base import NodeFate
    from launcher.protocol.store import WorkDir
    from launcher.runs.attempts import Attempt
    from launcher.runs.state import RunInfo


@dataclass(frozen=True)
class Scope:
    """One attempt of a run as Slurm runs it (attempt 1: the run as submitted)."""

    jobs: dict[str, str]  # node -> the job it first ran in, in this attempt
    store: WorkDir | None  # the attempt's namespace in the work dir, for a recovering run
    started_at: float  # when the attempt was submitted

    @property
    def batch(self) -> str:
        """The attempt's batch job: the main node's, which is never added on its own."""
        return next(iter(self.jobs.values()))


class Jobs(Protocol):
    """What the attempts need of the backend (:class:`launcher.backends.slurm.SlurmBackend`), named here so that
    this module does not import its package."""

    def _first_jobs(self, info: RunInfo) -> dict[str, str]: ...
    def scope(self, info: RunInfo, units: dict[str, str] | None = None, store: WorkDir | None = None,
              started_at: float | None = None) -> Scope: ...
    def attempt_fates(self, info: RunInfo, scope: Scope) -> dict[str, NodeFate] | None: ...
    def batch_script_of(self, info: RunInfo) -> str: ...
    def one_node_job(self, info: RunInfo, name: str, label: str, node: dict[str, Any],
                     attempt: tuple[int, int] | None = None) -> str: ...


class SlurmJobs:
    """A Slurm run's attempts as batch jobs (units: node -> the job it first runs in, in the attempt)."""

    unit = "Slurm job"

    def __init__(self, backend: Jobs):
        self.backend = backend

    def first_units(self, info: RunInfo) -> dict[str, str]:
        return self.backend._first_jobs(info)

    def fates(self, info: RunInfo, units: dict[str, str], store: WorkDir) -> dict[str, NodeFate] | None:
        return self.backend.attempt_fates(info, self.backend.scope(info, units, store, self._submitted_at(info)))

    def ended(self, info: RunInfo, units: dict[str, str]) -> bool | None:
        """Whether the attempt's jobs have all left the queue; one still waiting for nodes is cancelled (its run
        has moved on)."""
        from launcher.backends.slurm import engine

        try:
            active = [job for job in engine.jobs(sorted(set(units.values()))).values() if job.active]
            engine.cancel([job.job_id for job in active if job.waiting])
        except BackendError:
            return None
        return not active

    def start(self, info: RunInfo, attempt: Attempt) -> Attempt:
        """Submit the attempt's batch job (or find it, where a command that set out to submit it died after it
        did), then a one-node job for each node added to the run; a refusal cancels what was submitted."""
        from launcher import node_names
        from launcher.backends.slurm import engine
        from launcher.backends.slurm.batch import attempt_argv, job_name
        from launcher.node.engines.slurm import ATTEMPT

        which = (attempt.number, attempt.restarts)
        added = info.backend_ids.get("added") or {}
        submitted: dict[str, str] = {}
        try:
            found = engine.named(job_name(f"{info.run_id}.{attempt.number}"))
            batch = found[0] if found else engine.submitted(attempt_argv(info, which),
                                                             self.backend.batch_script_of(info),
                                                             env={ATTEMPT: json.dumps(which)})[0]
            submitted = {name: batch for name in info.nodes if name not in added}
            for name in added:  # as `launcher scale` added it: told the groups grown to hold it
                groups = node_names.including([tuple(group) for group in info.backend_ids["groups"]], name)
                submitted[name] = self.backend.one_node_job(info, name, name, {"name": name, "groups": groups}, which)
        except BackendError as exc:
            self._cancel(list(submitted.values()))
            return replace(attempt, error=str(exc))
        print(f"note: attempt {attempt.number} of run {info.run_id} submitted as Slurm job "
              f"{', '.join(dict.fromkeys(submitted.values()))}", file=sys.stderr)
        return replace(attempt, units=submitted)

    def stop(self, info: RunInfo, attempt: Attempt) -> None:
        self._cancel(list(attempt.units.values()))

    @staticmethod
    def _cancel(job_ids: list[str]) -> None:
        from launcher.backends.slurm import engine

        try:
            engine.cancel(sorted(set(job_ids)))
        except BackendError:
            pass  # the controller cannot be asked now: the jobs' nodes find the attempt cancelled and stop

    @staticmethod
    def _submitted_at(info: RunInfo) -> float | None:
        from launcher.runs.attempts import CURRENT

        return (info.backend_ids.get(CURRENT) or {}).get("at")
