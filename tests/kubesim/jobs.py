"""The Job controller (Indexed Jobs) and the garbage collector of the simulated control plane.

Job rules, from https://kubernetes.io/docs/concepts/workloads/controllers/job/:

- Indexed completion mode: one pod per index 0..completions-1 (up to ``parallelism`` at once), named
  ``JOB-INDEX-RANDOM``, its hostname ``JOB-INDEX``, the index in the annotation and label
  ``batch.kubernetes.io/job-completion-index`` and in the env ``JOB_COMPLETION_INDEX``; the Job completes when
  every index has a succeeded pod (``status.completedIndexes``).
- Backoff limit per index: a failed pod's index is started again with ``batch.kubernetes.io/
  job-index-failure-count`` one higher, until its failures exceed ``backoffLimitPerIndex``; then the index fails
  (``status.failedIndexes``), and the Job fails once more indexes failed than ``maxFailedIndexes`` (or, all others
  done, with any failed index: reason FailedIndexes).
- Pod failure policy: a terminal failed pod is checked against the rules in order; the first that matches acts:
  ``FailJob`` fails the Job (reason PodFailurePolicy) and terminates its pods, ``Ignore`` does not count the
  failure, ``Count`` counts it as usual, ``FailIndex`` fails the index at once; none matching counts it.
  ``onExitCodes`` (``In``/``NotIn``; for NotIn, exit code 0 never matches), ``onPodConditions`` (type and status).
- The controller tracks pods with the finalizer ``batch.kubernetes.io/job-tracking`` and removes it once it has
  counted the pod (so a pod deleted before it was counted stays until it is).
- ``ttlSecondsAfterFinished``: a finished Job is deleted (background) that many seconds after it finished.

Garbage collection, from https://kubernetes.io/docs/concepts/architecture/garbage-collection/: dependents carry
``ownerReferences``; Background deletion removes the owner at once and then its dependents; Foreground keeps the
owner (``foregroundDeletion`` finalizer, deletionTimestamp set) until its dependents with
``blockOwnerDeletion`` are gone; Orphan removes the owner and leaves the dependents without the reference.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from kubesim.store import ApiError, Store, now

TRACKING = "batch.kubernetes.io/job-tracking"
FOREGROUND = "foregroundDeletion"
INDEX = "batch.kubernetes.io/job-completion-index"
FAILURES = "batch.kubernetes.io/job-index-failure-count"
IGNORED = "batch.kubernetes.io/job-index-ignored-failure-count"
TERMINAL = ("Succeeded", "Failed")


def intervals(indexes: set[int]) -> str:
    """``0-2,5``: the API's compressed form of a set of indexes."""
    ranges: list[list[int]] = []
    for index in sorted(indexes):
        if ranges and index == ranges[-1][1] + 1:
            ranges[-1][1] = index
        else:
            ranges.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def parse_intervals(text: str | None) -> set[int]:
    found: set[int] = set()
    for part in (text or "").split(","):
        if part:
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return found


class JobController:
    def __init__(self, store: Store, terminate: Any) -> None:
        self.store = store
        self.terminate = terminate  # (namespace, pod name, reason) -> None: delete a pod as the controller does
        self._index_failures: dict[str, dict[int, int]] = {}  # Job uid -> index -> failures counted
        self._finished_at: dict[str, float] = {}  # Job uid -> when it finished (for ttlSecondsAfterFinished)
        self._thread = threading.Thread(target=self._loop, name="kubesim-jobs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        seen = -1
        while not self.store.closed:
            seen = self.store.after(seen, 1.0)  # woken by every change; the second is for ttlSecondsAfterFinished
            for job in self.store.items("jobs")[0]:
                try:
                    self._sync(job)
                except ApiError:  # changed meanwhile (deleted, say): the next pass sees it as it is
                    pass
            self._collect_garbage()

    # -- one Job ---------------------------------------------------------------------------------------------------

    def _pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        uid = job["metadata"]["uid"]
        return [pod for pod in self.store.items("pods", job["metadata"]["namespace"])[0]
                if any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences", []))]

    def _sync(self, job: dict[str, Any]) -> None:
        meta, spec, status = job["metadata"], job["spec"], job.get("status") or {}
        namespace, name = meta["namespace"], meta["name"]
        if spec.get("completionMode") != "Indexed":
            return  # the simulation runs Indexed Jobs only
        pods = self._pods(job)
        finished = _condition(status, "Complete") or _condition(status, "Failed")
        for pod in pods:
            if pod["status"].get("phase") in TERMINAL and TRACKING in pod["metadata"].get("finalizers", []):
                self._count(job, pod)
                return  # counted one: the next pass sees the Job as it is now
        if finished:
            self._expire(job, status)
            return
        if "deletionTimestamp" in meta:
            return
        if _condition(status, "FailureTarget"):
            return self._end_when_terminated(job, pods, "Failed")
        failed, done = parse_intervals(status.get("failedIndexes")), parse_intervals(status.get("completedIndexes"))
        active = {int(pod["metadata"]["annotations"][INDEX]) for pod in pods
                  if pod["status"].get("phase") not in TERMINAL}
        completions = int(spec["completions"])
        if len(done) + len(failed) == completions:
            if failed:
                return self._fail(job, "FailedIndexes", "Job has failed indexes")
            return self._update_status(namespace, name, lambda s: _set_condition(
                s, "Complete", "CompletionsReached", "Reached expected number of succeeded pods",
                completionTime=now()))
        wanted = [index for index in range(completions) if index not in done | failed | active]
        room = int(spec.get("parallelism", 1)) - len(active)
        for index in wanted[:max(room, 0)]:
            self._create_pod(job, index, self._failures(job, index))
        self._update_status(namespace, name, lambda s: s.update(
            active=len(active) + len(wanted[:max(room, 0)]), startTime=s.get("startTime") or now()))

    def _failures(self, job: dict[str, Any], index: int) -> int:
        return self._index_failures.get(job["metadata"]["uid"], {}).get(index, 0)

    def _count(self, job: dict[str, Any], pod: dict[str, Any]) -> None:
        """Account for a terminal pod once: its index succeeded, or its failure under the policy; then let go of
        it (the tracking finalizer)."""
        meta, spec = job["metadata"], job["spec"]
        index = int(pod["metadata"]["annotations"][INDEX])
        succeeded = pod["status"]["phase"] == "Succeeded"
        action = None if succeeded else _policy_action(spec.get("podFailurePolicy"), pod)
        finished = _condition(job.get("status") or {}, "Complete") or _condition(job.get("status") or {}, "Failed")

        counts = self._index_failures.setdefault(meta["uid"], {})

        def change(status: dict[str, Any]) -> None:
            if finished:
                return
            if succeeded:
                status["succeeded"] = status.get("succeeded", 0) + 1
                status["completedIndexes"] = intervals(parse_intervals(status.get("completedIndexes")) | {index})
                return
            if action == "Ignore":
                return
            status["failed"] = status.get("failed", 0) + 1
            counts[index] = counts.get(index, 0) + 1
            limit = spec.get("backoffLimitPerIndex")
            if action == "FailJob":
                _set_condition(status, "FailureTarget", "PodFailurePolicy",
                               f"Container {_failed_container(pod)} for pod {pod['metadata']['namespace']}/"
                               f"{pod['metadata']['name']} failed with exit code {_exit_code(pod)} matching "
                               f"FailJob rule at index {_rule_index(spec['podFailurePolicy'], pod)}")
            elif action == "FailIndex" or (limit is not None and counts[index] > int(limit)):
                failed = parse_intervals(status.get("failedIndexes")) | {index}
                status["failedIndexes"] = intervals(failed)
                most = spec.get("maxFailedIndexes")
                if most is not None and len(failed) > int(most):
                    _set_condition(status, "FailureTarget", "MaxFailedIndexesExceeded",
                                   "Job has exceeded the specified maximal number of failed indexes")

        self._update_status(meta["namespace"], meta["name"], change)
        self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                          lambda body: body["metadata"].__setitem__(
                              "finalizers", [f for f in body["metadata"].get("finalizers", []) if f != TRACKING]))

    def _fail(self, job: dict[str, Any], reason: str, message: str) -> None:
        meta = job["metadata"]
        self._update_status(meta["namespace"], meta["name"], lambda s: _set_condition(s, "FailureTarget", reason,
                                                                                      message))

    def _end_when_terminated(self, job: dict[str, Any], pods: list[dict[str, Any]], condition: str) -> None:
        """A Job that is to fail terminates its running pods, and reads Failed once none is left running."""
        running = [pod for pod in pods if pod["status"].get("phase") not in TERMINAL]
        for pod in running:
            if "deletionTimestamp" not in pod["metadata"]:
                self.terminate(pod["metadata"]["namespace"], pod["metadata"]["name"], None)
        if running:
            return
        target = next(c for c in job["status"]["conditions"] if c["type"] == "FailureTarget")
        self._update_status(job["metadata"]["namespace"], job["metadata"]["name"], lambda s: _set_condition(
            s, condition, target["reason"], target["message"], active=0))

    def _expire(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        ended = self._finished_at.setdefault(job["metadata"]["uid"], time.time())
        if ttl is None or time.time() < ended + int(ttl) or "deletionTimestamp" in job["metadata"]:
            return
        self.store.mark_deleted("jobs", job["metadata"]["namespace"], job["metadata"]["name"])

    def _create_pod(self, job: dict[str, Any], index: int, failures: int) -> None:
        meta, spec = job["metadata"], job["spec"]
        template = spec["template"]
        hostname = f"{meta['name']}-{index}"
        annotations = {**template["metadata"].get("annotations", {}), INDEX: str(index)}
        if spec.get("backoffLimitPerIndex") is not None:
            annotations[FAILURES] = str(failures)
        pod_spec = {**template["spec"], "hostname": hostname}
        pod_spec["containers"] = [{**container, "env": [*container.get("env", []), {
            "name": "JOB_COMPLETION_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX}']"}}}]}
            for container in template["spec"]["containers"]]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{hostname}-{uuid.uuid4().hex[:5]}", "namespace": meta["namespace"],
                            "uid": str(uuid.uuid4()),
                            "labels": {**template["metadata"].get("labels", {}), INDEX: str(index)},
                            "annotations": annotations, "finalizers": [TRACKING],
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                                 "uid": meta["uid"], "controller": True,
                                                 "blockOwnerDeletion": True}]},
               "spec": pod_spec, "status": {"phase": "Pending", "qosClass": "BestEffort"}}
        self.store.create("pods", meta["namespace"], pod)

    def _update_status(self, namespace: str, name: str, change: Any) -> None:
        self.store.update("jobs", namespace, name, lambda body: change(body.setdefault("status", {})))

    # -- garbage collection ----------------------------------------------------------------------------------------

    def _collect_garbage(self) -> None:
        owners = {job["metadata"]["uid"]: job for job in self.store.items("jobs")[0]}
        for pod in self.store.items("pods")[0]:
            refs = pod["metadata"].get("ownerReferences", [])
            owner = next((owners.get(ref["uid"]) for ref in refs if ref.get("controller")), None)
            gone = refs and owner is None
            foreground = owner is not None and FOREGROUND in owner["metadata"].get("finalizers", [])
            if (gone or foreground) and "deletionTimestamp" not in pod["metadata"]:
                self.terminate(pod["metadata"]["namespace"], pod["metadata"]["name"], None)
        for job in owners.values():
            if FOREGROUND in job["metadata"].get("finalizers", []) and not self._pods(job):
                self.store.update("jobs", job["metadata"]["namespace"], job["metadata"]["name"],
                                  lambda body: body["metadata"].__setitem__(
                                      "finalizers", [f for f in body["metadata"]["finalizers"] if f != FOREGROUND]))


def _condition(status: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in status.get("conditions", []))


def _set_condition(status: dict[str, Any], kind: str, reason: str, message: str, **also: Any) -> None:
    if _condition(status, kind):
        return
    status.setdefault("conditions", []).append({"type": kind, "status": "True", "reason": reason, "message": message,
                                                "lastProbeTime": now(), "lastTransitionTime": now()})
    status.update(also)


def _terminated(pod: dict[str, Any]) -> list[tuple[str, int]]:
    return [(c["name"], int(c["state"]["terminated"]["exitCode"])) for c in pod["status"].get("containerStatuses", [])
            if "terminated" in c.get("state", {})]


def _exit_code(pod: dict[str, Any]) -> int | None:
    return next((code for _, code in _terminated(pod) if code), None)


def _failed_container(pod: dict[str, Any]) -> str | None:
    return next((name for name, code in _terminated(pod) if code), None)


def _rule_matches(rule: dict[str, Any], pod: dict[str, Any]) -> bool:
    codes = rule.get("onExitCodes")
    if codes:
        values = set(codes["values"])
        for name, code in _terminated(pod):
            if codes.get("containerName") not in (None, name):
                continue
            if (codes["operator"] == "In" and code in values) or \
                    (codes["operator"] == "NotIn" and code != 0 and code not in values):
                return True
        return False
    return any(any(c["type"] == wanted["type"] and c["status"] == wanted.get("status", "True")
                   for c in pod["status"].get("conditions", [])) for wanted in rule.get("onPodConditions", []))


def _rule_index(policy: dict[str, Any], pod: dict[str, Any]) -> int:
    return next(i for i, rule in enumerate(policy["rules"]) if _rule_matches(rule, pod))


def _policy_action(policy: dict[str, Any] | None, pod: dict[str, Any]) -> str | None:
    for rule in (policy or {}).get("rules", []):
        if _rule_matches(rule, pod):
            return rule["action"]
    return None
