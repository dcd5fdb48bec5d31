"""The kubernetes backend end to end: the real CLI submits, follows, cancels and cleans runs through the official
`kubernetes` client against the simulated API server (tests/kubesim), whose pods run the example's image, built
and pushed to a real registry, as containers on the real Docker engine, with an s3:// work dir on moto. The
official `kubectl` binary is a second client of the same simulation: it applies what the dry-run prints.

No real cluster is involved (none can run here): what the simulation does is written from the Kubernetes
documentation, each behaviour citing its page, and every body it takes is checked against the official schema.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clirun import LiveCli, init_project, is_node_bootstrap, processes_started_with, run_id_from, wait_until
from conftest import run_cli

pytestmark = pytest.mark.slow
kubernetes = pytest.importorskip("kubernetes")

KUBECTL = str(Path(sys.executable).with_name("kubectl"))
SECRET = "s3-credentials"
BUCKET = "kubernetes-runs"


@pytest.fixture(scope="module")
def kube(docker_engine, moto):
    """The simulated cluster (3 nodes of 8 CPUs, no GPUs), with the Secret the pods read S3's credentials and
    endpoint from (moto, reached through the pod network's gateway)."""
    from kubesim import KubeSim

    sim = KubeSim(nodes=3)
    moto.make_bucket(BUCKET)
    endpoint = f"http://{sim.expose(moto.port)}"
    client = api(sim)[0]
    client.create_namespaced_secret("default", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
                                                "stringData": {**moto.env(endpoint)}})
    yield sim
    sim.stop()


def api(sim):
    from kubernetes import client, config

    connection = config.new_client_from_config(str(sim.kubeconfig(Path(sim._root) / "kubeconfig")))
    return client.CoreV1Api(connection), client.BatchV1Api(connection)


@pytest.fixture(scope="module")
def project(tmp_path_factory, node_base_image, registry, kube, moto):
    """The example (`launcher init --framework pytorch`, 3 nodes) on Kubernetes, its image pushed: (spec, env)."""
    root = tmp_path_factory.mktemp("kubernetes-project")
    spec = init_project(root / "proj", workers=2, epochs=3)
    data = yaml.safe_load(spec.read_text())
    data["spec"]["infrastructure"] = {"kind": "infrastructure", "type": "kubernetes", "apiVersion": "v1.0",
                                      "spec": {"secrets": [SECRET]}}
    data["spec"]["cluster"]["spec"]["workDir"] = f"s3://{BUCKET}/runs"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, **moto.env(), "LAUNCHER_HOME": str(root / "home"),
           "KUBECONFIG": str(kube.kubeconfig(root / "kubeconfig"))}
    built = run_cli("build", "-f", str(spec), "--tag", f"{registry.address}/launcher-test/k8s:v1", "--push",
                    "--build-arg", f"BASE_IMAGE={node_base_image}", env=env, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    return spec, env


def run_objects(sim, run_id: str) -> list[str]:
    """What the simulation still holds of a run: its Job, Service and pods, and the pods' containers."""
    found = [f"{kind} {item['metadata']['name']}" for kind in ("jobs", "services", "pods")
             for item in sim.store.items(kind, "default")[0]
             if item["metadata"].get("labels", {}).get("launcher.run-id") == run_id
             or item["metadata"]["name"] == run_id]
    containers = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=launcher.run-id={run_id}"],
                                capture_output=True, text=True, timeout=60).stdout.split()
    return found + [f"container {name}" for name in containers]


def test_the_example_trains_on_three_pods_and_clean_removes_the_job(project, kube, moto):
    spec, env = project
    done = run_cli("run", "-f", str(spec), env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    assert f"run {run_id} succeeded" in done.stdout
    assert re.search(rf"Kubernetes Job default/{run_id}: 3 pods running \(on kubesim-node-\d", done.stdout), done.stdout
    watched = run_cli("watch", f"default/{run_id}", "--no-follow", env=env)  # RUN as namespace/job-name
    for node in ("pytorch-ddp-main", "pytorch-ddp-worker-0", "pytorch-ddp-worker-1"):
        assert re.search(rf"\[{node}\s+r\d\] rank \d: epoch 3/3", watched.stdout), watched.stdout
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=moto.endpoint, skip_instance_cache=True)
    assert fs.exists(f"{BUCKET}/runs/{run_id}/outputs/pytorch-ddp-main/model.pt")
    complete = subprocess.run([KUBECTL, "wait", "--for=condition=complete", f"job/{run_id}", "--timeout=120s"], env=env,
                              capture_output=True, text=True, timeout=180)  # the pods exit after their last record
    assert complete.returncode == 0, complete.stderr
    status = run_cli("status", run_id, env=env)
    assert re.search(rf"Kubernetes Job default/{run_id}: 3 pods succeeded \(on kubesim-node-\d.*\); Job complete",
                     status.stdout), status.stdout
    left = run_objects(kube, run_id)
    assert f"jobs {run_id}" in left and f"services {run_id}" not in left, left  # the Job stays for kubectl logs
    cleaned = run_cli("clean", run_id, env=env)
    assert cleaned.returncode == 0 and f"Job default/{run_id}" in cleaned.stdout, cleaned.stdout + cleaned.stderr
    core, _ = api(kube)
    core_pods = core.list_namespaced_pod("default", label_selector=f"batch.kubernetes.io/job-name={run_id}").items
    assert all(pod.metadata.deletion_timestamp for pod in core_pods)  # the garbage collector takes them


@pytest.mark.parametrize("worker, grace", [
    (0, 0),  # kubectl delete pod --force: the container is killed at once
    # kubectl delete pod: the kubelet sends SIGTERM (SIGKILL only after a grace the node does not need); the node,
    # with no cancel marker in the work dir, ends lost with exit 143, which the Job's podFailurePolicy counts
    # against the index (it starts again) instead of failing the Job
    (1, 60),
])
def test_a_pod_deleted_from_outside_is_replaced_and_the_run_resumes(project, kube, worker, grace):
    spec, env = project
    index = worker + 1
    run = LiveCli(["run", "-f", str(spec), "--set", "spec.cluster.spec.recovery.maxRestarts=1", "--", "--epochs", "6"],
                  env)
    run.wait_for(rf"\[pytorch-ddp-worker-{worker}\s+r\d\] rank \d: epoch 2/6", timeout=400)
    run_id = run_id_from("\n".join(run.lines))
    core, _ = api(kube)
    selector = f"batch.kubernetes.io/job-name={run_id},batch.kubernetes.io/job-completion-index={index}"
    [pod] = core.list_namespaced_pod("default", label_selector=selector).items
    # The other pods' training is frozen until the deleted pod is gone, so that the run cannot end first however
    # long the kubelet and Docker take; the deleted pod's node and training are left as they are, to end as they do
    others = [pid for node in ("pytorch-ddp-main", "pytorch-ddp-worker-0", "pytorch-ddp-worker-1")
              if node != f"pytorch-ddp-worker-{worker}" for pid in training_pids(run_id, node)]
    for pid in others:
        os.kill(pid, signal.SIGSTOP)
    try:
        core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=grace)
        assert wait_until(lambda: pod.metadata.name not in [
            item.metadata.name for item in core.list_namespaced_pod("default", label_selector=selector).items], 300)
    finally:
        for pid in others:
            os.kill(pid, signal.SIGCONT)
    code, output = run.finish(timeout=500)
    assert code == 0, output[-4000:]
    assert f"run {run_id} succeeded" in output
    assert "replacement 1 joins" in output, output[-4000:]
    assert re.search(rf"\[pytorch-ddp-worker-{worker}\s+r\d\] rank \d: epoch 6/6", output), output[-3000:]
    assert re.search(rf"index {index} started again 1 time", output), output[-3000:]
    counts = [p.metadata.annotations["batch.kubernetes.io/job-index-failure-count"]
              for p in core.list_namespaced_pod("default", label_selector=selector).items]
    assert counts == ["1"], counts  # the deleted pod went; its index's next pod counts one failure
    if grace:
        # on failure: every [launcher] line of the deleted node, whose end the assertion is about (the tail of the
        # whole output is mostly the other nodes' training)
        said = "\n".join(line for line in output.splitlines() if f"pytorch-ddp-worker-{worker}]" in line)
        assert "received SIGTERM from outside, not from launcher cancel: the node is lost (exit status 143)" in \
            output, said[-6000:]
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={pod.metadata.name}").items
        assert [e.reason for e in events if e.reason == "Killing"] == ["Killing"]  # stopped by the kubelet, gently


def training_pids(run_id: str, node: str) -> list[int]:
    """The processes the node's torchruns started (its containers' processes are this machine's)."""
    def children(pid: int) -> list[int]:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    processes = processes_started_with(LAUNCHER_RUN_ID=run_id, LAUNCHER_NODE_NAME=node)
    [bootstrap] = [pid for pid, argv in processes.items() if is_node_bootstrap(argv)]
    pids = [pid for torchrun in children(bootstrap) for pid in children(torchrun)]
    assert pids, f"{node} has no training process"
    return pids


def test_a_pod_that_fits_no_node_shows_the_schedulers_reason_and_cancel_leaves_nothing(project, kube):
    spec, env = project
    started = run_cli("run", "-f", str(spec), "--set", "spec.infrastructure.spec.resources.gpus=1", "--detach",
                      env=env, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    watcher = LiveCli(["watch", run_id], env)
    watcher.wait_for(r"FailedScheduling: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu\.", timeout=120)
    status = run_cli("status", run_id, env=env)
    assert "pending: FailedScheduling: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in status.stdout, \
        status.stdout
    cancelled = run_cli("cancel", run_id, "--grace", "5", env=env, timeout=300)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    watcher.finish(timeout=120)
    assert run_objects(kube, run_id) == []


def test_cancel_of_a_training_run_leaves_no_object_and_no_container(project, kube):
    spec, env = project
    run = LiveCli(["run", "-f", str(spec), "--", "--epochs", "500"], env)
    run.wait_for(r"rank \d: epoch 1/500", timeout=400)
    run_id = run_id_from("\n".join(run.lines))
    cancelled = run_cli("cancel", run_id, env=env, timeout=300)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"run {run_id}: cancelled" in cancelled.stdout, cancelled.stdout
    run.finish(timeout=120)
    assert run_objects(kube, run_id) == []


def test_the_simulation_refuses_what_the_schema_refuses(kube):
    from kubernetes.client import ApiException

    _, batch = api(kube)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "refused"}, "spec": {
        "completions": "three", "template": {"spec": {"restartPolicy": "Never",
                                                      "containers": [{"name": "c", "image": "x"}]}}}}
    with pytest.raises(ApiException) as invalid:
        batch.create_namespaced_job("default", job)
    status = json.loads(invalid.value.body)
    assert invalid.value.status == 422 and status["kind"] == "Status" and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.completions", status
    job["spec"]["completions"] = 3
    job["spec"]["template"]["spec"]["containers"][0]["cpuCount"] = 2
    with pytest.raises(ApiException) as unknown:
        batch.create_namespaced_job("default", job, field_validation="Strict")
    assert unknown.value.status == 400 and "unknown field" in json.loads(unknown.value.body)["message"]
    assert kube.store.items("jobs", "default", lambda body: body["metadata"]["name"] == "refused")[0] == []


def test_kubectl_applies_the_dry_run_and_gets_logs_and_deletes_the_job(project, kube, tmp_path):
    spec, env = project
    printed = run_cli("run", "-f", str(spec), "--dry-run", "--output", "yaml", "--run-id", "by-kubectl-1", "--",
                      "--epochs", "1", env=env)
    assert printed.returncode == 0, printed.stderr

    def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([KUBECTL, *args], input=stdin, env=env, capture_output=True, text=True, timeout=300)

    applied = kubectl("apply", "-f", "-", stdin=printed.stdout)
    assert applied.returncode == 0 and "job.batch/by-kubectl-1 created" in applied.stdout, applied.stderr
    assert "service/by-kubectl-1 created" in applied.stdout
    waited = kubectl("wait", "--for=condition=complete", "job/by-kubectl-1", "--timeout=280s")
    assert waited.returncode == 0, waited.stderr + kubectl("get", "pods", "-o", "yaml").stdout[-3000:]
    listed = kubectl("get", "pods", "-l", "batch.kubernetes.io/job-name=by-kubectl-1")
    assert len(re.findall(r"^by-kubectl-1-[012]-\w+ ", listed.stdout, re.M)) == 3, listed.stdout
    main = re.search(r"^(by-kubectl-1-0-\w+) ", listed.stdout, re.M).group(1)
    logs = kubectl("logs", main)
    assert logs.returncode == 0 and "epoch 1/1" in logs.stdout, logs.stdout + logs.stderr
    bad = printed.stdout.replace("completions: 3", "completions: three").replace("by-kubectl-1", "by-kubectl-2")
    refused = kubectl("apply", "-f", "-", stdin=bad)
    assert refused.returncode != 0 and 'The Job "by-kubectl-2" is invalid: spec.completions' in refused.stderr
    # kubectl's default (Background) returns once the Job is gone and leaves its pods to the garbage collector;
    # Foreground keeps the Job, which kubectl waits for, until its pods are gone
    deleted = kubectl("delete", "job", "by-kubectl-1", "--cascade=foreground")
    assert deleted.returncode == 0, deleted.stderr
    assert kubectl("delete", "service", "by-kubectl-1").returncode == 0
    assert run_objects(kube, "by-kubectl-1") == []


def test_a_cluster_older_than_a_field_the_run_needs_is_refused_naming_the_version(project, tmp_path):
    from kubesim import KubeSim

    spec, env = project
    old = KubeSim(nodes=1, version="1.27")
    try:
        refused = run_cli("run", "-f", str(spec), env={**env, "KUBECONFIG": str(old.kubeconfig(tmp_path / "old"))})
        assert refused.returncode == 2, refused.stdout + refused.stderr
        # 1.27's podFailurePolicy rules must have onPodConditions, even beside onExitCodes
        assert "the cluster runs Kubernetes 1.27, whose API refuses what the run needs: Job " in refused.stderr
        assert "spec.podFailurePolicy.rules.1: 'onPodConditions' is a required property (the official schema of " \
               "Kubernetes 1.27); Kubernetes 1.29 takes it (the kubernetes backend needs Kubernetes 1.31 or later)" \
               in refused.stderr, refused.stderr
        assert old.store.items("jobs")[0] == [] and old.store.items("services", "default")[0] == []
    finally:
        old.stop()


def test_an_image_the_cluster_cannot_pull_is_shown_with_its_reason(project, kube, registry):
    spec, env = project
    missing = f"{registry.address}/launcher-test/never-pushed@sha256:{'0' * 64}"
    started = run_cli("run", "-f", str(spec), "--set", f"spec.cluster.spec.image={missing}", "--detach", env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    watcher = LiveCli(["watch", run_id], env)
    line = watcher.wait_for(r"pending: ImagePullBackOff: image ", timeout=120)
    assert f"image {missing}: Back-off pulling image" in line, line
    cancelled = run_cli("cancel", run_id, "--grace", "5", env=env, timeout=300)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    watcher.finish(timeout=120)
    assert run_objects(kube, run_id) == []


def test_a_pod_the_oom_killer_ends_is_the_runs_cause(project, kube):
    spec, env = project
    done = run_cli("run", "-f", str(spec), "--set", "spec.infrastructure.spec.resources.memory=48Mi", env=env,
                   timeout=400)
    assert done.returncode == 1, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    assert re.search(rf"run {run_id} failed: .*\n  cause: Kubernetes: pod {run_id}-\d-\w+ on node kubesim-node-\d: "
                     r"container OOMKilled \(exit code 137\)", done.stdout), done.stdout[-3000:]
    assert re.search(r"Job failed: (MaxFailedIndexesExceeded|FailedIndexes)", done.stdout), done.stdout[-3000:]
    assert run_cli("clean", run_id, env=env).returncode == 0
