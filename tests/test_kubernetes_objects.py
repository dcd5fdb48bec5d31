"""The kubernetes backend's objects (an Indexed Job and a headless Service), checked against the official
OpenAPI schemas of Kubernetes (kubernetes-validate's copies, strict: no field the API does not know) for every
kind of spec, and what they mean: one pod per node in the spec's order, a lost pod started again for its index
alone up to maxRestarts, any other failure the end of the run. No cluster is involved: none can run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster import write_spec
from conftest import run_cli

kubernetes_validate = pytest.importorskip("kubernetes_validate")

from launcher.backends.kubernetes import KubernetesBackend  # noqa: E402
from launcher.backends.kubernetes.schemas import OLDEST, newest  # noqa: E402
from launcher.errors import BadInput  # noqa: E402
from launcher.spec import load_spec  # noqa: E402

IMAGE = "registry.example.com/team/train@sha256:" + "a" * 64
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "gpu.product", "operator": "In", "values": ["H100"]}]}]}}}


def k8s_spec(tmp_path: Path, infra: dict | None = None, *, nodes: int = 3, cluster: dict | None = None,
             work_dir: str = "s3://bucket/runs", image: str = IMAGE) -> Path:
    spec = write_spec(tmp_path, "print('x')\n", nodes=nodes, work_dir=work_dir,
                      extra_cluster={"image": image, **(cluster or {})})
    data = yaml.safe_load(spec.read_text())
    data["spec"]["infrastructure"] = {"kind": "infrastructure", "type": "kubernetes", "spec": infra or {}}
    spec.write_text(yaml.safe_dump(data))
    return spec


def objects(spec: Path, run_id: str = "run-1") -> tuple[dict, dict]:
    service, job = (request.body for request in KubernetesBackend().dryrun(load_spec(spec), run_id=run_id).requests)
    return service, job


CASES = {
    "static, defaults": ({}, {}),
    "GPUs from processesPerNode": ({}, {"processesPerNode": 8}),
    "GPUs, CPU, memory, extended": ({"resources": {"gpus": 4, "cpu": "15500m", "memory": "120Gi",
                                                   "extended": {"rdma/ib": 1}}}, {}),
    "placement": ({"nodeSelector": {"pool": "a100"}, "tolerations": [TOLERATION], "affinity": AFFINITY,
                   "priorityClassName": "training", "serviceAccountName": "trainer"}, {}),
    "kueue, labels, annotations": ({"queueName": "team-a", "labels": {"team": "vision"},
                                    "annotations": {"owner": "ana"}}, {}),
    "volumes, shm, secrets, pull secrets, ttl": ({"volumes": [{"claimName": "datasets", "mountPath": "/data",
                                                              "readOnly": True}],
                                                 "shmSize": "16Gi", "secrets": ["s3-creds"],
                                                 "imagePullSecrets": ["regcred"], "ttlSecondsAfterFinished": 3600},
                                                {}),
    "elastic": ({}, {"elastic": {"minNodes": 2, "maxNodes": 3, "maxRestarts": 5}}),
    "static with recovery": ({}, {"recovery": {"maxRestarts": 2}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_object_validates_against_the_oldest_and_newest_official_schemas(tmp_path, case):
    infra, cluster = CASES[case]
    for body in objects(k8s_spec(tmp_path, infra, cluster=cluster)):
        for version in (OLDEST, newest()):
            kubernetes_validate.validate(body, version, strict=True)  # raises on any deviation


def test_the_job_runs_a_pod_per_node_and_starts_again_only_a_lost_pods_index(tmp_path):
    service, job = objects(k8s_spec(tmp_path, cluster={"elastic": {"minNodes": 2, "maxNodes": 3, "maxRestarts": 5}}))
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert spec["backoffLimitPerIndex"] == 5 and spec["maxFailedIndexes"] == 1  # the run goes on without one node
    count, fail = spec["podFailurePolicy"]["rules"]
    assert count == {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == [0, 137, 143]  # a kill, a stop: lost
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == service["metadata"]["name"] == "run-1"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == spec["template"]["metadata"]["labels"] == {"launcher.run-id": "run-1"}
    (container,) = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "launcher.node.engines.kubernetes"]
    env = {item["name"]: item for item in container["env"]}
    assert "LAUNCHER_NODE_NAME" not in env and env["LAUNCHER_RUN_ID"]["value"] == "run-1"
    assert env["LAUNCHER_NODE_INCARNATION"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-index-failure-count']"


def test_a_static_run_without_recovery_fails_at_its_first_failed_pod(tmp_path):
    _, job = objects(k8s_spec(tmp_path))
    assert job["spec"]["backoffLimitPerIndex"] == 0 and job["spec"]["maxFailedIndexes"] == 0


def test_resources_gpus_and_kueue(tmp_path):
    _, job = objects(k8s_spec(tmp_path, {"queueName": "team-a", "resources": {"cpu": 8, "extended": {"rdma/ib": 1}}},
                              cluster={"processesPerNode": 4}))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == container["resources"]["limits"] == \
        {"cpu": "8", "nvidia.com/gpu": "4", "rdma/ib": "1"}
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


@pytest.mark.parametrize("infra, cluster, work_dir, image, run_id, error", [
    ({}, {"config": {"env": [{"name": "HF_TOKEN", "value": "hf_x"}]}}, "s3://b/r", IMAGE, "run-1",
     "HF_TOKEN: on Kubernetes, credentials reach the pods from a Secret"),
    ({}, {}, "./wd", IMAGE, "run-1", "pods cannot reach a directory of this machine"),
    ({}, {}, "s3://b/r", IMAGE, "Run_1", "run id 'Run_1': on Kubernetes it names the Job"),
    ({}, {"worker": {"replicas": 2, "image": "other:1"}}, "s3://b/r", IMAGE, "run-1",
     "every group must use the same image"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "effekt": "NoSchedule"}]}, {}, "s3://b/r", IMAGE, "run-1",
     "Job run-1: spec.template.spec.tolerations.0: Additional properties are not allowed ('effekt'"),
])
def test_what_a_cluster_would_refuse_is_refused_naming_where(tmp_path, infra, cluster, work_dir, image, run_id, error):
    spec = k8s_spec(tmp_path, infra, cluster=cluster, work_dir=work_dir, image=image)
    with pytest.raises(BadInput) as refused:
        objects(spec, run_id)
    assert error in str(refused.value), refused.value


def test_a_work_dir_on_a_volume_every_pod_mounts_is_accepted(tmp_path):
    spec = k8s_spec(tmp_path, {"volumes": [{"claimName": "shared", "mountPath": "/mnt/shared"}]},
                    work_dir="/mnt/shared/runs")
    _, job = objects(spec)
    env = {item["name"]: item.get("value") for item in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LAUNCHER_WORK_DIR"] == "/mnt/shared/runs"


def test_the_dry_run_prints_what_kubectl_applies_and_run_without_a_cluster_says_why(tmp_path, launcher_home):
    spec = k8s_spec(tmp_path, {"namespace": "ml"})
    shown = run_cli("run", "-f", str(spec), "--dry-run", "--run-id", "run-1", "--output", "yaml")
    assert shown.returncode == 0, shown.stderr
    documents = list(yaml.safe_load_all(shown.stdout))
    assert [(d["kind"], d["metadata"]["namespace"]) for d in documents] == [("Service", "ml"), ("Job", "ml")]
    text = run_cli("run", "-f", str(spec), "--dry-run", "--run-id", "run-1")
    assert text.stdout.startswith("# note: ") and list(yaml.safe_load_all(text.stdout)) == documents
    as_json = json.loads(run_cli("run", "-f", str(spec), "--dry-run", "--run-id", "run-1", "--output", "json").stdout)
    assert [request["body"] for request in as_json["requests"]] == documents
    nowhere = {**os.environ, "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    refused = run_cli("run", "-f", str(spec), env=nowhere)
    assert refused.returncode == 3 and "kubeconfig (KUBECONFIG or ~/.kube/config): " in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    unpushed = run_cli("run", "-f", str(k8s_spec(tmp_path, image="@image")))
    assert unpushed.returncode == 2 and '"@image" must be pushed for the cluster to pull it' in unpushed.stderr
    assert not (launcher_home / "runs").exists()  # nothing recorded


def test_a_pod_takes_the_node_at_its_index_in_the_spec_order(tmp_path):
    env = {"LAUNCHER_NODE_GROUPS": json.dumps([["m", 1], ["w", 2]]), "JOB_COMPLETION_INDEX": "2", "PATH": "/usr/bin"}
    probe = ("import os, sys; sys.argv = ['x', '--worker-env', 'ROLE=worker', '--main-env', 'ROLE=main'];"
             "import launcher.node.engines.kubernetes as k, launcher.node.engines.kubernetes;"
             "k._exec_bootstrap = lambda: print(os.environ['LAUNCHER_NODE_NAME'], os.environ['ROLE']) or sys.exit(0);"
             "k.main(sys.argv[1:])")
    shown = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert shown.stdout.split() == ["w-1", "worker"], shown.stderr
    env["JOB_COMPLETION_INDEX"] = "3"
    bad = subprocess.run([sys.executable, "-m", "launcher.node.engines.kubernetes"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "JOB_COMPLETION_INDEX is '3'; the run has nodes 0..2" in bad.stderr
