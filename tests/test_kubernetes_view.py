"""The kubernetes backend's reading of the cluster (launcher/backends/kubernetes/view.py) on pods, Jobs and events
shaped as the API returns them: which node each pod is, which pods are lost and why, and the line `status` and
`watch` print. No cluster and no engine: tests/test_kubernetes.py runs the same code against the simulation."""

from __future__ import annotations

from launcher.backends.kubernetes.view import engine_line, fates, waiting

NODES = ["m", "w-0", "w-1"]
JOB = "ml/run-1"


def pod(index: int, phase: str, *, failures: int = 0, node: str | None = "node-a", state: dict | None = None,
        conditions: list | None = None, created: str = "2026-01-01T00:00:00Z") -> dict:
    return {"metadata": {"name": f"run-1-{index}-{failures}abcd", "creationTimestamp": created,
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index),
                                         "batch.kubernetes.io/job-index-failure-count": str(failures)}},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "conditions": conditions or [],
                       "containerStatuses": [{"name": "node", "image": "reg/x@sha256:1", "state": state or {}}]}}


def job(*conditions: tuple[str, str, str], failed_indexes: str | None = None, deleting: bool = False) -> dict:
    status = {"conditions": [{"type": kind, "status": "True", "reason": reason, "message": message}
                             for kind, reason, message in conditions]}
    if failed_indexes:
        status["failedIndexes"] = failed_indexes
    return {"metadata": {"name": "run-1", **({"deletionTimestamp": "x"} if deleting else {})}, "status": status}


KILLED = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T00:01:00Z"}}


def test_a_failed_pod_whose_index_the_job_runs_again_reads_as_running_and_its_newest_pod_counts():
    pods = [pod(0, "Running"), pod(1, "Failed", state=KILLED), pod(1, "Running", failures=1), pod(2, "Failed",
                                                                                                 state=KILLED)]
    seen = fates(NODES, JOB, job(), pods, lambda p: ("never read",))
    assert seen["m"].running and seen["w-0"].running and seen["w-0"].reason is None  # the replacement runs
    assert seen["w-1"].running and "the Job controller starts index 2 again" in seen["w-1"].reason


def test_a_pod_that_ended_for_good_gives_its_end_the_jobs_end_and_its_last_log_lines():
    failed = job(("Failed", "MaxFailedIndexesExceeded", "Job has exceeded the specified maximal number of failed "
                                                        "indexes"), failed_indexes="2")
    pods = [pod(0, "Succeeded", state={"terminated": {"exitCode": 0, "reason": "Completed"}}),
            pod(1, "Running"), pod(2, "Failed", state=KILLED)]
    seen = fates(NODES, JOB, failed, pods, lambda p: ("Killed",))
    lost = seen["w-1"]
    assert not lost.running and lost.exit_code == 137 and lost.last_output == ("Killed",)
    assert lost.reason == ("Kubernetes: pod run-1-2-0abcd on node node-a: container OOMKilled (exit code 137); Job "
                           "failed: MaxFailedIndexesExceeded: Job has exceeded the specified maximal number of "
                           "failed indexes")
    assert lost.ended_at == 1767225660.0
    assert seen["m"].exit_code == 0 and seen["m"].last_output == ()  # a pod that succeeded: no log read


def test_a_disrupted_pod_says_how_and_a_job_that_is_gone_says_so():
    evicted = pod(1, "Failed", state=KILLED, conditions=[{"type": "DisruptionTarget", "status": "True",
                                                          "reason": "EvictionByEvictionAPI",
                                                          "message": "Eviction API: evicting"}])
    seen = fates(NODES, JOB, job(failed_indexes="1"), [pod(0, "Running"), evicted], lambda p: ())
    assert "was disrupted (EvictionByEvictionAPI: Eviction API: evicting)" in seen["w-0"].reason
    assert seen["w-1"].running  # no pod yet: the Job creates it
    gone = fates(NODES, JOB, None, [], lambda p: ())
    assert all(not fate.running and "Kubernetes Job ml/run-1 is gone" in fate.reason for fate in gone.values())


def test_why_a_pod_waits_in_the_clusters_words():
    unscheduled = pod(2, "Pending", node=None, conditions=[{"type": "PodScheduled", "status": "False",
                                                            "reason": "Unschedulable", "message": "condition's"}])
    event = {"reason": "FailedScheduling", "message": "0/12 nodes are available: 12 Insufficient nvidia.com/gpu."}
    assert waiting(unscheduled, [event]) == f"FailedScheduling: {event['message']}"
    assert waiting(unscheduled, []) == "FailedScheduling: condition's"
    backoff = pod(0, "Pending", state={"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}})
    assert waiting(backoff, []) == "ImagePullBackOff: image reg/x@sha256:1: Back-off pulling"
    assert waiting(pod(0, "Pending", state={"waiting": {"reason": "ContainerCreating"}}), []) is None
    assert waiting(pod(0, "Running"), [event]) is None


def test_the_line_for_status_and_watch():
    pods = [pod(0, "Running", node="node-b"), pod(1, "Running", failures=1),
            pod(2, "Pending", node=None, conditions=[{"type": "PodScheduled", "status": "False",
                                                      "message": "0/3 nodes are available: 3 Insufficient cpu."}])]
    line = engine_line(JOB, job(), pods, {})
    assert line == ("Kubernetes Job ml/run-1: 2 pods running (on node-a, node-b), 1 pod pending; index 1 started "
                    "again 1 time; pod run-1-2-0abcd (index 2) pending: FailedScheduling: 0/3 nodes are available: "
                    "3 Insufficient cpu.")
    assert engine_line(JOB, job(deleting=True), [], {}) == "Kubernetes Job ml/run-1: no pods yet; Job being deleted"
    assert engine_line(JOB, None, [], {}) == "Kubernetes Job ml/run-1: gone from the cluster"
