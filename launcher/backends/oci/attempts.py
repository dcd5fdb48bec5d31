"""Native OCI runs that recover: when an attempt fails, the run is retried as a whole, as its next attempt.

The replicas of a multi-node job run start and end together: none can be replaced alone. So a
recovering native run is retried whole, by whichever command reads the service
(:mod:`launcher.runs.retries`): each attempt is one job run of the run's job whose node groups' env
name the attempt (``jobNodeConfigurationOverrideDetails``: the job's own node configuration with the
env of :func:`launcher.runs.attempts.node_env`), created with one ``opc-retry-token`` per run and
attempt, so that a command that takes over a stale start gets the job run the first created.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from launcher.backends.base import NodeFate
from launcher.runs import attempts, retries
from launcher.runs.attempts import Attempt

if TYPE_CHECKING:
    from launcher.protocol.store import WorkDir
    from launcher.runs.state import RunInfo


class NativeRuns(Protocol):
    """What the attempts need of the backend (:class:`launcher.backends.oci.OciBackend`), named here so that this
    module does not import its package."""

    def native_fates(self, info: RunInfo, client: Any, job_run: str, work: Any) -> tuple[Any, dict[str, NodeFate]]: ...


class JobRuns:
    """A native run's attempts as job runs of its job (units keyed by the run id: one job run holds every node)."""

    unit = "job run"

    def __init__(self, backend: NativeRuns, client: Any):
        self.backend = backend
        self.client = client

    def first_units(self, info: RunInfo) -> dict[str, str]:
        return dict(info.backend_ids["job_runs"])

    def fates(self, info: RunInfo, units: dict[str, str], store: WorkDir) -> dict[str, NodeFate] | None:
        run, seen = self.backend.native_fates(info, self.client, next(iter(units.values())), store)
        return None if run is None else seen

    def ended(self, info: RunInfo, units: dict[str, str]) -> bool | None:
        from launcher.backends.oci import service

        try:
            return all(self.client.get_job_run(unit).data.lifecycle_state in service.TERMINAL
                       for unit in units.values())
        except Exception:  # noqa: BLE001 - the service cannot be read now: a later look starts the attempt
            return None

    def start(self, info: RunInfo, attempt: Attempt) -> Attempt:
        """Create the job run of ``attempt``: the job's node groups, each with the attempt's env."""
        import oci

        from launcher.backends.oci import service

        max_restarts = int(info.backend_ids["recovery"].get("maxRestarts", 0))
        try:
            job = self.client.get_job(info.backend_ids["job"]).data
            nodes = copy.deepcopy(job.job_node_configuration_details)
            for group in nodes.job_node_group_configuration_details_list:
                config = group.job_configuration_details
                config.environment_variables = attempts.node_env(config.environment_variables or {}, attempt.number,
                                                                 attempt.restarts, max_restarts)
            details = oci.data_science.models.CreateJobRunDetails(
                project_id=job.project_id, compartment_id=job.compartment_id, job_id=job.id,
                display_name=f"{info.run_id}.{attempt.number}", job_node_configuration_override_details=nodes,
                freeform_tags={**(job.freeform_tags or {}), "launcher-attempt": str(attempt.number)})
            created = self.client.create_job_run(
                details, opc_retry_token=service.token(info.run_id, f"attempt/{attempt.number}")).data
        except (oci.exceptions.ServiceError, oci.exceptions.RequestException, oci.exceptions.ClientError) as exc:
            return replace(attempt, error=service.service_message(exc))
        return replace(attempt, units={info.run_id: created.id})

    def stop(self, info: RunInfo, attempt: Attempt) -> None:
        from launcher.backends.oci import service

        service.cancel(self.client, {f"attempt {attempt.number}": self.client.get_job_run(unit).data
                                     for unit in attempt.units.values()})


def native_fates(backend: NativeRuns, info: RunInfo, client: Any) -> dict[str, NodeFate]:
    """The nodes' fates in the run's current attempt, which this command moves on (:mod:`launcher.runs.retries`)."""
    return retries.fates(JobRuns(backend, client), info)


def every_run(info: RunInfo) -> list[str]:
    """Every job run of every attempt the run has had, for clean-up."""
    later = [run for units in retries.later_units(info) for run in units.values()]
    return list(info.backend_ids["job_runs"].values()) + later


def current_runs(info: RunInfo) -> dict[str, str]:
    """The job run of the attempt the run is in, as this command last saw it."""
    return retries.current_units(info, dict(info.backend_ids["job_runs"]))
