"""OCI Data Science Jobs: a native multi-node job run, or one job run per node (see :mod:`.bodies`).

The service runs the nodes; the work dir carries the protocol as on every backend. What the
service knows of each node (its lifecycle, why it never started) is merged into ``status`` and
``watch`` through :meth:`OciBackend.node_fates`. The SDK is imported only by verbs that call it.
"""

from __future__ import annotations

import datetime
import functools
import json
import sys
import time
from dataclasses import replace
from typing import Any, Sequence

from launcher.backends.base import Backend, DryRun, NodeFate, Request
from launcher.backends.oci import bodies, logs
from launcher.backends.oci.notes import recovery_notes
from launcher.errors import BadInput
from launcher.node.engines.ocicluster import NETWORK_ENDPOINT, SUBNET
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
# The main's port where the spec sets none: the port ADS and its documentation use for PyTorch, so the
# security lists written for ADS jobs let it through (the spec's `port` still decides; 0: a free one).
DEFAULT_PORT = 29400
RECOVERY = "LAUNCHER_RECOVERY"  # the policy, which makes the nodes train in membership rounds
# Native static runs: the policy the client applies between attempts. Their nodes fail fast: with no replica
# replaced alone, a round could never be complete again after a loss (see .attempts).
RETRY = "LAUNCHER_RETRY"
INCARNATIONS = "oci/incarnations"  # where the work dir records lost per-node job runs and their replacements


class OciBackend(Backend):
    name = "oci"
    node_command = ("python", "-m", "launcher.node")

    def __init__(self) -> None:
        self._asked: dict[str, tuple[float, dict[str, NodeFate]]] = {}  # run id -> (when, fates)
        self._logged: dict[str, logs.Output] = {}  # job run id -> what Logging held once it had settled

    def node_env_extra(self, spec: Spec) -> dict[str, str]:
        infra = _infra(spec)
        extra = {}
        if "port" not in spec.data.get("spec", {}).get("cluster", {}).get("spec", {}):
            extra["LAUNCHER_MASTER_PORT"] = str(DEFAULT_PORT)
        if bodies.launch_mode(infra) == "perNode" and infra.subnet_id and spec.cluster.node_count > 1:
            extra[SUBNET] = infra.subnet_id  # its CIDR tells each node which of its interfaces is on the subnet
            extra[NETWORK_ENDPOINT] = endpoint("virtualNetwork", dict(infra.endpoints)) or ""
        extra[NODE_OBJECT_STORAGE_ENDPOINT] = endpoint("objectStorage", dict(infra.endpoints)) or ""
        return {name: value for name, value in extra.items() if value}

    def built_image(self, spec: Spec) -> str | None:
        """The pushed image as the service documents references: ``REGION.ocir.io/NS/REPO:TAG@sha256:...``."""
        from launcher.image import records

        record = records.load(spec.source)
        return bodies.ocir_reference(record.tag, record.pushed) if record else None

    def plan(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> tuple[Plan, list[str]]:
        plan, notes = super().plan(spec, run_id=run_id, resume_from=resume_from)
        if bodies.launch_mode(_infra(spec)) != "native" or spec.cluster.elastic or not spec.cluster.recovery:
            return plan, notes
        nodes = tuple(replace(node, env={(RETRY if name == RECOVERY else name): value
                                         for name, value in node.env.items()}) for node in plan.nodes)
        return replace(plan, nodes=nodes), notes

    def requests(self, plan: Plan) -> list[Request]:
        return bodies.requests(plan, _infra(plan.spec))

    def dryrun(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> DryRun:
        request = super().dryrun(spec, run_id=run_id, resume_from=resume_from)
        mode = bodies.launch_mode(_infra(spec))
        notes = (f"launch mode {mode}: " + (_layout(request.plan) if mode == "native" else "one job run per node"),)
        notes += recovery_notes(spec)
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
        mode = bodies.launch_mode(infra)
        groups = {group.name: [node.name for node in group.nodes] for group in bodies.node_groups(dryrun.plan)} \
            if mode == "native" else {}
        env = dryrun.plan.nodes[0].env
        recovery = env.get(RECOVERY) or env.get(RETRY)
        return {**ids, "mode": mode, "node_groups": groups, "endpoints": dict(infra.endpoints),
                "compartment": infra.compartment_id, "delete_job": infra.delete_job,
                "recovery": json.loads(recovery) if recovery else None}

    def node_fates(self, info: RunInfo) -> dict[str, NodeFate]:
        asked = self._asked.get(info.run_id)
        if asked and (time.monotonic() - asked[0] < SERVICE_POLL_SECONDS or
                      asked[1] and not any(fate.running for fate in asked[1].values())):
            return asked[1]  # recent, or every node had ended: the service has nothing new to say
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
        if ids.get("mode") == "perNode":
            return self._per_node_fates(info, client)
        if ids.get("recovery"):
            from launcher.backends.oci import attempts

            return attempts.native_fates(self, info, client)
        return self.native_fates(info, client, next(iter(ids["job_runs"].values())), None)[1]

    def native_fates(self, info: RunInfo, client: Any, job_run: str, work: Any) -> tuple[Any, dict[str, NodeFate]]:
        """The job run ``job_run`` of a native run as the service sees it, and each node's fate in it; in a
        recovering run (``work``: the namespace of its nodes), a replica that died without reporting is recorded
        lost, as its round's end (a replica is not replaced alone)."""
        ids = info.backend_ids
        runs = _read_runs(client, {**ids, "job_runs": {info.run_id: job_run}})
        [run] = runs.values() if runs else [None]
        if run is None:
            return None, {}
        groups = {group.name: group for group in run.node_group_details_list or []}
        holder = {node: name for name, nodes in (ids.get("node_groups") or {}).items() for node in nodes}
        fates = {node: _fate(run, groups.get(holder.get(node, ""))) for node in info.nodes}
        fates = self._with_logs(info, fates, run, client)  # one search for the run: its nodes share its log
        if work is None:
            return run, fates
        from launcher.runs import incarnations

        return run, incarnations.recover(work, INCARNATIONS, ids["recovery"], {node: run.id for node in fates},
                                         fates, incarnations.read(work, INCARNATIONS), engine="OCI", unit="job run",
                                         start=None)

    def _per_node_fates(self, info: RunInfo, client: Any) -> dict[str, NodeFate]:
        """Each node's fate from the job run of its newest incarnation; in a recovering run, lost nodes are
        handled as a supervisor would (:mod:`.incarnations`)."""
        from launcher.runs import incarnations

        ids = info.backend_ids
        work = _recovering_work_dir(info)
        records = incarnations.read(work, INCARNATIONS) if work else {}
        runs = _read_runs(client, {**ids, "job_runs": incarnations.current(ids["job_runs"], records)})
        fates = {node: self._with_logs(info, {node: _fate(run, None)}, run, client)[node] for node, run in runs.items()}
        if work is None:
            return fates
        return incarnations.recover(work, INCARNATIONS, ids["recovery"], {node: run.id for node, run in runs.items()},
                                    fates, records, engine="OCI", unit="job run",
                                    start=_replacement_starter(client, info.run_id))

    def _with_logs(self, info: RunInfo, fates: dict[str, NodeFate], run: Any, client: Any) -> dict[str, NodeFate]:
        """The run's nodes that ended, with its last lines from OCI Logging (searched only when some node
        ended and the run did not succeed), for a node that may have written nothing to the work dir; where
        Logging has none, the reason says why."""
        ended = [node for node, fate in fates.items() if not fate.running]
        if not ended or run.lifecycle_state == "SUCCEEDED":
            return fates
        output = self._output(info, run, client)
        if output.lines:
            return fates | {node: replace(fates[node], last_output=output.lines[-20:]) for node in ended}
        return fates | {node: replace(fates[node], reason=f"{fates[node].reason}; {output.note}") for node in ended}

    def _output(self, info: RunInfo, run: Any, client: Any) -> logs.Output:
        """What OCI Logging holds of ``run``; kept once the run has ended and its lines have settled."""
        from launcher.backends.oci import service

        if run.id in self._logged:
            return self._logged[run.id]
        ids = info.backend_ids
        try:
            # A JobRunSummary (per-node runs are listed) has no logDetails: the JobRun has.
            full = run if hasattr(run, "log_details") else client.get_job_run(run.id).data
            search_client = service.log_search(ids.get("endpoints") or {})
        except Exception as exc:  # noqa: BLE001 - no SDK or credentials here, or the run cannot be read
            return logs.Output(note=f"OCI Logging could not be searched: {service.service_message(exc)}")
        output = logs.run_output(search_client, ids["compartment"], full,
                                 now=lambda: datetime.datetime.now(datetime.timezone.utc))
        if run.lifecycle_state in service.TERMINAL:
            self._logged[run.id] = output
        return output

    def release(self, info: RunInfo, *, discard: bool = False) -> list[str]:
        """With ``deleteJob: true``: delete the job (and its runs) once the run is seen to end."""
        from launcher.backends.oci import service
        from launcher.errors import LauncherError
        from launcher.runs import state

        recorded = state.reread(info)  # with the job runs of nodes `scale` added since this command began
        ids = recorded.backend_ids
        if not ids.get("delete_job") or not ids.get("job") or ids.get("job_deleted"):
            return []
        try:
            client = service.data_science(ids.get("endpoints") or {})
        except LauncherError:  # no credentials here: the job stays, and a later watch or cancel tries again
            return []
        outcome = service.cleanup(client, ids["job"], _every_run(recorded))
        if outcome.startswith("could not"):
            print(f"note: {outcome}", file=sys.stderr)
            return []
        info.backend_ids["job_deleted"] = ids["job_deleted"] = True
        if recorded.recorded:
            state.save(recorded)
        return [f"job {ids['job']}"]

    def scale_problem(self, info: RunInfo) -> str | None:
        if info.backend_ids.get("mode") != "perNode":
            return ("the oci backend cannot scale a running run yet in launchMode native, where a job run's replicas "
                    "are fixed when it starts (launchMode: perNode runs can be scaled: a job run per node)")
        return None

    def scale(self, info: RunInfo, add: Sequence[str]) -> list[str]:
        """OCI has no supervisor: this command creates a job run for each added node, like the run's last node's
        (its settings as the service returns them, with the added node's name and groups), and records it."""
        from launcher.backends.oci import service
        from launcher.errors import BackendError
        from launcher.runs import state

        if (problem := self.scale_problem(info)) is not None:
            raise BackendError(problem)
        ids = info.backend_ids
        client = service.data_science(ids.get("endpoints") or {})
        model = _current_runs(info)[info.nodes[-1]]
        for name in add:
            job_run, error = service.run_like(client, model, functools.partial(_added_env, name=name),
                                              display_name=f"{info.run_id}-{name}", tags={"launcher-node": name},
                                              token=service.token(info.run_id, f"run/{name}"))
            if error is not None:
                started = [node for node in add if node in ids["job_runs"]]
                info.nodes = info.nodes + started
                state.save(info)  # what was started is the run's, for status, cancel and clean
                raise BackendError(f"OCI Data Science refused the job run for {name}: {error}"
                                   + (f" (started: {', '.join(started)})" if started else ""))
            ids["job_runs"][name] = job_run
        return list(add)

    def stop(self, info: RunInfo, grace: float) -> list[str]:
        from launcher.backends.oci import service

        ids = info.backend_ids
        if not ids.get("job_runs"):
            return []
        client = service.data_science(ids.get("endpoints") or {})
        deadline = time.monotonic() + grace
        current = {**ids, "job_runs": _current_runs(info)}
        runs = _read_runs(client, current)
        # The nodes saw the cancel marker; give them the grace to end (polling the service: no events).
        while time.monotonic() < deadline and not all(run.lifecycle_state in service.TERMINAL
                                                      for run in runs.values()):
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            runs = _read_runs(client, current)
        forced = service.cancel(client, runs)
        self.release(info)
        return forced


def _layout(plan: Plan) -> str:
    groups = bodies.node_groups(plan)
    if len(groups) == 1 and len(groups[0].spec_groups) > 1:
        return (f"one multi-node job run with one node group, {groups[0].name}, of {len(plan.nodes)} nodes (main and "
                "workers differ only in their names; the service's NODE_RANK 0 is the main)")
    return "one multi-node job run, a node group per spec group (each worker claims its name in the work dir)"


def _recovering_work_dir(info: RunInfo) -> Any:
    """The run's work dir where its lost nodes are recorded, and in per-node mode replaced (a recovering run),
    else None."""
    from launcher.runs.preflight import reading_work_dir

    return reading_work_dir(info.run_url) if info.backend_ids.get("recovery") else None


def _added_env(env: dict[str, str], name: str) -> dict[str, str]:
    """The env of node ``name`` that `launcher scale` adds, from that of the job run it is modelled on: the node
    as first started, whatever incarnation that one was."""
    from launcher.runs.incarnations import INCARNATION
    from launcher.runs.additions import added_node_env

    return {key: value for key, value in added_node_env(env, name).items() if key != INCARNATION}


def _current_runs(info: RunInfo) -> dict[str, str]:
    """target -> the job run that runs it now: per node, its newest incarnation's; else the current attempt's."""
    from launcher.backends.oci import attempts
    from launcher.runs import incarnations

    if info.backend_ids.get("mode") != "perNode":
        return attempts.current_runs(info)
    work = _recovering_work_dir(info)
    return incarnations.current(info.backend_ids["job_runs"], incarnations.read(work, INCARNATIONS) if work else {})


def _every_run(info: RunInfo) -> list[str]:
    """Every job run the run has had: per node, every incarnation's; else every attempt's."""
    from launcher.backends.oci import attempts
    from launcher.runs import incarnations

    if info.backend_ids.get("mode") != "perNode":
        return attempts.every_run(info)
    work = _recovering_work_dir(info)
    return incarnations.every_unit(info.backend_ids.get("job_runs") or {},
                                   incarnations.read(work, INCARNATIONS) if work else {})


def _replacement_starter(client: Any, run_id: str) -> Any:
    """How a lost node of a per-node run is started again: a job run with the lost one's settings, as the service
    returns them, and the incarnation (one ``opc-retry-token`` per node and incarnation: a retry never creates two)."""
    from launcher.backends.oci import service
    from launcher.runs.incarnations import INCARNATION, Incarnation

    def start(claim: Incarnation) -> tuple[str | None, str | None]:
        return service.run_like(
            client, str(claim.lost), lambda env: {**env, INCARNATION: str(claim.number)},
            display_name=f"{run_id}-{claim.node}-{claim.number}", tags={"launcher-incarnation": str(claim.number)},
            token=service.token(run_id, f"run/{claim.node}/{claim.number}"))

    return start


def _read_runs(client: Any, ids: dict[str, Any]) -> dict[str, Any]:
    from launcher.backends.oci import service

    return service.job_runs(client, ids["job_runs"], compartment=ids.get("compartment"), job=ids.get("job"))


def _fate(run: Any, group: Any) -> NodeFate:
    """A node as the service sees it: its run's lifecycle, refined by its node group's where there is one;
    the exit code from the lifecycle details, where the service states one ("... exit code N")."""
    from launcher.backends.oci.service import exit_code

    state = run.lifecycle_state
    finished = getattr(run, "time_finished", None)  # when the service saw it end: the node's place in time
    ended_at = finished.timestamp() if finished else None
    if group is not None and group.lifecycle_state == "FAILED":
        code = exit_code(group.lifecycle_details)
        return NodeFate(False, exit_code(run.lifecycle_details) if code is None else code,
                        f"OCI: node group {group.name} failed: {group.lifecycle_details or 'no details'}",
                        ended_at=ended_at)
    if state in ("ACCEPTED", "IN_PROGRESS", "CANCELING"):
        return NodeFate(True)
    if state == "NEEDS_ATTENTION":
        return NodeFate(True, reason=f"OCI: job run needs attention: {run.lifecycle_details or ''}")
    code = 0 if state == "SUCCEEDED" else exit_code(run.lifecycle_details)
    return NodeFate(False, code, f"OCI: job run {state.lower()}" + (
        f": {run.lifecycle_details}" if run.lifecycle_details else ""), ended_at=ended_at)
