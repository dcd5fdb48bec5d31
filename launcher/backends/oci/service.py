"""OCI Data Science through the ``oci`` SDK: submit a run (all or nothing), read its lifecycle, cancel, delete.

Creates carry idempotency (``opc-retry-token``) so that the SDK's retries of 429 and 5xx answers
never create a second job or run; 4xx answers are not retried and are reported with the
service's own message.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import time
from typing import Any, Callable, Mapping, Sequence

from launcher.backends.base import Request
from launcher.backends.oci.bodies import JOB_ID_PLACEHOLDER
from launcher.errors import BackendError
from launcher.ociauth import endpoint, sdk_auth

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELED", "DELETED"}
CANCELLABLE = {"ACCEPTED", "IN_PROGRESS", "NEEDS_ATTENTION"}
# How long cleanup waits for cancelled runs to end before it gives up (and says what is left).
CANCEL_WAIT_SECONDS = float(os.environ.get("LAUNCHER_OCI_CANCEL_WAIT", "600"))
UNREADABLE = "unreadable"
POLL_CAP_SECONDS = 3.0  # ADS polls a run's state every 3 s while it waits (dsc_job.py SLEEP_INTERVAL)
# "... failed with exit code 21.": how the service reports a job run's exit code (ADS DataScienceJobRun.exit_code).
EXIT_CODE = re.compile(r"exit code (\d+)")


def retry_strategy() -> Any:
    """429 and 5xx retried with exponential backoff and jitter, for up to 2 minutes; other 4xx never."""
    import oci

    return oci.retry.RetryStrategyBuilder(
        max_attempts=6, total_elapsed_time_seconds=120, retry_base_sleep_time_seconds=0.5,
        retry_max_wait_between_calls_seconds=10, service_error_retry_on_any_5xx=True,
        service_error_retry_config={429: [], 409: ["IncorrectState"]}).get_retry_strategy()


def _client(client_class: Any, service: str, endpoints: Mapping[str, str]) -> Any:
    config, signer = sdk_auth()
    options: dict[str, Any] = {"retry_strategy": retry_strategy()}
    if signer is not None:
        options["signer"] = signer
    url = endpoint(service, endpoints)
    if url:
        options["service_endpoint"] = url
    return client_class(config, **options)


def data_science(endpoints: Mapping[str, str]) -> Any:
    import oci

    return _client(oci.data_science.DataScienceClient, "dataScience", endpoints)


def log_search(endpoints: Mapping[str, str]) -> Any:
    import oci

    return _client(oci.loggingsearch.LogSearchClient, "logging", endpoints)


def service_message(exc: Exception) -> str:
    status, code, message = (getattr(exc, name, None) for name in ("status", "code", "message"))
    if status is None:
        return str(exc)
    return f"{status} {code}: {message}"


def _model(client: Any, body: dict[str, Any], type_name: str) -> Any:
    """The SDK model for a REST body: the SDK serialises it back to these very fields."""
    import json

    return client.base_client.deserialize_response_data(json.dumps(body).encode(), type_name)


def token(run_id: str, what: str) -> str:
    """The ``opc-retry-token`` of one create: the same for every try of it, by this command or another."""
    return hashlib.sha256(f"{run_id}/{what}".encode()).hexdigest()[:48]


def submit(client: Any, run_id: str, requests: Sequence[Request]) -> dict[str, Any]:
    """Create the job and its run(s). On any refusal: cancel and delete what was made, then raise."""
    import oci

    job_request, run_requests = requests[0], requests[1:]
    job_id = None
    runs: dict[str, str] = {}
    what = "the job"
    try:
        job = client.create_job(_model(client, job_request.body, "CreateJobDetails"),
                                opc_retry_token=token(run_id, "job")).data
        job_id = job.id
        for request in run_requests:
            what = f"the job run for {request.target}"
            body = {**request.body, "jobId": job_id} if request.body.get("jobId") == JOB_ID_PLACEHOLDER \
                else request.body
            run = client.create_job_run(_model(client, body, "CreateJobRunDetails"),
                                        opc_retry_token=token(run_id, f"run/{request.target}")).data
            runs[request.target] = run.id
    except (oci.exceptions.ServiceError, oci.exceptions.RequestException, oci.exceptions.ClientError) as exc:
        left = cleanup(client, job_id, list(runs.values()))
        raise BackendError(f"OCI Data Science refused {what}: {service_message(exc)}; {left}") from None
    return {"job": job_id, "job_runs": runs}


def cleanup(client: Any, job_id: str | None, run_ids: list[str], *,
            wait: float = CANCEL_WAIT_SECONDS) -> str:
    """Cancel the runs still in progress, wait (at most ``wait`` seconds) until they end, then delete the job
    with its runs: the service refuses to delete a job while its runs are in progress (ADS ``DSCJob.delete``
    cancels and waits for CANCELED first). Return what was done, or what is left and why."""
    problems = []
    for run_id, state in _states(client, run_ids).items():
        if state in CANCELLABLE or state.startswith(UNREADABLE):
            try:
                client.cancel_job_run(run_id)
            except Exception as exc:  # noqa: BLE001 - reported, and the wait and delete below still run
                problems.append(f"cancel {run_id}: {service_message(exc)}")
    busy = _until_ended(client, run_ids, wait)
    if busy:
        left = ", ".join(f"{run_id} ({state})" for run_id, state in busy.items())
        return (f"could not remove everything: job run(s) {left} had not ended {wait:g}s after being cancelled, "
                f"and the service deletes no job while its runs are in progress; left: job {job_id}, job run(s) "
                f"{', '.join(busy)} (once they end: oci data-science job delete --job-id {job_id} "
                "--delete-related-job-runs true)")
    if job_id:
        try:
            client.delete_job(job_id, delete_related_job_runs=True)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"delete {job_id}: {service_message(exc)}")
    if problems:
        return "could not remove everything: " + "; ".join(problems)
    return "what was created was cancelled and deleted" if job_id else "nothing was created"


def _states(client: Any, run_ids: list[str]) -> dict[str, str]:
    """Each run's lifecycle state, or why it could not be read."""
    states = {}
    for run_id in run_ids:
        try:
            states[run_id] = client.get_job_run(run_id).data.lifecycle_state
        except Exception as exc:  # noqa: BLE001 - a run that cannot be read is not known to have ended
            states[run_id] = f"{UNREADABLE}: {service_message(exc)}"
    return states


def _until_ended(client: Any, run_ids: list[str], wait: float) -> dict[str, str]:
    """Poll the runs until none is in progress or ``wait`` has passed; return those still busy (id -> state)."""
    deadline = time.monotonic() + wait
    delay = 0.5
    while True:
        busy = {run_id: state for run_id, state in _states(client, run_ids).items() if state not in TERMINAL}
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))  # the service has no events to wait on
        delay = min(POLL_CAP_SECONDS, delay * 2)


def job_runs(client: Any, ids: Mapping[str, str], *, compartment: str | None = None,
             job: str | None = None) -> dict[str, Any]:
    """target -> JobRun or JobRunSummary (lifecycle, details; node groups on a JobRun). With the
    compartment and job, many runs (per-node mode) are read in one paged list call, not one call each.
    A run that cannot be read is left out: status then shows what the work dir knows."""
    import oci

    if compartment and job and len(ids) > 1:
        try:
            found = oci.pagination.list_call_get_all_results(client.list_job_runs, compartment, job_id=job).data
        except Exception:  # noqa: BLE001
            return {}
        by_id = {run.id: run for run in found}
        return {target: by_id[run_id] for target, run_id in ids.items() if run_id in by_id}
    result = {}
    for target, run_id in ids.items():
        try:
            result[target] = client.get_job_run(run_id).data
        except Exception:  # noqa: BLE001
            continue
    return result


def run_like(client: Any, model: str, env: Callable[[dict[str, str]], dict[str, str]], *, display_name: str,
             tags: Mapping[str, str], token: str) -> tuple[str | None, str | None]:
    """Create a job run of the job of job run ``model``, with ``model``'s own settings as the service returns them
    and its env changed by ``env``: (the new job run's OCID, None), or (None, why the service refused)."""
    import oci

    try:
        template = client.get_job_run(model).data
        config = copy.deepcopy(template.job_configuration_override_details) or \
            oci.data_science.models.DefaultJobConfigurationDetails()
        config.environment_variables = env(dict(config.environment_variables or {}))
        details = oci.data_science.models.CreateJobRunDetails(
            project_id=template.project_id, compartment_id=template.compartment_id, job_id=template.job_id,
            display_name=display_name, job_configuration_override_details=config,
            job_environment_configuration_override_details=template.job_environment_configuration_override_details,
            freeform_tags={**(template.freeform_tags or {}), **tags})
        return client.create_job_run(details, opc_retry_token=token).data.id, None
    except (oci.exceptions.ServiceError, oci.exceptions.RequestException, oci.exceptions.ClientError) as exc:
        return None, service_message(exc)


def exit_code(details: str | None) -> int | None:
    """The exit code a job run's (or node group's) lifecycle details report, if any."""
    found = EXIT_CODE.search(details or "")
    return int(found[1]) if found else None


def cancel(client: Any, runs: Mapping[str, Any]) -> list[str]:
    """Cancel the runs (as :func:`job_runs` read them) that can still be cancelled; return their targets."""
    cancelled = []
    for target, run in runs.items():
        if run.lifecycle_state in CANCELLABLE:
            client.cancel_job_run(run.id)
            cancelled.append(target)
    return cancelled
