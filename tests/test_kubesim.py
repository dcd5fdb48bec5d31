"""The Kubernetes simulation itself (tests/kubesim), through the real `kubernetes` client, on the rules of the Jobs
page of the Kubernetes documentation that the backend relies on: a failed index started again per
backoffLimitPerIndex, each podFailurePolicy action, an eviction's DisruptionTarget, a followed pod log. Its pods
are small Python commands in the tests' base image."""

from __future__ import annotations


import pytest

kubernetes = pytest.importorskip("kubernetes")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim(docker_engine, node_base_image):
    from kubesim import KubeSim

    simulation = KubeSim(nodes=2)
    yield simulation
    simulation.stop()


@pytest.fixture(scope="module")
def clients(sim, tmp_path_factory):
    from kubernetes import client, config

    connection = config.new_client_from_config(str(sim.kubeconfig(tmp_path_factory.mktemp("kubesim") / "config")))
    return client.CoreV1Api(connection), client.BatchV1Api(connection)


def indexed_job(name: str, image: str, script: str, rules: list[dict], limit: int = 1, max_failed: int = 0) -> dict:
    """Two indexes running ``script`` (python), with a volume shared by every pod at /marks (a claim the
    simulation keeps as one directory)."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
        "completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimitPerIndex": limit,
        "maxFailedIndexes": max_failed, "podFailurePolicy": {"rules": rules},
        "template": {"spec": {"restartPolicy": "Never",
                              "volumes": [{"name": "marks", "persistentVolumeClaim": {"claimName": "marks"}}],
                              "containers": [{"name": "c", "image": image, "command": ["python", "-c", script],
                                              "volumeMounts": [{"name": "marks", "mountPath": "/marks"}]}]}}}}


def finished(batch, name: str, timeout: float = 180) -> dict:
    """The Job once it has a Complete or Failed condition, woken by a watch on it."""
    from kubernetes import watch

    stream = watch.Watch()
    for event in stream.stream(batch.list_namespaced_job, "default", field_selector=f"metadata.name={name}",
                               timeout_seconds=int(timeout)):
        status = event["object"].status
        if any(c.type in ("Complete", "Failed") and c.status == "True" for c in status.conditions or []):
            stream.stop()
            return batch.read_namespaced_job(name, "default", _preload_content=False).json()
    raise AssertionError(f"Job {name} did not finish in {timeout}s")


def pods_of(core, name: str) -> list:
    return core.list_namespaced_pod("default", label_selector=f"batch.kubernetes.io/job-name={name}").items


# index 1 of Job NAME exits 3 the first time it runs, 0 after
FAIL_FIRST = ("import os, sys, pathlib; mark = pathlib.Path('/marks', sys.argv[1]); "
              "first = os.environ['JOB_COMPLETION_INDEX'] == '1' and not mark.exists(); "
              "first and mark.touch(); sys.exit(3 if first else 0)")
OTHERS_FAIL = {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0, 3]}}


@pytest.mark.parametrize("action, outcome, failed", [
    ("Count", "Complete", 1),  # counted: index 1 started again with failure count 1
    ("Ignore", "Complete", 0),  # not counted: started again, its failure count still 0
    ("FailIndex", "Failed", 1),  # index 1 fails at once: more failed indexes than maxFailedIndexes (0)
    ("FailJob", "Failed", 1),
])
def test_each_pod_failure_policy_action(sim, clients, node_base_image, action, outcome, failed):
    core, batch = clients
    name = f"policy-{action.lower()}"
    job = indexed_job(name, node_base_image, FAIL_FIRST, [
        {"action": action, "onExitCodes": {"operator": "In", "values": [3]}}, OTHERS_FAIL])
    job["spec"]["template"]["spec"]["containers"][0]["args"] = [name]  # python -c SCRIPT NAME
    batch.create_namespaced_job("default", job)
    status = finished(batch, name)["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert outcome in conditions and status.get("failed", 0) == failed, status
    counts = sorted(p.metadata.annotations["batch.kubernetes.io/job-index-failure-count"]
                    for p in pods_of(core, name)
                    if p.metadata.annotations["batch.kubernetes.io/job-completion-index"] == "1")
    if action in ("Count", "Ignore"):
        assert counts == (["0", "1"] if action == "Count" else ["0", "0"]) and status["completedIndexes"] == "0-1"
    if action == "FailIndex":
        assert counts == ["0"] and status["failedIndexes"] == "1"
        assert conditions["Failed"]["reason"] == "MaxFailedIndexesExceeded"
    if action == "FailJob":
        assert conditions["Failed"]["reason"] == "PodFailurePolicy"
        assert "failed with exit code 3 matching FailJob rule at index 0" in conditions["Failed"]["message"]
    batch.delete_namespaced_job(name, "default", propagation_policy="Foreground")


def test_an_evicted_pod_is_disrupted_counted_and_its_index_started_again(sim, clients, node_base_image):
    core, batch = clients
    name = "evicted"
    job = indexed_job(name, node_base_image, "import time; time.sleep(600)", [
        {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}, OTHERS_FAIL])
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1  # python as PID 1 ignores SIGTERM
    batch.create_namespaced_job("default", job)
    from kubernetes import watch

    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_pod, "default",
                               label_selector=f"batch.kubernetes.io/job-name={name}", timeout_seconds=120):
        if event["object"].status.phase == "Running" and \
                event["object"].metadata.annotations["batch.kubernetes.io/job-completion-index"] == "1":
            stream.stop()
            victim = event["object"].metadata.name
    core.create_namespaced_pod_eviction(victim, "default", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                            "metadata": {"name": victim}})
    stream = watch.Watch()
    seen = {}
    for event in stream.stream(core.list_namespaced_pod, "default",
                               label_selector=f"batch.kubernetes.io/job-name={name}", timeout_seconds=120):
        pod = event["object"]
        seen[pod.metadata.name] = pod
        if pod.metadata.name == victim and pod.status.phase == "Failed":
            disrupted = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
            assert disrupted and disrupted[0].reason == "EvictionByEvictionAPI"
        if pod.metadata.annotations.get("batch.kubernetes.io/job-index-failure-count") == "1" \
                and pod.status.phase == "Running":
            stream.stop()
    assert any(p.metadata.annotations.get("batch.kubernetes.io/job-index-failure-count") == "1" for p in seen.values())
    assert batch.read_namespaced_job(name, "default").status.failed == 1
    batch.delete_namespaced_job(name, "default", propagation_policy="Foreground")


def test_a_followed_log_streams_until_the_container_ends(sim, clients, node_base_image):
    core, batch = clients
    name = "logs"
    job = indexed_job(name, node_base_image, "import time\nfor i in range(3):\n    print('line', i, flush=True)\n"
                                             "    time.sleep(1)", [OTHERS_FAIL])
    job["spec"]["completions"] = job["spec"]["parallelism"] = 1
    batch.create_namespaced_job("default", job)
    from kubernetes import watch

    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_pod, "default",
                               label_selector=f"batch.kubernetes.io/job-name={name}", timeout_seconds=120):
        if event["object"].status.phase in ("Running", "Succeeded"):
            stream.stop()
            pod = event["object"].metadata.name
    followed = core.read_namespaced_pod_log(pod, "default", follow=True, _preload_content=False)
    assert followed.data.decode().split("\n") == ["line 0", "line 1", "line 2", ""]
    batch.delete_namespaced_job(name, "default", propagation_policy="Foreground")


def test_patch_through_the_client_and_kubectl(sim, clients, tmp_path):
    """PATCH as the API server takes it (tests/kubesim/patch.py): the client's strategic merge patch, kubectl's merge
    and JSON patches and its label verb, a change the API refuses (422), and a finalizer patched away from an object
    being deleted, which then goes (the Finalizers page)."""
    import subprocess
    import sys
    from pathlib import Path

    core, _ = clients
    kubectl = [str(Path(sys.executable).with_name("kubectl")), "--kubeconfig", str(sim.kubeconfig(tmp_path / "k"))]
    core.create_namespaced_service("default", {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "patched", "labels": {"app": "a"}, "finalizers": ["example.com/hold"]},
        "spec": {"selector": {"app": "a"}, "ports": [{"name": "http", "port": 80}]}})
    core.patch_namespaced_service("patched", "default", {"metadata": {"labels": {"team": "t"}},
                                                         "spec": {"ports": [{"name": "metrics", "port": 9090}]}})
    service = core.read_namespaced_service("patched", "default")
    assert service.metadata.labels == {"app": "a", "team": "t"}
    assert [port.name for port in service.spec.ports] == ["http", "metrics"]  # merged by port, its merge key

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*kubectl, *args], capture_output=True, text=True, timeout=60)

    merged = run("patch", "service", "patched", "--type", "merge", "-p", '{"metadata":{"labels":{"team":null}}}')
    assert merged.returncode == 0, merged.stderr
    assert run("label", "service", "patched", "tier=web").returncode == 0
    listed = run("patch", "service", "patched", "--type", "json", "-p",
                 '[{"op":"replace","path":"/spec/ports/1/port","value":9100}]')
    assert listed.returncode == 0, listed.stderr
    service = core.read_namespaced_service("patched", "default")
    assert service.metadata.labels == {"app": "a", "tier": "web"} and service.spec.ports[1].port == 9100
    refused = run("patch", "service", "patched", "--type", "merge", "-p", '{"spec":{"ports":[{"port":"x"}]}}')
    assert refused.returncode != 0 and "is invalid" in refused.stderr, refused.stderr
    core.delete_namespaced_service("patched", "default")
    assert core.read_namespaced_service("patched", "default").metadata.deletion_timestamp  # held by its finalizer
    core.patch_namespaced_service("patched", "default", {"metadata": {"$deleteFromPrimitiveList/finalizers": [
        "example.com/hold"]}})
    assert [s.metadata.name for s in core.list_namespaced_service("default").items if s.metadata.name == "patched"] \
        == []
