"""Docker containers, one per node; also the source of the compose file (:mod:`launcher.compose`)."""

from __future__ import annotations

import os
from typing import Any

from launcher.backends.base import Backend, Request
from launcher.plan import Plan
from launcher.spec.model import DockerInfra, Spec
from launcher.workdirs import resolve_local, scheme

CONTAINER_WORK_DIR = "/launcher/workdir"
DEFAULT_WORK_DIR = "./work_dir"  # next to the spec, as in ADS's compose example
# Read-only credential mounts, by work dir scheme; the node image runs as root.
CREDENTIALS = {"oci": ("~/.oci", "/root/.oci"), "s3": ("~/.aws", "/root/.aws")}


class DockerBackend(Backend):
    name = "docker"
    node_command = ("python", "-m", "launcher.node")

    def work_dir(self, spec: Spec) -> tuple[str, list[str]]:
        url = spec.cluster.work_dir or DEFAULT_WORK_DIR
        if scheme(url) == "file":
            host = resolve_local(url, spec.base_dir)
            return CONTAINER_WORK_DIR, [f"host directory {host} is mounted at {CONTAINER_WORK_DIR}"]
        return url, []

    def requests(self, plan: Plan) -> list[Request]:
        return [Request("containers.run", spec["name"], spec) for spec in container_specs(plan)]


def mounts(plan: Plan) -> list[str]:
    """Bind mounts as ``SOURCE:TARGET[:ro]``: the local work dir read-write, credentials read-only."""
    spec = plan.spec
    result = []
    wanted = spec.cluster.work_dir or DEFAULT_WORK_DIR
    if plan.work_dir == CONTAINER_WORK_DIR:
        result.append(f"{resolve_local(wanted, spec.base_dir)}:{CONTAINER_WORK_DIR}")
    credentials = CREDENTIALS.get(scheme(wanted))
    if credentials:
        result.append(f"{os.path.expanduser(credentials[0])}:{credentials[1]}:ro")
    if isinstance(spec.infra, DockerInfra):
        result += spec.infra.volumes
    return result


def container_specs(plan: Plan) -> list[dict[str, Any]]:
    """Keyword arguments for docker-py's ``containers.run``, one per node."""
    infra = plan.spec.infra if isinstance(plan.spec.infra, DockerInfra) else DockerInfra()
    volumes = mounts(plan)
    specs = []
    for node in plan.nodes:
        spec: dict[str, Any] = {
            "name": f"{plan.run_id}-{node.name}",
            "image": node.image,
            "command": list(node.command),
            "environment": dict(node.env),
            "network_mode": infra.network,
            "volumes": volumes,
            "labels": {"launcher.run-id": plan.run_id, "launcher.node": node.name},
            "detach": True,
        }
        if infra.shm_size:
            spec["shm_size"] = infra.shm_size
        specs.append(spec)
    return specs
