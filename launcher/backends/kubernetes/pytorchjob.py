"""The run as a Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``), for clusters that already run the training operator:
``launcher run --dry-run --backend kubernetes --output pytorchjob``. An export only: launcher does not submit it,
follow it or cancel it (``kubectl apply -f`` does the first, ``kubectl delete pytorchjob`` the last).

The cluster is the one the Indexed Job runs (:mod:`.objects`): one ``Master`` replica (the spec's main node, node
index 0) and ``Worker`` replicas (the spec's other nodes, in its order), the same image, resources, volumes,
tolerations and the rest of the pod, and the same node bootstrap: every pod meets the others in the work dir, which
elects the main and gives the ranks. The operator's own rendezvous variables (``MASTER_ADDR``, ``MASTER_PORT``,
``WORLD_SIZE``, ``RANK`` and torchrun's ``PET_*``) are not used: the pod's entry (:mod:`launcher.node.engines.pytorchjob`)
drops them before the bootstrap starts, so torchrun gets launcher's values only (it would otherwise take the
operator's ``PET_RDZV_*`` as its rendezvous). Which node a pod is comes from the operator's labels (replica type
and index); its incarnation from a claim in the work dir, since the operator starts a lost replica again under the
same pod name.

Recovery: a spec with ``recovery``/``elastic`` restarts a replica whose container ended with an exit code the
operator retries (``restartPolicy: ExitCode``: 128 and above, a kill by a signal: 137 SIGKILL or the OOM killer, 143
a node stopped from outside); launcher's own codes below 128 (1 a peer failed, 2, 3, 124) end the run. An elastic
spec also gets ``elasticPolicy`` (minReplicas/maxReplicas/maxRestarts); the operator reads it as its torchrun's
elastic settings, which launcher's node does not use: its own rounds in the work dir decide who trains.

Checked before it is printed (:func:`check`): the training SDK (PyPI ``kubeflow-training``) ships no CRD schema, only
its generated model classes, so the document is deserialized into them strictly (every key known, every value of
its declared type, required fields present, and the models serialize back to the same document); each replica's pod
template against the official Kubernetes schema (``kubernetes-validate``, as a PodTemplate); and the training
operator's admission rules for PyTorchJobs (replica types Master and Worker, one Master, a container named
``pytorch``, Worker replicas with an elastic policy, a DNS-1035 name).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from launcher.backends.kubernetes.objects import (FAILURE_COUNT, QUEUE_LABEL, _labels, check_names, container, infra_of,
                                                  pod_spec)
from launcher.errors import BadInput
from launcher.plan import Plan

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER = "pytorch"  # the operator sets its variables and ports on the container of this name only
NODE_ENTRY = "launcher.node.engines.pytorchjob"
MASTER, WORKER = "Master", "Worker"
# the operator's pod labels (the training SDK's constants REPLICA_TYPE_LABEL, REPLICA_INDEX_LABEL)
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
# what the pod's entry reads (launcher.node.engines.pytorchjob)
REPLICA_TYPE_ENV = "LAUNCHER_REPLICA_TYPE"
REPLICA_INDEX_ENV = "LAUNCHER_REPLICA_INDEX"
POD_NAME_ENV = "LAUNCHER_POD_NAME"
RETRIED_FROM = 128  # restartPolicy ExitCode: the operator starts again a replica whose exit code is at least this
SDK_VERSION = "1.9.4"  # the kubeflow-training release the document is checked with (pyproject pins it)
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def pytorchjob(plan: Plan, namespace: str) -> dict[str, Any]:
    """The PyTorchJob of the run. Pure: no I/O. Raises BadInput for what a PyTorchJob cannot express."""
    check_names(plan.run_id)
    if not _DNS_1035.fullmatch(plan.run_id):
        raise BadInput(f"run id {plan.run_id!r}: a PyTorchJob's name must start with a letter (the training operator "
                       "takes DNS-1035 labels only); give one with --run-id")
    infra = infra_of(plan)
    count = len(plan.nodes)
    recovery = json.loads(plan.nodes[0].env.get("LAUNCHER_RECOVERY") or "{}")
    restarts = int(recovery.get("maxRestarts", 0))
    retried = [item for item in recovery.get("retryOn", ["lost"]) if item != "lost"]
    unretried = [item for item in retried if not (isinstance(item, int) and item >= RETRIED_FROM)]
    if restarts and unretried:
        raise BadInput(f"spec.cluster.spec.recovery.retryOn {unretried}: a PyTorchJob's restartPolicy ExitCode starts "
                       f"a replica again only for exit codes {RETRIED_FROM} and above (a kill by a signal); launcher's "
                       "own exit codes below that end the run. Export it with retryOn: [lost], or run it on the "
                       "kubernetes backend (an Indexed Job)")
    policy = "ExitCode" if restarts else "Never"
    metadata: dict[str, Any] = {"name": plan.run_id, "namespace": namespace,
                                "labels": dict(_job_labels(plan))}
    if infra.annotations:
        metadata["annotations"] = dict(infra.annotations)
    replicas = {MASTER: _replica(plan, MASTER, 1, policy)}
    if count > 1:
        replicas[WORKER] = _replica(plan, WORKER, count - 1, policy)
    run_policy: dict[str, Any] = {}
    if restarts:
        run_policy["backoffLimit"] = restarts
    if infra.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = infra.ttl_seconds_after_finished
    spec: dict[str, Any] = {"pytorchReplicaSpecs": replicas, "runPolicy": run_policy}
    minimum = int(recovery.get("minNodes", count))
    if "maxNodes" in recovery:  # an elastic spec
        if count == 1:
            raise BadInput("spec.cluster.spec.elastic: an elastic PyTorchJob needs Worker replicas (the training "
                           "operator refuses one without); give the spec workers, or drop elastic")
        spec["elasticPolicy"] = {"minReplicas": minimum, "maxReplicas": count, "maxRestarts": restarts}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def _job_labels(plan: Plan) -> dict[str, str]:
    labels = _labels(plan)
    if infra_of(plan).queue_name:  # Kueue admits a PyTorchJob as a whole (its kubeflow.org/pytorchjob integration)
        labels[QUEUE_LABEL] = infra_of(plan).queue_name
    return labels


def _replica(plan: Plan, kind: str, replicas: int, policy: str) -> dict[str, Any]:
    """One replica type's spec: the Job's pod template, its container renamed, started by the PyTorchJob's entry."""
    infra = infra_of(plan)
    pod = copy.deepcopy(pod_spec(plan))  # each replica's own (the spec's tolerations and affinity are shared)
    for key in ("restartPolicy", "subdomain"):  # the operator sets the pods' restart policy from the replica's;
        pod.pop(key, None)  # its own Services name the pods (launcher's nodes reach each other by address)
    body = container(plan)
    command = list(body["command"])
    command[command.index("launcher.node.engines.kubernetes")] = NODE_ENTRY
    env = [item for item in body["env"] if FAILURE_COUNT not in json.dumps(item)]  # an Indexed Job's annotation
    env += [{"name": REPLICA_TYPE_ENV, "value": kind.lower()},
            {"name": REPLICA_INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath":
                                                                   f"metadata.labels['{REPLICA_INDEX_LABEL}']"}}},
            {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    pod["containers"] = [{**body, "name": CONTAINER, "command": command, "env": env}]
    metadata: dict[str, Any] = {"labels": _labels(plan)}
    if infra.annotations:
        metadata["annotations"] = dict(infra.annotations)
    return {"replicas": replicas, "restartPolicy": policy, "template": {"metadata": metadata, "spec": pod}}


# -- the checks ---------------------------------------------------------------------------------------------------

def check(body: dict[str, Any], versions: tuple[str, ...] | None = None) -> None:
    """Raise BadInput naming the field, for a PyTorchJob the training SDK's models, the official schema of its pod
    templates (Kubernetes ``versions``: default the oldest supported and the newest installed) or the training
    operator's admission rules refuse."""
    from launcher.backends.kubernetes import schemas

    try:
        from kubeflow.training import ApiClient, models
    except ImportError:
        raise BadInput("--output pytorchjob checks the PyTorchJob with the Kubeflow training SDK: pip install "
                       f"'launcher[kubeflow]' (kubeflow-training=={SDK_VERSION})") from None
    built = _strict(body, "KubeflowOrgV1PyTorchJob", "", models)
    back = ApiClient().sanitize_for_serialization(built)
    if back != body:
        raise BadInput(f"PyTorchJob {body.get('metadata', {}).get('name')}: the training SDK's models do not give "
                       "the same document back (a value of another type than the model declares?)")
    _admission(body)
    for version in versions or (schemas.OLDEST, schemas.newest()):
        for kind, replica in body["spec"]["pytorchReplicaSpecs"].items():
            template = {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": f"{body['metadata']['name']}-{kind.lower()}"},
                        "template": replica["template"]}
            try:
                schemas.check([template], version)
            except BadInput as exc:
                raise BadInput(f"PyTorchJob {body['metadata']['name']}: spec.pytorchReplicaSpecs.{kind}.template: "
                               f"{exc}") from None


_PRIMITIVES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "bool": (bool,), "float": (float, int),
                                            "Quantity": (str, int)}


def _strict(value: Any, kind: str, path: str, models: Any) -> Any:
    """``value`` as an instance of the SDK's type ``kind`` (a model class name, ``list[T]``, ``dict(str, T)`` or a
    primitive); BadInput at the first key the model does not know, value of another type, or value its model
    refuses (a required field missing)."""
    where = path or "(the object)"
    if kind.startswith("list["):
        if not isinstance(value, list):
            raise BadInput(f"PyTorchJob: {where}: a list expected, not {type(value).__name__}")
        return [_strict(item, kind[5:-1], f"{path}.{index}", models) for index, item in enumerate(value)]
    if kind.startswith("dict("):
        inner = kind[5:-1].split(",", 1)[1].strip()
        if not isinstance(value, dict):
            raise BadInput(f"PyTorchJob: {where}: a mapping expected, not {type(value).__name__}")
        return {key: _strict(item, inner, f"{path}.{key}", models) for key, item in value.items()}
    if kind == "object":
        return value
    if kind in _PRIMITIVES:
        wanted = _PRIMITIVES[kind]
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            raise BadInput(f"PyTorchJob: {where}: {kind} expected, not {type(value).__name__} {value!r}")
        return value
    model = getattr(models, kind, None)
    if model is None:
        raise BadInput(f"PyTorchJob: {where}: the training SDK has no type {kind}")
    if not isinstance(value, dict):
        raise BadInput(f"PyTorchJob: {where}: a {kind} (a mapping) expected, not {type(value).__name__}")
    fields = {json_name: attribute for attribute, json_name in model.attribute_map.items()}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise BadInput(f"PyTorchJob: {where}: {', '.join(unknown)}: not a field of {kind} (its fields: "
                       f"{', '.join(sorted(fields))})")
    arguments = {fields[key]: _strict(item, model.openapi_types[fields[key]], f"{path}.{key}".lstrip("."), models)
                 for key, item in value.items()}
    try:
        return model(**arguments)
    except ValueError as exc:
        raise BadInput(f"PyTorchJob: {where}: {exc}") from None


def _admission(body: dict[str, Any]) -> None:
    """The training operator's validating webhook for PyTorchJobs, as its rules read (v1.9)."""
    name = body["metadata"].get("name", "")
    problems = []
    if not _DNS_1035.fullmatch(name) or len(name) > 63:
        problems.append(f"metadata.name {name!r}: must be a DNS-1035 label")
    spec = body.get("spec", {})
    replicas = spec.get("pytorchReplicaSpecs") or {}
    for kind, replica in replicas.items():
        where = f"spec.pytorchReplicaSpecs.{kind}"
        if kind not in (MASTER, WORKER):
            problems.append(f"{where}: replica type must be {MASTER} or {WORKER}")
        containers = ((replica.get("template") or {}).get("spec") or {}).get("containers") or []
        if not any(item.get("name") == CONTAINER and item.get("image") for item in containers):
            problems.append(f"{where}.template.spec.containers: a container named {CONTAINER!r} with an image")
        if kind == MASTER and replica.get("replicas") != 1:
            problems.append(f"{where}.replicas: must be 1")
        if kind == WORKER and replica.get("replicas", 1) < 1:
            problems.append(f"{where}.replicas: must be at least 1")
    if "elasticPolicy" in spec and WORKER not in replicas:
        problems.append(f"spec.pytorchReplicaSpecs.{WORKER}: must be configured if elastic policy is used")
    if problems:
        raise BadInput(f"PyTorchJob {name}: the training operator would refuse it: " + "; ".join(problems))


def export(plan: Plan, namespace: str) -> dict[str, Any]:
    """The PyTorchJob, checked."""
    body = pytorchjob(plan, namespace)
    check(copy.deepcopy(body))
    return body
