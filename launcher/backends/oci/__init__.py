"""OCI Data Science Jobs: a native multi-node job run, or one job run per node (see :mod:`.bodies`).

The service runs the nodes; the work dir carries the protocol as on every backend. What the
service knows of each node (its lifecycle, why it never started) is merged into ``status`` and
``watch`` through :meth:`OciBackend.node_fates`. The SDK is imported only by verbs that call it.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from launcher.backends.base import Backend, DryRun, NodeFate, Request
from launcher.backends.oci import bodies
from launcher.errors import BadInput
from launcher.ociauth import NODE_OBJECT_STORAGE_ENDPOINT, endpoint
from launcher.plan import Plan
from launcher.runs.state import RunInfo
from launcher.spec.model import DataScienceJobInfra, Spec


def _infra(spec: Spec) -> DataScienceJobInfra:
    if not isinstance(spec.infra, DataScienceJobInfra):
        raise BadInput("the oci backend needs spec.infrastructure.type: dataScienceJob with its spec "
                       "(projectId, compartmentId, shapeName, ...)")
    return spec.infra


# How often a following client asks the service about a run: `watch` reads the work dir 4 times a
# second, and the service's lifecycle changes far slower (and its API has rate limits).
SERVICE_POLL_SECONDS = 10.0


class OciBackend(Backend):
    name = "oci"
    node_command = ("python", "-m", "launcher.node")

    def __init__(self) -> None:
        self._asked: dict[str, tuple[float, dict[str, NodeFate]]] = {}  # run id -> (when, fates)

    def node_env_extra(self, spec: Spec) -> dict[str, str]:
        url = endpoint("objectStorage", dict(_infra(spec).endpoints))
        return {NODE_OBJECT_STORAGE_ENDPOINT: url} if url else {}

    def requests(self, plan: Plan) -> list[Request]:
        return bodies.requests(plan, _infra(plan.spec))

    def dryrun(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> DryRun:
        request = super().dryrun(spec, run_id=run_id, resume_from=resume_from)
        mode = bodies.launch_mode(_infra(spec))
        notes = (f"launch mode {mode}: " + ("one multi-node job run, a node group per spec group" if mode == "native"
                                           else "one job run per node"),)
        notes += tuple(f"run would refuse: {problem}" for problem in self._problems(request))
        return DryRun(request.backend, request.plan, request.requests, request.notes + notes)

    def _problems(self, dryrun: DryRun) -> list[str]:
        infra = _infra(dryrun.plan.spec)
        problems = bodies.limit_problems(dryrun.plan)
        if bodies.launch_mode(infra) == "perNode" and len(dryrun.plan.nodes) > 1 and not infra.subnet_id:
            problems.append("per-node job runs reach each other only on a subnet of yours: set subnetId, or use "
                            "launchMode: native")
        if dryrun.plan.image and dryrun.plan.image.tag == dryrun.plan.nodes[0].image and "@sha256:" not in \
                dryrun.plan.image.tag:
            problems.append('"@image" must be pushed for OCI to pull it: launcher build -f SPEC --tag '
                            "REGION.ocir.io/NAMESPACE/REPO:TAG --push")
        return problems

    def check(self, dryrun: DryRun) -> list[str]:
        problems = self._problems(dryrun)
        if problems:
            raise BadInput("\n".join(problems))
        return []

    def schedule(self, dryrun: DryRun, state_dir: str) -> dict[str, Any]:
        from launcher.backends.oci import service

        infra = _infra(dryrun.plan.spec)
        client = service.data_science(dict(infra.endpoints))
        ids = service.submit(client, dryrun.plan.run_id, dryrun.requests)
        return {**ids, "mode": bodies.launch_mode(infra), "endpoints": dict(infra.endpoints),
                "compartment": infra.compartment_id, "log_group": infra.log_group_id, "log": infra.log_id,
                "delete_job": infra.delete_job}

    def node_fates(self, info: RunInfo) -> dict[str, NodeFate]:
        asked = self._asked.get(info.run_id)
        if asked and time.monotonic() - asked[0] < SERVICE_POLL_SECONDS:
            return asked[1]
        fates = self._ask_service(info)
        self._asked[info.run_id] = (time.monotonic(), fates)
        return fates

    def _ask_service(self, info: RunInfo) -> dict[str, NodeFate]:
        from launcher.backends.oci import service

        ids = info.backend_ids
        if not ids.get("job_runs"):
            return {}
        try:
            client = service.data_science(ids.get("endpoints") or {})
        except Exception:  # noqa: BLE001 - no SDK or credentials here: status shows the work dir alone
            return {}
        runs = _read_runs(client, ids)
        if ids.get("mode") == "perNode":
            return {node: self._with_logs(info, {node: _fate(run, None)}, run)[node] for node, run in runs.items()}
        [run] = runs.values() if runs else [None]
        if run is None:
            return {}
        groups = {group.name: group for group in run.node_group_details_list or []}
        fates = {}
        for node in info.nodes:
            names = [name for name in groups if node == name or node.startswith(f"{name}-")]
            fates[node] = _fate(run, groups[max(names, key=len)] if names else None)
        return self._with_logs(info, fates, run)  # one search for the run: its nodes share its log

    def _with_logs(self, info: RunInfo, fates: dict[str, NodeFate], run: Any) -> dict[str, NodeFate]:
        """The run's nodes that ended, with its last lines from OCI Logging (searched once, only when some
        node ended and the run did not succeed), for a node that may have written nothing to the work dir."""
        from dataclasses import replace

        ended = [node for node, fate in fates.items() if not fate.running]
        lines = self._logged_lines(info, run) if ended and run.lifecycle_state != "SUCCEEDED" else ()
        return fates | {node: replace(fates[node], last_output=lines) for node in ended if lines}

    def _logged_lines(self, info: RunInfo, run: Any) -> tuple[str, ...]:
        """The job run's last lines in OCI Logging (none when logging is not configured or unreachable)."""
        from launcher.backends.oci import service

        ids = info.backend_ids
        if not (ids.get("log_group") and ids.get("log")):
            return ()
        try:
            client = service.log_search(ids.get("endpoints") or {})
            lines = service.search_logs(client, ids["compartment"], ids["log_group"], ids["log"], run.id,
                                        run.time_accepted, datetime.datetime.now(datetime.timezone.utc))
        except Exception:  # noqa: BLE001 - logs are a help here, not a requirement
            return ()
        return tuple(line for line in lines if line.strip())[-20:]

    def release(self, info: RunInfo, *, discard: bool = False) -> list[str]:
        """With ``deleteJob: true``: delete the job (and its runs) once the run is seen to end."""
        from launcher.backends.oci import service
        from launcher.errors import LauncherError
        from launcher.runs import state

        ids = info.backend_ids
        if not ids.get("delete_job") or not ids.get("job") or ids.get("job_deleted"):
            return []
        try:
            outcome = service.cleanup(service.data_science(ids.get("endpoints") or {}), ids["job"], [])
        except LauncherError:  # no credentials here: the job stays, and a later watch or cancel tries again
            return []
        if outcome.startswith("could not"):
            return []
        ids["job_deleted"] = True
        state.save(info)
        return [f"job {ids['job']}"]

    def stop(self, info: RunInfo, grace: float) -> list[str]:
        from launcher.backends.oci import service

        ids = info.backend_ids
        if not ids.get("job_runs"):
            return []
        client = service.data_science(ids.get("endpoints") or {})
        deadline = time.monotonic() + grace
        runs = _read_runs(client, ids)
        # The nodes saw the cancel marker; give them the grace to end (polling the service: no events).
        while time.monotonic() < deadline and not all(run.lifecycle_state in service.TERMINAL
                                                      for run in runs.values()):
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            runs = _read_runs(client, ids)
        forced = service.cancel(client, runs)
        self.release(info)
        return forced


def _read_runs(client: Any, ids: dict[str, Any]) -> dict[str, Any]:
    from launcher.backends.oci import service

    return service.job_runs(client, ids["job_runs"], compartment=ids.get("compartment"), job=ids.get("job"))


def _fate(run: Any, group: Any) -> NodeFate:
    """A node as the service sees it: its run's lifecycle, refined by its node group's where there is one."""
    state = run.lifecycle_state
    if group is not None and group.lifecycle_state == "FAILED":
        return NodeFate(False, None, f"OCI: node group {group.name} failed: {group.lifecycle_details or 'no details'}")
    if state in ("ACCEPTED", "IN_PROGRESS", "CANCELING"):
        return NodeFate(True)
    if state == "NEEDS_ATTENTION":
        return NodeFate(True, reason=f"OCI: job run needs attention: {run.lifecycle_details or ''}")
    exit_code = 0 if state == "SUCCEEDED" else None
    finished = getattr(run, "time_finished", None)  # when the service saw it end: the node's place in time
    return NodeFate(False, exit_code, f"OCI: job run {state.lower()}" + (
        f": {run.lifecycle_details}" if run.lifecycle_details else ""),
        ended_at=finished.timestamp() if finished else None)
