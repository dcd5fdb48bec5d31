"""Docker containers, one per node, on a network of the run's own; also the source of ``launcher compose``.

The client creates the containers (:mod:`.launch`) and hands them to a detached supervisor
(:mod:`.supervisor`) that records how each ended and removes them when the run is over. The
Docker SDK is imported only by the verbs that talk to the engine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

from launcher.backends.base import Backend, DryRun, NodeFate, Request
from launcher.backends.docker.containers import (CONTAINER_WORK_DIR, DEFAULT_WORK_DIR, NODE_LABEL,
                                                 container_specs, infra_of, network_name, network_options,
                                                 unreachable_s3_endpoint)
from launcher.errors import BackendError, BadInput
from launcher.gpus import node_gpu_shares
from launcher.plan import Plan
from launcher.runs.state import RunInfo
from launcher.runs.supervision import EndRecorder, ProcessRef
from launcher.spec.model import Spec
from launcher.workdirs import resolve_local, scheme


SUPERVISOR_CLEANUP_SECONDS = 30  # for a supervisor to save the last consoles and remove the containers


class DockerBackend(Backend):
    name = "docker"
    node_command = ("python", "-m", "launcher.node")
    keep = False  # keep the containers after the run (``run --keep``)

    def work_dir(self, spec: Spec) -> tuple[str, list[str]]:
        url = spec.cluster.work_dir or DEFAULT_WORK_DIR
        if scheme(url) == "file":
            host = resolve_local(url, spec.base_dir)
            return CONTAINER_WORK_DIR, [f"host directory {host} is mounted at {CONTAINER_WORK_DIR}"]
        return url, []

    def client_work_dir(self, plan: Plan) -> str:
        if plan.work_dir == CONTAINER_WORK_DIR:
            return resolve_local(plan.spec.cluster.work_dir or DEFAULT_WORK_DIR, plan.spec.base_dir)
        return plan.work_dir

    one_machine = True  # the nodes are containers of one engine, on its machine

    def node_env_extra(self, spec: Spec) -> dict[str, str]:
        # On the engine machine's network every node is on this one machine; on the run's own
        # network each node advertises its address there (the default route's source address).
        return {"LAUNCHER_NODE_ADDRESS": "127.0.0.1"} if infra_of(spec).network == "host" else {}

    def node_devices(self, spec: Spec) -> tuple[list[dict[str, str]] | None, list[str]]:
        _, note = node_gpu_shares(spec)  # given as device requests (see requests), not as env
        return None, [note] if note else []

    def requests(self, plan: Plan) -> list[Request]:
        """The engine calls in order: the run's network (unless on the host's), then one container per node
        (created, then started)."""
        shares, _ = node_gpu_shares(plan.spec)
        network = [] if infra_of(plan.spec).network == "host" else [
            Request("networks.create", network_name(plan.run_id), network_options(plan.run_id))]
        return network + [Request("containers.create", spec["name"], spec) for spec in container_specs(plan, shares)]

    def plan(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> tuple[Plan, list[str]]:
        plan, notes = super().plan(spec, run_id=run_id, resume_from=resume_from)
        if self.keep:
            notes.append(f"--keep: the containers stay after the run; remove them with: launcher clean {plan.run_id}")
        return plan, notes

    def check(self, dryrun: DryRun) -> list[str]:
        from launcher.dockerengine import connect
        from launcher.image.identity import stale_note

        problem = unreachable_s3_endpoint(dryrun.plan, os.environ)
        if problem:
            raise BadInput(problem)
        client = connect()
        built = dryrun.plan.image.tag if dryrun.plan.image else None
        for image in sorted({node.image for node in dryrun.plan.nodes}):
            _require_image(client, image, built=image == built)
        stale = stale_note(dryrun.plan.spec) if built in {node.image for node in dryrun.plan.nodes} else None
        return [stale] if stale else []

    def schedule(self, dryrun: DryRun, state_dir: str) -> dict[str, Any]:
        from launcher.backends.docker.launch import create_run
        from launcher.dockerengine import connect
        from launcher.runs.supervision import start_supervisor

        client = connect()
        plan = dryrun.plan
        since = time.time()
        containers = create_run(client, plan.run_id, dryrun.requests)
        specs = {request.body["labels"][NODE_LABEL]: request.body for request in dryrun.requests
                 if request.operation == "containers.create"}  # for replacements; on stdin, never on disk
        order = {"run_id": plan.run_id, "containers": containers, "specs": specs, "keep": self.keep, "since": since}
        supervisor = start_supervisor("launcher.backends.docker.supervisor", state_dir,
                                      f"{self.client_work_dir(plan).rstrip('/')}/{plan.run_id}", order)
        network = None if infra_of(plan.spec).network == "host" else network_name(plan.run_id)
        return {"containers": containers, "network": network, "keep": self.keep, **supervisor}

    def node_fates(self, info: RunInfo) -> dict[str, NodeFate]:
        from launcher.runs.supervision import recorded_fate

        fates = {name: fate for name in info.nodes if (fate := recorded_fate(info.state_dir, name)) is not None}
        supervisor = _supervisor(info)
        if len(fates) == len(info.nodes) or (supervisor is not None and supervisor.running()):
            return fates | {name: NodeFate(True) for name in _recorded_containers(info) if name not in fates}
        return fates | self._take_over(info, exclude=set(fates))

    def _take_over(self, info: RunInfo, exclude: set[str]) -> dict[str, NodeFate]:
        """No supervisor watches the run (it died, or compose started the containers): do its duties.

        A container that ended is recorded as its supervisor would have (console saved, failure
        dated by the engine's FinishedAt), each node by its current (newest) container; once every
        node has ended, the containers and network go, unless the run keeps them (``--keep``, compose).
        A lost node is not replaced here: its env, secrets included, was handed only to the supervisor."""
        import docker.errors

        from launcher.backends.docker.launch import engine_end_time, node_containers, remove_run
        from launcher.backends.docker.supervisor import node_ended
        from launcher.dockerengine import connect
        from launcher.protocol.store import StoreError, WorkDir
        from launcher.runs.supervision import recorded_fate

        try:
            client = connect()
            containers = node_containers(client, info.run_id)
        except (BackendError, docker.errors.DockerException):
            return {}
        fates = {}
        for name in info.nodes:
            if name in exclude:
                continue
            container = containers.get(name)
            if container is None:
                if name in info.backend_ids.get("containers", {}):
                    fates[name] = NodeFate(False, None, "node container is gone and no exit was recorded for it "
                                           "(its supervisor was stopped too)")
                continue  # compose: not started yet
            state = container.attrs["State"]
            if state.get("Running") or state.get("Status") in ("created", "restarting"):
                fates[name] = NodeFate(True)
                continue
            try:
                node_ended(client, EndRecorder(WorkDir(info.run_url)), info.state_dir, name, container.id,
                           int(state.get("ExitCode", -1)), engine_end_time(state))
            except (StoreError, docker.errors.DockerException):  # the next command that looks tries again
                fates[name] = NodeFate(True)
                continue
            fates[name] = recorded_fate(info.state_dir, name) or NodeFate(False, int(state.get("ExitCode", -1)))
        if all(not fate.running for fate in fates.values()) and len(fates) + len(exclude) == len(info.nodes) \
                and not _keeps_containers(info):
            remove_run(client, info.run_id)
        return fates

    def scale_problem(self, info: RunInfo) -> str | None:
        from launcher.backends.docker.supervisor import SUPERVISOR_FILE

        supervisor = _supervisor(info)
        if supervisor is None or not supervisor.running():
            return (f"its supervisor (recorded in {Path(info.state_dir) / SUPERVISOR_FILE}) is not running: every "
                    "node of the run has ended, the supervisor was killed, or compose started the run")
        return None

    def scale(self, info: RunInfo, add: Sequence[str], timeout: float = 60.0) -> list[str]:
        """Ask the run's supervisor (it holds the nodes' env, secrets included) to start containers for ``add``;
        return once ``supervisor.json`` records them all."""
        from launcher.runs.additions import request_nodes

        supervisor = _supervisor(info)
        problem = self.scale_problem(info)
        if supervisor is None or problem:
            raise BackendError(f"cannot add nodes: {problem}")
        return request_nodes(info.state_dir, supervisor, add, lambda: _recorded_containers(info), timeout)

    def release(self, info: RunInfo, *, discard: bool = False) -> list[str]:
        """The run has ended: wait for its supervisor's clean-up, then remove what is left (kept
        containers and compose's too when ``discard``); return the nodes whose containers were removed."""
        from launcher.backends.docker.launch import remove_run
        from launcher.dockerengine import connect
        from launcher.runs.supervision import wait_for_exit

        supervisor = _supervisor(info)
        if supervisor is not None:
            wait_for_exit([supervisor], SUPERVISOR_CLEANUP_SECONDS)
        if _keeps_containers(info) and not discard:
            return []
        try:
            return remove_run(connect(), info.run_id)
        except BackendError:
            return []

    def stop(self, info: RunInfo, grace: float) -> list[str]:
        from launcher.backends.docker.launch import run_containers
        from launcher.dockerengine import connect

        client = connect()
        deadline = time.monotonic() + grace
        forced = []
        for container in run_containers(client, info.run_id):
            if not _wait(container, deadline - time.monotonic()) and _kill(container):
                forced.append(container.labels.get(NODE_LABEL, container.name))
        self.release(info)
        return sorted(forced)


def _keeps_containers(info: RunInfo) -> bool:
    """``run --keep`` runs and compose runs (``docker-compose down`` is theirs) keep their containers."""
    return bool(info.backend_ids.get("keep") or info.backend_ids.get("compose"))


def _require_image(client: Any, image: str, *, built: bool) -> None:
    """The image must be on the engine: one `launcher build` makes is never pulled, others are pulled."""
    import docker.errors

    from launcher.dockerengine import api_error_text

    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    if built and "@sha256:" not in image:  # a local build only; a pushed one is pulled by its digest
        raise BadInput(f'image {image} ("@image") has not been built yet on this engine; build it first with: '
                       "launcher build -f SPEC")
    try:
        client.images.pull(image)
    except docker.errors.DockerException as exc:
        raise BackendError(f"image {image} is not on this engine and pulling it failed: {api_error_text(exc)}") \
            from None


def _wait(container: Any, timeout: float) -> bool:
    """Whether the container has exited within ``timeout`` seconds."""
    import docker.errors
    import requests.exceptions

    try:
        container.reload()
    except docker.errors.NotFound:  # ended, and already removed by the supervisor
        return True
    if container.status not in ("running", "restarting", "paused"):
        return True
    try:
        container.wait(timeout=max(timeout, 0.1))
        return True
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
        return False


def _kill(container: Any) -> bool:
    """Kill a container still running after the grace; False when it ended (or was removed) meanwhile."""
    import docker.errors

    try:
        container.kill()
        return True
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # "is not running": it exited between the wait and the kill
            return False
        raise


def _supervisor_record(info: RunInfo) -> dict[str, Any]:
    from launcher.backends.docker.supervisor import SUPERVISOR_FILE

    try:
        data = json.loads((Path(info.state_dir) / SUPERVISOR_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _supervisor(info: RunInfo) -> ProcessRef | None:
    try:
        return ProcessRef(**_supervisor_record(info)["supervisor"])
    except (KeyError, TypeError):
        return None


def _recorded_containers(info: RunInfo) -> dict[str, str]:
    """Each node's current container as its supervisor records it (nodes ``launcher scale`` added included);
    info.yaml's containers where it recorded none."""
    return _supervisor_record(info).get("containers") or info.backend_ids.get("containers", {})
