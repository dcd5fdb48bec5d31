"""A plan as Kubernetes objects: one headless Service and one ``batch/v1`` Indexed Job. Pure: no I/O.

Every pod runs the same command; :mod:`launcher.node.engines.kubernetes` takes its node from the pod's
``JOB_COMPLETION_INDEX`` in the spec's order (index 0 the main), and each group's own variables from
its arguments. The Job controller starts a failed pod's index again (``backoffLimitPerIndex``) only
when the pod was lost: killed (exit 137: SIGKILL, the OOM killer), stopped from outside (exit 143: a SIGTERM
that no ``launcher cancel`` asked for, as ``kubectl delete pod`` sends) or disrupted (eviction, preemption,
a node drained); any other non-zero exit is the run's own end, as its nodes decided it together in the
work dir, and fails the Job at once (``podFailurePolicy``). Pages of the Kubernetes documentation
each rule follows: "Jobs" (Indexed completion mode, Backoff limit per index, Pod failure policy) and
"Service" (Headless Services, a pod's hostname and subdomain).
"""

from __future__ import annotations

import json
from typing import Any

from launcher.backends.indexed import group_env, shared_env
from launcher.errors import BadInput
from launcher.node.engines.indexed import group_argv
from launcher.plan import Plan
from launcher.secrets_mask import looks_secret
from launcher.spec.model import KubernetesInfra

RUN_LABEL = "launcher.run-id"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
CONTAINER = "node"
KILLED_EXIT = 137  # 128 + SIGKILL: killed from outside, or by the OOM killer
# 128 + SIGTERM: the node stopped from outside with no launcher cancel (a pod deleted gracefully): lost
# (launcher.node.sigterm.LOST_ON_SIGTERM, EXIT_LOST); a launcher cancel ends the node 130, which ends the Job
TERMINATED_EXIT = 143
# the Job controller counts a pod's failures for its index in this annotation (backoffLimitPerIndex)
FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
GPU_RESOURCE = "nvidia.com/gpu"
NODE_ENTRY = "launcher.node.engines.kubernetes"
PYTHON = "python"  # the images launcher builds put their venv first on PATH


def infra_of(plan: Plan) -> KubernetesInfra:
    infra = plan.spec.infra
    return infra if isinstance(infra, KubernetesInfra) else KubernetesInfra()


def check_names(run_id: str) -> None:
    """The run id names the Job, the Service and the pods' subdomain: a DNS label, and short enough for the
    pods' hostnames (``RUN-INDEX``) and the labels the Job controller adds."""
    if not run_id or len(run_id) > 52 or not all(c.islower() or c.isdigit() or c == "-" for c in run_id) \
            or not run_id[0].isalnum() or not run_id[-1].isalnum():
        raise BadInput(f"run id {run_id!r}: on Kubernetes it names the Job and its Service, so it must be a DNS label "
                       "of at most 52 characters (lowercase letters, digits and -, starting and ending with a letter "
                       "or digit)")


def workload(plan: Plan, namespace: str) -> list[dict[str, Any]]:
    """The Service and the Job of the run, as the API takes them."""
    check_names(plan.run_id)
    return [service(plan, namespace), job(plan, namespace)]


def _labels(plan: Plan) -> dict[str, str]:
    return {**infra_of(plan).labels, RUN_LABEL: plan.run_id}


def service(plan: Plan, namespace: str) -> dict[str, Any]:
    """Headless: a DNS name for every pod (``RUN-INDEX.RUN``), ready or not, and no load balancing."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": plan.run_id, "namespace": namespace, "labels": _labels(plan)},
            "spec": {"clusterIP": "None", "selector": {RUN_LABEL: plan.run_id}, "publishNotReadyAddresses": True}}


def job(plan: Plan, namespace: str) -> dict[str, Any]:
    infra = infra_of(plan)
    count = len(plan.nodes)
    recovery = json.loads(plan.nodes[0].env.get("LAUNCHER_RECOVERY") or "{}")
    restarts = int(recovery.get("maxRestarts", 0))
    spare = count - int(recovery.get("minNodes", count))  # indexes an elastic run can go on without
    metadata: dict[str, Any] = {"name": plan.run_id, "namespace": namespace, "labels": _labels(plan)}
    if infra.queue_name:
        metadata["labels"][QUEUE_LABEL] = infra.queue_name
    if infra.annotations:
        metadata["annotations"] = dict(infra.annotations)
    spec: dict[str, Any] = {
        "completionMode": "Indexed", "completions": count, "parallelism": count,
        "backoffLimitPerIndex": restarts, "maxFailedIndexes": max(0, spare),
        "podFailurePolicy": {"rules": [
            # a pod evicted, preempted or on a drained node: lost, its index started again
            {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            # any other exit but a kill or a stop from outside is the run's end, decided by its nodes together
            {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn",
                                                  "values": [0, KILLED_EXIT, TERMINATED_EXIT]}}]},
        "template": {"metadata": {"labels": _labels(plan), **({"annotations": dict(infra.annotations)}
                                                                 if infra.annotations else {})},
                     "spec": pod_spec(plan)},
    }
    if infra.ttl_seconds_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = infra.ttl_seconds_after_finished
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def pod_spec(plan: Plan) -> dict[str, Any]:
    infra = infra_of(plan)
    spec: dict[str, Any] = {"restartPolicy": "Never", "subdomain": plan.run_id, "containers": [container(plan)]}
    for key, value in (("serviceAccountName", infra.service_account), ("priorityClassName", infra.priority_class),
                       ("nodeSelector", infra.node_selector or None), ("affinity", infra.affinity),
                       ("tolerations", list(infra.tolerations) or None)):
        if value is not None:
            spec[key] = value
    if infra.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in infra.image_pull_secrets]
    volumes = [{"name": f"claim-{index}", "persistentVolumeClaim": {"claimName": volume["claimName"],
                                                                     "readOnly": bool(volume.get("readOnly"))}}
               for index, volume in enumerate(infra.volumes)]
    if infra.shm_size:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": infra.shm_size}})
    if volumes:
        spec["volumes"] = volumes
    return spec


def container(plan: Plan) -> dict[str, Any]:
    infra = infra_of(plan)
    images = {node.image for node in plan.nodes}
    if len(images) > 1:
        raise BadInput(f"a Kubernetes run has one pod template, so every group must use the same image; the spec "
                       f"names {', '.join(sorted(images))}")
    shared = shared_env(plan.nodes)
    secret = sorted(name for name, value in shared.items() if looks_secret(name) and value)
    secret += sorted({name for env in group_env(plan, shared).values() for name in env if looks_secret(name)})
    if secret:
        raise BadInput(f"{', '.join(secret)}: on Kubernetes, credentials reach the pods from a Secret, never as values "
                       "in the Job: create one (kubectl create secret generic NAME --from-literal=...) and name it in "
                       "infrastructure.spec.secrets")
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in shared.items()
                                 if name != "LAUNCHER_NODE_NAME"]
    env.append({"name": "LAUNCHER_NODE_INCARNATION",  # a pod that starts its index again is the node's next one
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{FAILURE_COUNT}']"}}})
    body: dict[str, Any] = {"name": CONTAINER, "image": plan.nodes[0].image,
                            "command": [PYTHON, "-m", NODE_ENTRY, *group_argv(group_env(plan, shared))], "env": env}
    if infra.secrets:
        body["envFrom"] = [{"secretRef": {"name": name}} for name in infra.secrets]
    resources = _resources(plan)
    if resources:
        body["resources"] = {"requests": resources, "limits": dict(resources)}
    mounts = [{"name": f"claim-{index}", "mountPath": volume["mountPath"], "readOnly": bool(volume.get("readOnly"))}
              for index, volume in enumerate(infra.volumes)]
    if infra.shm_size:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if mounts:
        body["volumeMounts"] = mounts
    return body


def _resources(plan: Plan) -> dict[str, str]:
    """Per pod, requests = limits (GPUs and extended resources must be equal in both)."""
    infra = infra_of(plan)
    wanted: dict[str, str] = {}
    if infra.cpu:
        wanted["cpu"] = infra.cpu
    if infra.memory:
        wanted["memory"] = infra.memory
    gpus = gpus_per_pod(plan)
    if gpus:
        wanted[GPU_RESOURCE] = str(gpus)
    wanted.update({name: str(count) for name, count in infra.extended.items()})
    return wanted


def gpus_per_pod(plan: Plan) -> int | None:
    """``resources.gpus``; else processesPerNode where the spec gives a number (a GPU per training process)."""
    infra = infra_of(plan)
    if infra.gpus is not None:
        return infra.gpus or None
    written = plan.spec.data.get("spec", {}).get("cluster", {}).get("spec", {}).get("processesPerNode")
    return written if isinstance(written, int) else None
