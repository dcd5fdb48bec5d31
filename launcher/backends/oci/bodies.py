"""The REST bodies a run sends to OCI Data Science (camelCase, as the ``oci`` SDK serialises them). Pure.

Two launch modes:

- ``native``: one job whose ``jobNodeConfigurationDetails`` (``MULTI_NODE``) has a node group per
  spec group, and one job run that starts every node. Nodes of a group share one env; each node
  learns its name from the service's ``NODE_GROUP_NAME`` and ``NODE_RANK``.
- ``perNode``: one job and one job run per node, each run with its node's own env.

``--dry-run`` prints these bodies and ``run`` sends these very dicts through the SDK's models.
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from typing import Any

from launcher.backends.base import Request
from launcher.plan import NodeConfig, Plan
from launcher.spec.model import DataScienceJobInfra

JOB_ID_PLACEHOLDER = "<id returned by create_job>"
NATIVE_SINCE = (2, 158)  # the oci SDK release that added multi-node jobs
# Documented service limits: custom env of a job (all values and names) and the container command.
MAX_ENV_CHARACTERS = 20_000
MAX_COMMAND_BYTES = 2_048
REGISTRY_PATH = re.compile(r"^[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+/[a-z0-9._-]+(:[\w.-]+)?(@sha256:[0-9a-f]{64})?$")


def launch_mode(infra: DataScienceJobInfra) -> str:
    """``native`` or ``perNode``: auto is native unless an older SDK (no multi-node jobs) is installed."""
    if infra.launch_mode != "auto":
        return infra.launch_mode
    try:
        version = tuple(int(part) for part in metadata.version("oci").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return "native"
    return "native" if version >= NATIVE_SINCE else "perNode"


def requests(plan: Plan, infra: DataScienceJobInfra) -> list[Request]:
    return (native_requests if launch_mode(infra) == "native" else per_node_requests)(plan, infra)


def _tags(plan: Plan) -> dict[str, str]:
    return {"launcher-run-id": plan.run_id}


def _container(node: NodeConfig) -> dict[str, Any]:
    return {"jobEnvironmentType": "OCIR_CONTAINER", "image": node.image, "cmd": list(node.command), "entrypoint": []}


def _logging(infra: DataScienceJobInfra) -> dict[str, Any]:
    if not infra.log_group_id:
        return {}
    return {"jobLogConfigurationDetails": {
        "enableLogging": True, "enableAutoLogCreation": infra.log_id is None, "logGroupId": infra.log_group_id,
        **({"logId": infra.log_id} if infra.log_id else {})}}


def _shape(infra: DataScienceJobInfra, infrastructure_type: str) -> dict[str, Any]:
    details: dict[str, Any] = {"jobInfrastructureType": infrastructure_type, "shapeName": infra.shape_name,
                               "blockStorageSizeInGBs": infra.block_storage_gb}
    if infrastructure_type == "STANDALONE":
        details["subnetId"] = infra.subnet_id
    shape = {k: v for k, v in (("ocpus", infra.ocpus), ("memoryInGBs", infra.memory_gb)) if v is not None}
    if shape:
        details["jobShapeConfigDetails"] = shape
    return details


def _max_runtime(seconds: int | None) -> dict[str, Any]:
    """OCI stops a job run after maximumRuntimeInMinutes; the nodes enforce maxRuntime themselves too."""
    return {"maximumRuntimeInMinutes": -(-seconds // 60)} if seconds else {}


def group_env(nodes: list[NodeConfig]) -> dict[str, str]:
    """The one env a group's nodes share: their env without the node's own name (the node works it out)."""
    envs = [{k: v for k, v in node.env.items() if k != "LAUNCHER_NODE_NAME"} for node in nodes]
    if any(env != envs[0] for env in envs[1:]):
        raise ValueError("nodes of one group differ in more than their names; they cannot share a node group")
    return envs[0]


def native_requests(plan: Plan, infra: DataScienceJobInfra) -> list[Request]:
    groups = []
    for group in (plan.spec.cluster.main, plan.spec.cluster.worker):
        nodes = [node for node in plan.nodes if node.group == ("main" if group is plan.spec.cluster.main
                                                               else "worker")]
        if not nodes:
            continue
        groups.append({
            "name": group.name,
            "replicas": len(nodes),
            "minimumSuccessReplicas": len(nodes),
            "jobInfrastructureConfigurationDetails": _shape(infra, "MULTI_NODE"),
            "jobConfigurationDetails": {"jobType": "DEFAULT", "environmentVariables": group_env(nodes)},
            "jobEnvironmentConfigurationDetails": _container(nodes[0]),
        })
    network = ({"jobNetworkType": "CUSTOM_NETWORK", "subnetId": infra.subnet_id} if infra.subnet_id
               else {"jobNetworkType": "DEFAULT_NETWORK"})
    job = {
        "projectId": infra.project_id,
        "compartmentId": infra.compartment_id,
        "displayName": f"{infra.display_name}-{plan.run_id}",
        "jobNodeConfigurationDetails": {
            "jobNodeType": "MULTI_NODE", "startupOrder": "IN_PARALLEL",
            **_max_runtime(plan.spec.cluster.max_runtime),
            "jobNetworkConfiguration": network,
            "jobNodeGroupConfigurationDetailsList": groups,
        },
        **_logging(infra),
        "freeformTags": _tags(plan),
    }
    run = {"projectId": infra.project_id, "compartmentId": infra.compartment_id, "jobId": JOB_ID_PLACEHOLDER,
           "displayName": plan.run_id, "freeformTags": _tags(plan)}
    return [Request("create_job", infra.display_name, job), Request("create_job_run", plan.run_id, run)]


def per_node_requests(plan: Plan, infra: DataScienceJobInfra) -> list[Request]:
    first = plan.nodes[0]
    job = {
        "projectId": infra.project_id,
        "compartmentId": infra.compartment_id,
        "displayName": f"{infra.display_name}-{plan.run_id}",
        "jobConfigurationDetails": {"jobType": "DEFAULT", "environmentVariables": {},
                                    **_max_runtime(plan.spec.cluster.max_runtime)},
        "jobInfrastructureConfigurationDetails": _shape(infra, "STANDALONE" if infra.subnet_id else "ME_STANDALONE"),
        "jobEnvironmentConfigurationDetails": _container(first),
        **_logging(infra),
        "freeformTags": _tags(plan),
    }
    requests = [Request("create_job", infra.display_name, job)]
    for node in plan.nodes:
        run: dict[str, Any] = {
            "projectId": infra.project_id,
            "compartmentId": infra.compartment_id,
            "jobId": JOB_ID_PLACEHOLDER,
            "displayName": f"{plan.run_id}-{node.name}",
            "jobConfigurationOverrideDetails": {"jobType": "DEFAULT", "environmentVariables": dict(node.env)},
            "freeformTags": {**_tags(plan), "launcher-node": node.name},
        }
        if node.image != first.image:
            run["jobEnvironmentConfigurationOverrideDetails"] = _container(node)
        requests.append(Request("create_job_run", node.name, run))
    return requests


def limit_problems(plan: Plan) -> list[str]:
    """What the service would refuse: env and command sizes over its limits, images that are not registry paths."""
    problems = []
    for node in plan.nodes:
        size = sum(len(name) + len(value) for name, value in node.env.items())
        if size > MAX_ENV_CHARACTERS:
            problems.append(f"node {node.name}: its environment has {size} characters; OCI Data Science allows "
                            f"{MAX_ENV_CHARACTERS} (shorten env values or runtime args)")
        command = len(json.dumps(list(node.command)).encode())
        if command >= MAX_COMMAND_BYTES:
            problems.append(f"node {node.name}: its container command is {command} bytes; the limit is "
                            f"{MAX_COMMAND_BYTES}")
    for image in sorted({node.image for node in plan.nodes}):
        if not REGISTRY_PATH.match(image):
            problems.append(f"image {image!r} is not a registry path such as iad.ocir.io/NAMESPACE/REPOSITORY:TAG "
                            "(OCI pulls it from a registry)")
    return problems
