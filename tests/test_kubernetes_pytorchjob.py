"""``launcher run --dry-run --backend kubernetes --output pytorchjob``: the run as a Kubeflow PyTorchJob
(kubeflow.org/v1), an export for clusters that run the training operator (launcher does not submit it).

What checks it is real, nobody here wrote it: the Kubeflow training SDK's model classes (PyPI ``kubeflow-training``,
which ships no CRD schema, so the document is deserialized into them strictly and must serialize back unchanged) and
the official Kubernetes schemas of each replica's pod template (kubernetes-validate). No training operator runs
here: what it does with the document (its env, its restarts) is read from its documentation and source, not run."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from conftest import run_cli
from test_kubernetes_objects import CASES, IMAGE, TOLERATION, k8s_spec, objects

pytest.importorskip("kubernetes_validate")
pytest.importorskip("kubeflow.training")

from kubeflow.training.constants import constants as sdk  # noqa: E402

from launcher.backends.kubernetes import KubernetesBackend  # noqa: E402
from launcher.backends.kubernetes.pytorchjob import (CONTAINER, REPLICA_INDEX_LABEL, check,  # noqa: E402
                                                     pytorchjob)
from launcher.errors import BadInput  # noqa: E402
from launcher.spec import load_spec  # noqa: E402


def exported(spec, run_id: str = "run-1") -> tuple[list[str], dict]:
    notes, text = KubernetesBackend().pytorchjob(KubernetesBackend().dryrun(load_spec(spec), run_id=run_id))
    (body,) = yaml.safe_load_all(text)
    return notes, body


def test_the_names_are_the_training_sdks():
    assert CONTAINER == sdk.PYTORCHJOB_CONTAINER and REPLICA_INDEX_LABEL == sdk.REPLICA_INDEX_LABEL


@pytest.mark.parametrize("case", list(CASES))
def test_every_spec_exports_a_pytorchjob_the_sdk_and_the_official_schemas_take(tmp_path, case):
    infra, cluster = CASES[case]
    spec = k8s_spec(tmp_path, infra, cluster=cluster)
    _, body = exported(spec)
    check(copy.deepcopy(body))  # the SDK's models, both ways; the pod templates against Kubernetes 1.31 and newest
    _, job = objects(spec)
    pod = job["spec"]["template"]["spec"]
    replicas = body["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    for replica in replicas.values():
        template = replica["template"]["spec"]
        (container,) = template["containers"]
        (node,) = pod["containers"]
        assert container["name"] == "pytorch" and container["image"] == node["image"] == IMAGE
        assert container["command"][:3] == ["python", "-m", "launcher.node.engines.pytorchjob"]
        assert container["command"][3:] == node["command"][3:]  # the same groups' arguments
        assert container.get("resources") == node.get("resources")
        assert container.get("volumeMounts") == node.get("volumeMounts")
        for key in ("tolerations", "affinity", "nodeSelector", "volumes", "imagePullSecrets", "priorityClassName",
                    "serviceAccountName"):
            assert template.get(key) == pod.get(key), key
        assert "restartPolicy" not in template and "subdomain" not in template  # the replica's and the operator's
        env = {item["name"]: item for item in container["env"]}
        assert "LAUNCHER_NODE_INCARNATION" not in env  # an Indexed Job's annotation: the node claims it instead
        assert env["LAUNCHER_REPLICA_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            f"metadata.labels['{sdk.REPLICA_INDEX_LABEL}']"
    assert replicas["Master"]["template"]["spec"]["containers"][0]["env"][-3]["value"] == "master"
    assert body["metadata"]["labels"] == job["metadata"]["labels"]  # the run's label, Kueue's queue


def test_recovery_and_elastic_map_to_restarts_and_the_elastic_policy(tmp_path):
    _, static = exported(k8s_spec(tmp_path))
    assert {r["restartPolicy"] for r in static["spec"]["pytorchReplicaSpecs"].values()} == {"Never"}
    assert static["spec"]["runPolicy"] == {} and "elasticPolicy" not in static["spec"]
    _, recovering = exported(k8s_spec(tmp_path, {"ttlSecondsAfterFinished": 600},
                                      cluster={"recovery": {"maxRestarts": 2}}))
    assert {r["restartPolicy"] for r in recovering["spec"]["pytorchReplicaSpecs"].values()} == {"ExitCode"}
    assert recovering["spec"]["runPolicy"] == {"backoffLimit": 2, "ttlSecondsAfterFinished": 600}
    assert "elasticPolicy" not in recovering["spec"]
    notes, elastic = exported(k8s_spec(tmp_path, cluster={"elastic": {"minNodes": 2, "maxNodes": 4,
                                                                      "maxRestarts": 5}}))
    assert elastic["spec"]["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 3, "maxRestarts": 5}
    assert any("elastic maxNodes 4: an exported PyTorchJob has the spec's 3 nodes" in note for note in notes), notes
    assert any("MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and PET_* variables are dropped" in n for n in notes)
    assert any("launcher does not submit" in note for note in notes)


def test_one_node_is_a_master_alone(tmp_path):
    _, body = exported(k8s_spec(tmp_path, nodes=1))
    assert list(body["spec"]["pytorchReplicaSpecs"]) == ["Master"]


@pytest.mark.parametrize("cluster, run_id, error", [
    ({"recovery": {"maxRestarts": 2, "retryOn": ["lost", "failure"]}}, "run-1",
     "recovery.retryOn ['failure']: a PyTorchJob's restartPolicy ExitCode starts a replica again only for exit codes "
     "128 and above"),
    ({"recovery": {"maxRestarts": 2, "retryOn": [1]}}, "run-1", "recovery.retryOn [1]"),
    ({}, "1st-run", "run id '1st-run': a PyTorchJob's name must start with a letter"),
    ({"worker": {"replicas": 1, "image": "other:1"}}, "run-1", "every group must use the same image"),
])
def test_what_a_pytorchjob_cannot_express_is_refused(tmp_path, cluster, run_id, error):
    with pytest.raises(BadInput) as refused:
        exported(k8s_spec(tmp_path, cluster=cluster), run_id)
    assert error in str(refused.value), refused.value


def test_an_elastic_run_of_one_node_is_refused(tmp_path):
    plan = KubernetesBackend().dryrun(load_spec(k8s_spec(tmp_path, nodes=1)), run_id="run-1").plan
    env = dict(plan.nodes[0].env, LAUNCHER_RECOVERY=json.dumps({"minNodes": 1, "maxNodes": 2, "maxRestarts": 1}))
    from dataclasses import replace

    lone = replace(plan, nodes=(replace(plan.nodes[0], env=env),))
    with pytest.raises(BadInput, match="an elastic PyTorchJob needs Worker replicas"):
        pytorchjob(lone, "default")


def _edited(tmp_path, change) -> dict:
    _, body = exported(k8s_spec(tmp_path, {"tolerations": [TOLERATION]}, cluster={"elastic": {
        "minNodes": 2, "maxNodes": 3, "maxRestarts": 1}}))
    change(body)
    return body


@pytest.mark.parametrize("change, error", [
    (lambda b: b["spec"]["runPolicy"].update(backofLimit=3),
     "spec.runPolicy: backofLimit: not a field of KubeflowOrgV1RunPolicy"),
    (lambda b: b["spec"]["elasticPolicy"].update(maxReplicas="3"), "spec.elasticPolicy.maxReplicas: int expected"),
    (lambda b: b["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=True), "replicas: int expected, not bool"),
    (lambda b: b["spec"].pop("runPolicy"), "run_policy`, must not be `None`"),
    (lambda b: b["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2),
     "the training operator would refuse it: spec.pytorchReplicaSpecs.Master.replicas: must be 1"),
    (lambda b: b["spec"]["pytorchReplicaSpecs"].pop("Worker"),
     "spec.pytorchReplicaSpecs.Worker: must be configured if elastic policy is used"),
    (lambda b: b["spec"]["pytorchReplicaSpecs"].update(Chief=b["spec"]["pytorchReplicaSpecs"]["Worker"]),
     "spec.pytorchReplicaSpecs.Chief: replica type must be Master or Worker"),
    (lambda b: b["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(name="train"),
     "a container named 'pytorch' with an image"),
    (lambda b: b["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"][0].update(effekt="x"),
     "spec.pytorchReplicaSpecs.Worker.template.spec.tolerations.0: effekt: not a field of V1Toleration"),
    # pod-level resources: the SDK's Kubernetes models (client 35) know them, the official schema of 1.31 does not
    (lambda b: b["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].update(resources={"limits": {"cpu": "1"}}),
     "spec.pytorchReplicaSpecs.Worker.template: PodTemplate run-1-worker: template.spec: Additional properties are not "
     "allowed ('resources' was unexpected) (the official schema of Kubernetes 1.31)"),
])
def test_the_checks_refuse_what_the_sdk_the_schema_or_the_operator_refuse(tmp_path, change, error):
    with pytest.raises(BadInput) as refused:
        check(_edited(tmp_path, change))
    assert error in str(refused.value), refused.value


def test_the_cli_prints_the_pytorchjob_and_refuses_it_elsewhere(tmp_path, launcher_home):
    spec = k8s_spec(tmp_path, {"namespace": "ml"}, cluster={"recovery": {"maxRestarts": 1}})
    shown = run_cli("run", "-f", str(spec), "--dry-run", "--run-id", "run-1", "--backend", "kubernetes",
                    "--output", "pytorchjob")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("# note: a Kubeflow PyTorchJob (kubeflow.org/v1)")
    (body,) = yaml.safe_load_all(shown.stdout)
    assert (body["apiVersion"], body["kind"], body["metadata"]["namespace"]) == ("kubeflow.org/v1", "PyTorchJob", "ml")
    assert "&id" not in shown.stdout  # no YAML anchors: each replica's template is its own
    local = yaml.safe_load(spec.read_text())
    local["spec"]["infrastructure"] = {"kind": "infrastructure", "type": "local"}
    spec.write_text(yaml.safe_dump(local))
    refused = run_cli("run", "-f", str(spec), "--dry-run", "--output", "pytorchjob")
    assert refused.returncode == 2 and "from the kubernetes backend (this spec runs on local): add --backend " \
        "kubernetes" in refused.stderr, refused.stderr
    exported_anyway = run_cli("run", "-f", str(spec), "--dry-run", "--run-id", "run-1", "--backend", "kubernetes",
                              "--output", "pytorchjob")
    assert exported_anyway.returncode == 0 and "kind: PyTorchJob" in exported_anyway.stdout, exported_anyway.stderr
    not_dry = run_cli("run", "-f", str(spec), "--backend", "kubernetes", "--output", "pytorchjob")
    assert not_dry.returncode == 2 and "--output pytorchjob is for --dry-run" in not_dry.stderr, not_dry.stderr
    assert not (launcher_home / "runs").exists()  # nothing recorded


PROBE = ("import json, os, sys; import launcher.node.engines.pytorchjob as p;"
         "p._exec_bootstrap = lambda: print(json.dumps(dict(os.environ))) or sys.exit(0);"
         "sys.exit(p.main(['--worker-env', 'ROLE=worker', '--main-env', 'ROLE=main']))")


def _pod(tmp_path, kind: str, index: str, pod: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin", "LAUNCHER_NODE_GROUPS": json.dumps([["m", 1], ["w", 2]]),
           "LAUNCHER_WORK_DIR": str(tmp_path / "wd"), "LAUNCHER_RUN_ID": "run-1", "LAUNCHER_REPLICA_TYPE": kind,
           "LAUNCHER_REPLICA_INDEX": index, "LAUNCHER_POD_NAME": pod,
           # what the training operator adds to every pod (its envvar.go, master.go, elastic.go)
           "MASTER_ADDR": "run-1-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
           "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "run-1-worker-0:23456", "PET_NNODES": "2:3"}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)


def test_a_pytorchjob_pod_is_the_node_of_its_replica_and_drops_the_operators_rendezvous(tmp_path):
    master = _pod(tmp_path, "master", "0", "run-1-master-0")
    assert master.returncode == 0, master.stderr
    env = json.loads(master.stdout)
    assert (env["LAUNCHER_NODE_NAME"], env["ROLE"], env["LAUNCHER_NODE_INCARNATION"]) == ("m", "main", "0")
    assert not {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"} & set(env)
    assert not [name for name in env if name.startswith("PET_")]
    assert env["LAUNCHER_LOST_ON_SIGTERM"] == "1"
    assert "the training operator's MASTER_ADDR, MASTER_PORT, PET_NNODES, PET_RDZV_BACKEND, PET_RDZV_ENDPOINT, " \
           "RANK, WORLD_SIZE are not used" in master.stderr
    worker = json.loads(_pod(tmp_path, "worker", "1", "run-1-worker-1").stdout)
    assert (worker["LAUNCHER_NODE_NAME"], worker["ROLE"], worker["LAUNCHER_NODE_INCARNATION"]) == \
        ("w-1", "worker", "0")
    again = json.loads(_pod(tmp_path, "master", "0", "run-1-master-0").stdout)  # the operator started it again
    assert (again["LAUNCHER_NODE_NAME"], again["LAUNCHER_NODE_INCARNATION"]) == ("m", "1")
    bad = _pod(tmp_path, "chief", "0", "run-1-chief-0")
    assert bad.returncode == 2 and "cannot tell which node this pod is" in bad.stderr, bad.stderr
