"""The containers of a docker run, as docker-py ``containers.run`` arguments. Pure: no engine, no SDK.

The same values are printed by ``--dry-run``, sent by ``run`` and turned into services by
``launcher compose`` (:mod:`launcher.compose`).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from launcher.plan import Plan
from launcher.spec.model import DockerInfra, Spec
from launcher.workdirs import resolve_local, scheme

CONTAINER_WORK_DIR = "/launcher/workdir"
DEFAULT_WORK_DIR = "./work_dir"  # next to the spec, as in ADS's compose example
RUN_LABEL = "launcher.run-id"
NODE_LABEL = "launcher.node"
# Read-only credential mounts, by work dir scheme; the node image runs as root.
CREDENTIALS = {"oci": ("~/.oci", "/root/.oci"), "s3": ("~/.aws", "/root/.aws")}


def infra_of(spec: Spec) -> DockerInfra:
    return spec.infra if isinstance(spec.infra, DockerInfra) else DockerInfra()


def network_name(run_id: str) -> str:
    """The per-run bridge network: the nodes reach each other on it, and nothing else shares it."""
    return f"launcher-{run_id}"


def hostname(node: str) -> str:
    return node[:63].rstrip("-.") or "node"


def mounts(plan: Plan) -> list[str]:
    """Bind mounts as ``SOURCE:TARGET[:MODE]``: the local work dir read-write, credentials read-only,
    then the spec's own volumes (relative sources are relative to the spec file)."""
    spec = plan.spec
    result = []
    wanted = spec.cluster.work_dir or DEFAULT_WORK_DIR
    if plan.work_dir == CONTAINER_WORK_DIR:
        result.append(f"{resolve_local(wanted, spec.base_dir)}:{CONTAINER_WORK_DIR}")
    credentials = CREDENTIALS.get(scheme(wanted))
    if credentials:
        result.append(f"{os.path.expanduser(credentials[0])}:{credentials[1]}:ro")
    for volume in infra_of(spec).volumes:
        source, _, rest = volume.partition(":")
        if source.startswith((".", "~")):  # a path, not a named volume
            source = resolve_local(source, spec.base_dir)
        result.append(f"{source}:{rest}")
    return result


def gpu_request(devices: str) -> dict[str, Any]:
    """A device request for these host GPU ids (the engine's nvidia runtime renumbers them from 0 inside)."""
    return {"Driver": "nvidia", "DeviceIDs": devices.split(","), "Capabilities": [["gpu"]]}


def container_specs(plan: Plan, gpu_shares: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Keyword arguments for docker-py's ``containers.run``, one per node.

    ``gpu_shares``: host GPU ids per node ("0,1"; "" for none), from :func:`launcher.gpus.node_gpu_shares`.
    """
    infra = infra_of(plan.spec)
    volumes = mounts(plan)
    specs = []
    for index, node in enumerate(plan.nodes):
        spec: dict[str, Any] = {
            "name": f"{plan.run_id}-{node.name}",
            "hostname": hostname(node.name),
            "image": node.image,
            "command": list(node.command),
            "environment": dict(node.env),
            "volumes": volumes,
            "labels": {RUN_LABEL: plan.run_id, NODE_LABEL: node.name},
            "init": True,  # an init process reaps torchrun's children and passes signals on
            "detach": True,
        }
        if infra.network == "host":
            spec["network_mode"] = "host"
        else:
            spec["network"] = network_name(plan.run_id)
        if infra.shm_size:
            spec["shm_size"] = infra.shm_size
        if gpu_shares and gpu_shares[index]:
            spec["device_requests"] = [gpu_request(gpu_shares[index])]
        specs.append(spec)
    return specs
