"""The containers of a docker run, as docker-py ``containers.create`` arguments. Pure: no engine, no SDK.

The same values are printed by ``--dry-run``, sent by ``run`` and turned into services by
``launcher compose`` (:mod:`launcher.compose`).
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any, Mapping, Sequence
from urllib.parse import urlparse

from launcher.plan import Plan
from launcher.runs.additions import added_node_env
from launcher.spec.model import DockerInfra, Spec
from launcher.workdirs import resolve_local, scheme

CONTAINER_WORK_DIR = "/launcher/workdir"
DEFAULT_WORK_DIR = "./work_dir"  # next to the spec, as in ADS's compose example
RUN_LABEL = "launcher.run-id"
NODE_LABEL = "launcher.node"
INCARNATION_LABEL = "launcher.incarnation"  # on a replacement container: which one (the first container has none)
# Read-only credential mounts, by work dir scheme, made only where the directory exists; the image runs as root.
CREDENTIALS = {"oci": ("~/.oci", "/root/.oci"), "s3": ("~/.aws", "/root/.aws")}
# How this machine's S3 client is set up, passed on to the nodes of an s3:// work dir (botocore's and
# fsspec's variables); a node's own env (the spec, --env) wins over them.
S3_CLIENT_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION",
                       "AWS_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
S3_ENDPOINT_VARIABLES = ("FSSPEC_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def infra_of(spec: Spec) -> DockerInfra:
    return spec.infra if isinstance(spec.infra, DockerInfra) else DockerInfra()


def network_name(run_id: str) -> str:
    """The per-run bridge network: the nodes reach each other on it, and nothing else shares it."""
    return f"launcher-{run_id}"


def network_options(run_id: str) -> dict[str, Any]:
    """docker-py's ``networks.create`` arguments for the run's network."""
    return {"name": network_name(run_id), "driver": "bridge", "labels": {RUN_LABEL: run_id}}


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
    if credentials and os.path.isdir(os.path.expanduser(credentials[0])):  # the engine would create it, as root
        result.append(f"{os.path.expanduser(credentials[0])}:{credentials[1]}:ro")
    for volume in infra_of(spec).volumes:
        source, _, rest = volume.partition(":")
        if source.startswith((".", "~")):  # a path, not a named volume
            source = resolve_local(source, spec.base_dir)
        result.append(f"{source}:{rest}")
    return result


def s3_client_env(spec: Spec, environ: Mapping[str, str]) -> dict[str, str]:
    """The S3 client settings of this machine that nodes of an s3:// work dir get (empty for other work dirs)."""
    if scheme(spec.cluster.work_dir or DEFAULT_WORK_DIR) != "s3":
        return {}
    return {name: value for name, value in environ.items()
            if name in S3_CLIENT_VARIABLES or name.startswith("FSSPEC_S3_")}


def unreachable_s3_endpoint(plan: Plan, environ: Mapping[str, str]) -> str | None:
    """Why the nodes could not reach the S3 endpoint: a loopback address seen from the run's own network."""
    if infra_of(plan.spec).network == "host" or not plan.nodes:
        return None
    env = {**s3_client_env(plan.spec, environ), **plan.nodes[0].env}
    endpoint = next((env[name] for name in S3_ENDPOINT_VARIABLES if env.get(name)), None)
    host = urlparse(endpoint).hostname if endpoint else None
    if host is None or not _is_loopback(host):
        return None
    return (f"the S3 endpoint {endpoint} is a loopback address of this machine: containers on the run's own "
            "network cannot reach it. Run the nodes on this machine's network (infrastructure spec "
            "`network: host`, or --set spec.infrastructure.spec.network=host), or give an endpoint they can reach")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gpu_request(devices: str) -> dict[str, Any]:
    """A device request for these host GPU ids (the engine's nvidia runtime renumbers them from 0 inside)."""
    return {"Driver": "nvidia", "DeviceIDs": devices.split(","), "Capabilities": [["gpu"]]}


def container_specs(plan: Plan, gpu_shares: Sequence[str] | None = None,
                    environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Keyword arguments for docker-py's ``containers.create``, one per node.

    ``gpu_shares``: host GPU ids per node ("0,1"; "" for none), from :func:`launcher.gpus.node_gpu_shares`.
    ``environ``: this machine's environment, for the S3 client settings (default ``os.environ``).
    """
    infra = infra_of(plan.spec)
    volumes = mounts(plan)
    s3_env = s3_client_env(plan.spec, os.environ if environ is None else environ)
    specs = []
    for index, node in enumerate(plan.nodes):
        spec: dict[str, Any] = {
            "name": f"{plan.run_id}-{node.name}",
            "image": node.image,
            "command": list(node.command),
            "environment": {**s3_env, **node.env},
            "volumes": volumes,
            "labels": {RUN_LABEL: plan.run_id, NODE_LABEL: node.name},
            "init": True,  # an init process reaps torchrun's children and passes signals on
        }
        if infra.network == "host":  # the host's own name: on the host network a node name would not resolve
            spec["network_mode"] = "host"
        else:
            spec["hostname"] = hostname(node.name)
            spec["network"] = network_name(plan.run_id)
        if infra.shm_size:
            spec["shm_size"] = infra.shm_size
        if gpu_shares and gpu_shares[index]:
            spec["device_requests"] = [gpu_request(gpu_shares[index])]
        specs.append(spec)
    return specs


def replacement_spec(original: Mapping[str, Any], incarnation: int) -> dict[str, Any]:
    """The ``containers.create`` arguments of a lost node's replacement: its first container's (same image,
    mounts, devices, network and hostname), named apart from it (names are unique on an engine, and the dead
    container stays until the run's clean-up), with the incarnation in its env and labels."""
    return {**original, "name": f"{original['name']}-r{incarnation}",
            "environment": {**original["environment"], "LAUNCHER_NODE_INCARNATION": str(incarnation)},
            "labels": {**original["labels"], INCARNATION_LABEL: str(incarnation)}}


def added_node_spec(template: Mapping[str, Any], run_id: str, name: str, gpus: str | None = None) -> dict[str, Any]:
    """The ``containers.create`` arguments of a node ``launcher scale`` adds: those of the run's last node
    (``template``: same image, mounts, network), under the new node's name, told groups that hold it; with the
    host GPUs ``gpus`` ("" none; None: the template's devices)."""
    spec = {**template, "name": f"{run_id}-{name}", "environment": added_node_env(template["environment"], name),
            "labels": {**template["labels"], NODE_LABEL: name}}
    if "hostname" in template:
        spec["hostname"] = hostname(name)
    if gpus is not None:
        spec.pop("device_requests", None)
        if gpus:
            spec["device_requests"] = [gpu_request(gpus)]
    return spec


def gpu_share(spec: Mapping[str, Any]) -> str | None:
    """The host GPUs a container spec requests ("0,1"), or None when it requests none (launcher chose none, or
    leaves devices alone)."""
    requests = spec.get("device_requests") or []
    return ",".join(requests[0]["DeviceIDs"]) if requests else None
