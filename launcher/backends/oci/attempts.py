"""Native OCI runs that recover: when an attempt fails, the run is retried as a whole, as its next attempt.

The replicas of a multi-node job run start and end together: none can be replaced alone. So a
recovering native run is retried whole (:mod:`launcher.runs.attempts`). OCI has no supervisor
process: whichever command reads the service (``run`` while it follows, ``watch``, ``status``,
``cancel``) does it, in two steps:

1. Once the current attempt n has ended without succeeding (every node reported its end, or its job
   run ended: a node that had not reported is lost), it creates ``attempts/{n+1}.json`` if absent
   (create-if-absent: of several commands at once, on one machine or several, exactly one decides)
   with the policy's answer, started or why not, and records the nodes of attempt n that died
   without reporting. From then on every verb reads attempt n+1's namespace.
2. Once attempt n's job run has ended (so that the two never hold machines at once: a shape's
   quota), the first command to see it creates ``attempts/{n+1}.start.json`` if absent, then a job
   run of the run's job whose node groups' env name the new attempt
   (``jobNodeConfigurationOverrideDetails``: the job's own node configuration with the env of
   :func:`launcher.runs.attempts.node_env`), with one ``opc-retry-token`` per run and attempt, and
   records its OCID in ``attempts/{n+1}.json``.

A start claim left without its job run for :data:`CLAIM_STALE_SECONDS` (its command died) is taken
over: the same token makes the service return the job run that command created, if it did. A cancel
seen before the new job run exists means it is never created; one that comes while it is being
created cancels it.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from launcher.backends.base import NodeFate
from launcher.runs import attempts
from launcher.runs.attempts import Attempt

if TYPE_CHECKING:
    from launcher.backends.oci import OciBackend
    from launcher.node.store import WorkDir
    from launcher.runs.state import RunInfo

CLAIM_STALE_SECONDS = 120.0


def native_fates(backend: OciBackend, info: RunInfo, client: Any) -> dict[str, NodeFate]:
    """The nodes' fates in the run's current attempt, which this command moves on as described above."""
    from launcher.runs.preflight import reading_work_dir
    from launcher.runs.view import read_view, record_lost

    top = reading_work_dir(info.run_url)
    records = attempts.read(top)
    now = attempts.current(records)
    if now is not None and now.job_run is None:  # decided, its job run not created yet
        now = _start(top, client, info, now, _job_run(info, records, now.number - 1))
        if now.running and now.job_run is None:
            attempts.follow(info, now)
            return _starting(info, now)
        records = [now if attempt.number == now.number else attempt for attempt in records]
        now = attempts.current(records)
    attempts.follow(info, now)
    store = reading_work_dir(attempts.current_url(info))
    run, fates = backend.native_fates(info, client, _job_run(info, records, now.number if now else 1), store)
    if run is None:
        return fates
    view = read_view(info, store, fates=fates)
    if not view.ended or view.result in ("succeeded", "cancelled"):
        return fates
    number = (now.number if now else 1) + 1
    if any(attempt.number == number for attempt in records):  # decided before: not started, or refused
        return fates
    following = attempts.next_attempt(view, store, info.backend_ids["recovery"], now)
    if not top.create(attempts.key(number), following.to_bytes()):  # another command decided an instant earlier
        taken = Attempt.from_record(top.get_record(attempts.key(number)))
        if taken is None or not taken.running:
            return fates
        attempts.follow(info, taken)
        return _starting(info, taken)
    record_lost(view, store)  # nobody reads this attempt's records as the current ones again
    if not following.started:
        return fates
    following = _start(top, client, info, following, run.id)
    if following.error:
        return _refused(following, fates)
    attempts.follow(info, following)
    return _starting(info, following)


def every_run(info: RunInfo) -> list[str]:
    """Every job run of every attempt the run has had, for clean-up."""
    from launcher.runs.preflight import reading_work_dir

    later = attempts.read(reading_work_dir(info.run_url)) if info.backend_ids.get("recovery") else []
    return list(info.backend_ids["job_runs"].values()) + [attempt.job_run for attempt in later if attempt.job_run]


def current_runs(info: RunInfo) -> dict[str, str]:
    """The job run of the attempt the run is in, as this command last saw it."""
    now = info.backend_ids.get(attempts.CURRENT)
    if now is None:
        return dict(info.backend_ids["job_runs"])
    return {info.run_id: now["job_run"]} if now.get("job_run") else {}  # none yet: nothing of it to stop


def _job_run(info: RunInfo, records: list[Attempt], number: int) -> str:
    """The job run of attempt ``number`` (1: the run's own)."""
    if number == 1:
        return next(iter(info.backend_ids["job_runs"].values()))
    return next(str(attempt.job_run) for attempt in records if attempt.number == number)


def _starting(info: RunInfo, attempt: Attempt) -> dict[str, NodeFate]:
    what = f"job run {attempt.job_run}" if attempt.job_run else "its job run comes once the attempt before has ended"
    return {node: NodeFate(True, reason=f"attempt {attempt.number} starting ({what})") for node in info.nodes}


def _refused(attempt: Attempt, fates: dict[str, NodeFate]) -> dict[str, NodeFate]:
    print(f"note: attempt {attempt.number} of the run could not be started: {attempt.error}", file=sys.stderr)
    return {node: replace(fate, reason=f"{fate.reason}; attempt {attempt.number} could not be started: "
                                       f"{attempt.error}") for node, fate in fates.items()}


def _start(top: WorkDir, client: Any, info: RunInfo, attempt: Attempt, previous: str) -> Attempt:
    """Create the job run of ``attempt`` once ``previous`` (the job run of the attempt before) has ended, unless
    another command does (its start claim); return the attempt as it is now, recorded."""
    from launcher.backends.oci import service

    before = attempts.namespace(info.run_url, info.run_id, attempt.number - 1)
    if _cancelled(before, attempt.url):
        return _recorded(top, replace(attempt, error="the run was cancelled before it started"))
    try:
        ended = client.get_job_run(previous).data.lifecycle_state in service.TERMINAL
    except Exception:  # noqa: BLE001 - the service cannot be read now: a later look starts it
        return attempt
    if not ended:
        return attempt
    claim = f"{attempts.PREFIX}/{attempt.number}.start.json"
    if not top.create(claim, json.dumps({"at": time.time()}).encode()) and \
            time.time() - float(top.get_record(claim).get("at") or 0.0) < CLAIM_STALE_SECONDS:
        return attempt  # another command is creating it
    created = _create(client, info, attempt)
    if created.job_run and _cancelled(before, attempt.url):  # cancelled while the job run was being created
        from launcher.node.control import request_cancel
        from launcher.runs.preflight import reading_work_dir

        request_cancel(reading_work_dir(attempt.url), "the run was cancelled while this attempt started")
        service.cancel(client, {f"attempt {attempt.number}": client.get_job_run(created.job_run).data})
    return _recorded(top, created)


def _cancelled(*urls: str) -> bool:
    from launcher.node.control import cancel_requested
    from launcher.runs.preflight import reading_work_dir

    return any(cancel_requested(reading_work_dir(url)) for url in urls)


def _recorded(top: WorkDir, attempt: Attempt) -> Attempt:
    top.put(attempts.key(attempt.number), attempt.to_bytes())
    return attempt


def _create(client: Any, info: RunInfo, attempt: Attempt) -> Attempt:
    """Create the job run of ``attempt``: the job's node groups, each with the attempt's env."""
    import oci

    from launcher.backends.oci import service

    max_restarts = int(info.backend_ids["recovery"].get("maxRestarts", 0))
    try:
        job = client.get_job(info.backend_ids["job"]).data
        nodes = copy.deepcopy(job.job_node_configuration_details)
        for group in nodes.job_node_group_configuration_details_list:
            config = group.job_configuration_details
            config.environment_variables = attempts.node_env(config.environment_variables or {}, attempt,
                                                             max_restarts)
        details = oci.data_science.models.CreateJobRunDetails(
            project_id=job.project_id, compartment_id=job.compartment_id, job_id=job.id,
            display_name=f"{info.run_id}.{attempt.number}", job_node_configuration_override_details=nodes,
            freeform_tags={**(job.freeform_tags or {}), "launcher-attempt": str(attempt.number)})
        created = client.create_job_run(details, opc_retry_token=service.token(info.run_id,
                                                                                f"attempt/{attempt.number}")).data
    except (oci.exceptions.ServiceError, oci.exceptions.RequestException, oci.exceptions.ClientError) as exc:
        return replace(attempt, error=service.service_message(exc))
    return replace(attempt, job_run=created.id)
