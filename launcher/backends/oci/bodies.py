"""The REST bodies a run sends to OCI Data Science (camelCase, as the ``oci`` SDK serialises them). Pure.

Two launch modes:

- ``native``: one job whose ``jobNodeConfigurationDetails`` (``MULTI_NODE``) has node groups, and
  one job run that starts every node. The replicas of a node group share one env, so launcher
  writes into it which spec groups the node group holds (``LAUNCHER_NODE_GROUP``) and each node
  works out its name (:mod:`launcher.node.identity`). When main and workers differ only in their
  names, the whole cluster is ONE node group, the layout Oracle ADS uses, where the service's
  ``NODE_RANK`` numbers the nodes 0..N-1 and rank 0 is the main; otherwise a node group per spec group.
- ``perNode``: one job and one job run per node, each run with its node's own env.

``--dry-run`` prints these bodies and ``run`` sends these very dicts through the SDK's models.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from launcher.backends.base import Request
from launcher.node.identity import NODE_GROUP
from launcher.plan import NodeConfig, Plan
from launcher.spec.model import DataScienceJobInfra

JOB_ID_PLACEHOLDER = "<id returned by create_job>"
NATIVE_SINCE = (2, 158)  # the oci SDK release that added multi-node jobs
# Documented service limits: custom env of a job (all values and names) and the container command.
MAX_ENV_CHARACTERS = 20_000
MAX_COMMAND_BYTES = 2_048
# OCIR_CONTAINER images: "<region>.ocir.io/<registry>/<image>:<tag>", optionally "@digest" after the tag
# (the SDK's OcirContainerJobEnvironmentConfigurationDetails.image); repositories may have path segments.
OCIR_IMAGE = re.compile(r"^[a-z0-9-]+\.ocir\.io/[a-z0-9._-]+/[a-z0-9._-]+(?:/[a-z0-9._-]+)*"
                        r"(?P<tag>:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?P<digest>@sha256:[0-9a-f]{64})?$")


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


@dataclass(frozen=True)
class NodeGroup:
    """One node group of a native job: its name, the spec groups whose nodes it starts, those nodes."""

    name: str
    spec_groups: tuple[str, ...]
    nodes: tuple[NodeConfig, ...]


def node_groups(plan: Plan) -> list[NodeGroup]:
    """One node group for the whole cluster when its nodes differ only in their names, else one per spec group."""
    cluster = plan.spec.cluster
    by_group = [(group.name, tuple(node for node in plan.nodes if node.group == kind))
                for kind, group in (("main", cluster.main), ("worker", cluster.worker))]
    by_group = [(name, nodes) for name, nodes in by_group if nodes]
    if len(by_group) > 1 and _shared(plan.nodes) is not None:
        return [NodeGroup(plan.spec.name, tuple(name for name, _ in by_group), plan.nodes)]
    return [NodeGroup(name, (name,), nodes) for name, nodes in by_group]


def _shared(nodes: tuple[NodeConfig, ...]) -> dict[str, str] | None:
    """The one env and image the nodes could share (their env without the node's own name), or None."""
    envs = [{k: v for k, v in node.env.items() if k != "LAUNCHER_NODE_NAME"} for node in nodes]
    if any(env != envs[0] for env in envs[1:]) or len({node.image for node in nodes}) > 1:
        return None
    return envs[0]


def group_env(group: NodeGroup) -> dict[str, str]:
    """The env every replica of ``group`` starts with: the nodes' shared env, and which spec groups it holds."""
    env = _shared(group.nodes)
    if env is None:
        raise ValueError(f"the nodes of node group {group.name} differ in more than their names; they cannot "
                         "share one env")
    return {**env, NODE_GROUP: json.dumps(list(group.spec_groups))}


def native_requests(plan: Plan, infra: DataScienceJobInfra) -> list[Request]:
    groups = [{
        "name": group.name,
        "replicas": len(group.nodes),
        "minimumSuccessReplicas": len(group.nodes),
        "jobInfrastructureConfigurationDetails": _shape(infra, "MULTI_NODE"),
        "jobConfigurationDetails": {"jobType": "DEFAULT", "environmentVariables": group_env(group)},
        "jobEnvironmentConfigurationDetails": _container(group.nodes[0]),
    } for group in node_groups(plan)]
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
    """What the service would refuse: env and command sizes over its limits, images it cannot pull."""
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
    problems.extend(filter(None, (image_problem(image) for image in sorted({node.image for node in plan.nodes}))))
    return problems


def image_problem(image: str) -> str | None:
    """Why OCI Data Science would not pull ``image``: it pulls from OCI Container Registry, by tag or digest."""
    found = OCIR_IMAGE.match(image)
    if found is None:
        return (f"image {image!r} is not in OCI Container Registry: OCI Data Science runs images named "
                "REGION.ocir.io/NAMESPACE/REPOSITORY:TAG (push it there: launcher build -f SPEC --tag "
                "REGION.ocir.io/NAMESPACE/REPOSITORY:TAG --push)")
    if not (found["tag"] or found["digest"]):
        return f"image {image!r} names no tag or digest: add one (REGION.ocir.io/NAMESPACE/REPOSITORY:TAG)"
    return None


def ocir_reference(tag: str, pushed: str | None) -> str:
    """How a job names the image `launcher build` made: the tag with the pushed digest after it
    (``REPO:TAG@sha256:...``, the service's documented form), else what there is."""
    if pushed and "@" in pushed and tag.startswith(f"{pushed.split('@')[0]}:"):
        return f"{tag}@{pushed.split('@', 1)[1]}"
    return pushed or tag
