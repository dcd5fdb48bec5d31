"""A docker run on the engine: create its network and containers (all or nothing), find them, remove them."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from launcher.backends.base import Request
from launcher.backends.docker.containers import INCARNATION_LABEL, NODE_LABEL, RUN_LABEL
from launcher.dockerengine import api_error_text
from launcher.errors import BackendError
from launcher.protocol.exits import killed_by


def describe_exit(exit_code: int, oom_killed: bool) -> str:
    """Why a node container ended without reporting, in the words of ``docker inspect``."""
    if oom_killed:
        return f"node container was killed by the out-of-memory killer (exit {exit_code})"
    if exit_code == killed_by(9):
        return f"node container was killed (SIGKILL, exit {exit_code}: docker kill, or memory)"
    return f"node container exited with status {exit_code} without reporting"


def create_run(client: Any, run_id: str, requests: Sequence[Request]) -> dict[str, str]:
    """Make the calls the dry-run lists (``networks.create``, ``containers.create``), then start the containers;
    return node -> container id.

    All or nothing: when the engine refuses any of it, what was created is removed again.
    """
    import docker.errors

    created: list[Any] = []
    target = "?"
    try:
        for request in requests:
            target = request.target
            if request.operation == "networks.create":
                client.networks.create(**request.body)
            else:
                created.append(client.containers.create(**request.body))
        for container in created:
            target = container.name
            container.start()
    except docker.errors.DockerException as exc:
        remove_run(client, run_id)
        raise BackendError(f"the Docker engine refused the run (at {target}): "
                           f"{api_error_text(exc)}; nothing is left running") from None
    return {container.labels[NODE_LABEL]: container.id for container in created}


def run_containers(client: Any, run_id: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})


def start_container(client: Any, spec: Mapping[str, Any]) -> str:
    """Create and start one more container of a running run (a lost node's replacement, a node ``launcher scale``
    adds); return its id. A container the engine created but would not start is removed again."""
    import docker.errors

    container = client.containers.create(**spec)
    try:
        container.start()
    except docker.errors.DockerException:
        container.remove(force=True)
        raise
    return container.id


def incarnation_of(container: Any) -> int:
    return int(container.labels.get(INCARNATION_LABEL, "0"))


def node_containers(client: Any, run_id: str) -> dict[str, Any]:
    """Each node's current container: the newest incarnation (a replaced node's dead containers stay until
    the run's clean-up)."""
    current: dict[str, Any] = {}
    for container in sorted(run_containers(client, run_id), key=incarnation_of):
        current[container.labels.get(NODE_LABEL)] = container
    return current


def remove_run(client: Any, run_id: str) -> list[str]:
    """Remove the run's containers (forcibly) and its network; return what was removed, as the user would name it."""
    import docker.errors

    removed = []
    for container in run_containers(client, run_id):
        try:
            container.remove(force=True)
            removed.append(f"container {container.name}")
        except docker.errors.APIError:  # gone, or being removed by another command (409) at the same time
            continue
    for network in client.networks.list(filters={"label": f"{RUN_LABEL}={run_id}"}):
        try:
            network.remove()
            removed.append(f"network {network.name}")
        except docker.errors.APIError:  # gone, or its containers are still being removed: the next look does it
            continue
    return removed


def engine_end_time(state: dict[str, Any]) -> float:
    """When the engine saw the container end (``State.FinishedAt``, RFC 3339 with nanoseconds), as a Unix time."""
    finished = str(state.get("FinishedAt") or "")
    stamp, _, fraction = finished.rstrip("Z").partition(".")
    try:
        whole = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return time.time()
    return whole + (float(f"0.{fraction[:9]}") if fraction.isdigit() else 0.0)
