"""A docker run on the engine: create its network and containers (all or nothing), find them, remove them."""

from __future__ import annotations

from typing import Any, Sequence

from launcher.backends.docker.containers import NODE_LABEL, RUN_LABEL, network_name
from launcher.dockerengine import api_error_text
from launcher.errors import BackendError
from launcher.node.exits import killed_by


def describe_exit(exit_code: int, oom_killed: bool) -> str:
    """Why a node container ended without reporting, in the words of ``docker inspect``."""
    if oom_killed:
        return f"node container was killed by the out-of-memory killer (exit {exit_code})"
    if exit_code == killed_by(9):
        return f"node container was killed (SIGKILL, exit {exit_code}: docker kill, or memory)"
    return f"node container exited with status {exit_code} without reporting"


def create_run(client: Any, run_id: str, specs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Create the run's network (when it has one) and start one container per spec; node -> container id.

    All or nothing: when the engine refuses any of it, what was created is removed again.
    """
    import docker.errors

    created: list[Any] = []
    try:
        if any("network" in spec for spec in specs):
            client.networks.create(network_name(run_id), driver="bridge", labels={RUN_LABEL: run_id})
        for spec in specs:
            options = {key: value for key, value in spec.items() if key != "detach"}
            created.append(client.containers.create(**options))
        for container in created:
            container.start()
    except docker.errors.DockerException as exc:
        node = specs[len(created)]["labels"][NODE_LABEL] if len(created) < len(specs) else "?"
        remove_run(client, run_id)
        raise BackendError(f"the Docker engine refused the run (at node {node}): "
                           f"{api_error_text(exc)}; nothing is left running") from None
    return {container.labels[NODE_LABEL]: container.id for container in created}


def run_containers(client: Any, run_id: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})


def remove_run(client: Any, run_id: str) -> list[str]:
    """Remove the run's containers (forcibly) and its network; return the nodes whose containers were removed."""
    import docker.errors

    removed = []
    for container in run_containers(client, run_id):
        try:
            container.remove(force=True)
            removed.append(container.labels.get(NODE_LABEL, container.name))
        except docker.errors.NotFound:
            continue
    for network in client.networks.list(filters={"label": f"{RUN_LABEL}={run_id}"}):
        try:
            network.remove()
        except docker.errors.NotFound:
            continue
    return removed
