"""OCI Data Science Jobs: one job for the cluster, one job run per node.

The payloads are the REST bodies of CreateJob and CreateJobRun (camelCase, as
the ``oci`` SDK serialises them). The SDK and ocifs are imported only by
:meth:`OciBackend.schedule`.
"""

from __future__ import annotations

from typing import Any

from launcher.backends.base import Backend, Request
from launcher.plan import Plan
from launcher.errors import BadInput
from launcher.spec.model import DataScienceJobInfra

JOB_ID_PLACEHOLDER = "<id returned by create_job>"


class OciBackend(Backend):
    name = "oci"
    node_command = ("python", "-m", "launcher.node")

    def requests(self, plan: Plan) -> list[Request]:
        spec = plan.spec
        infra = spec.infra
        if not isinstance(infra, DataScienceJobInfra):
            raise BadInput("the oci backend needs spec.infrastructure.type: dataScienceJob with its spec "
                           "(projectId, compartmentId, shapeName, ...)")
        tags = {"launcher-run-id": plan.run_id}
        first = plan.nodes[0]
        job = {
            "projectId": infra.project_id,
            "compartmentId": infra.compartment_id,
            "displayName": f"{infra.display_name}-{plan.run_id}",
            "jobConfigurationDetails": {"jobType": "DEFAULT", "environmentVariables": {},
                                        **_max_runtime(spec.cluster.max_runtime)},
            "jobInfrastructureConfigurationDetails": _infrastructure(infra),
            "jobEnvironmentConfigurationDetails": {
                "jobEnvironmentType": "OCIR_CONTAINER",
                "image": first.image,
                "cmd": list(first.command),
                "entrypoint": [],
            },
            "freeformTags": tags,
        }
        if infra.log_group_id:
            job["jobLogConfigurationDetails"] = {
                "enableLogging": True,
                "enableAutoLogCreation": infra.log_id is None,
                "logGroupId": infra.log_group_id,
                **({"logId": infra.log_id} if infra.log_id else {}),
            }
        requests = [Request("create_job", infra.display_name, job)]
        for node in plan.nodes:
            run: dict[str, Any] = {
                "projectId": infra.project_id,
                "compartmentId": infra.compartment_id,
                "jobId": JOB_ID_PLACEHOLDER,
                "displayName": f"{plan.run_id}-{node.name}",
                "jobConfigurationOverrideDetails": {"jobType": "DEFAULT", "environmentVariables": dict(node.env)},
                "freeformTags": {**tags, "launcher-node": node.name},
            }
            if node.image != first.image:
                run["jobEnvironmentConfigurationOverrideDetails"] = {
                    "jobEnvironmentType": "OCIR_CONTAINER", "image": node.image, "cmd": list(node.command),
                    "entrypoint": []}
            requests.append(Request("create_job_run", node.name, run))
        return requests


def _infrastructure(infra: DataScienceJobInfra) -> dict[str, Any]:
    details: dict[str, Any] = {
        "jobInfrastructureType": "STANDALONE" if infra.subnet_id else "ME_STANDALONE",
        "shapeName": infra.shape_name,
        "blockStorageSizeInGBs": infra.block_storage_gb,
    }
    if infra.subnet_id:
        details["subnetId"] = infra.subnet_id
    shape = {k: v for k, v in (("ocpus", infra.ocpus), ("memoryInGBs", infra.memory_gb)) if v is not None}
    if shape:
        details["jobShapeConfigDetails"] = shape
    return details



def _max_runtime(seconds: int | None) -> dict[str, Any]:
    """OCI stops a job run after maximumRuntimeInMinutes; the nodes enforce maxRuntime themselves too."""
    return {"maximumRuntimeInMinutes": -(-seconds // 60)} if seconds else {}
