"""The cluster's view of a run, from its Job, the Job's pods and their events as the API returns them (plain dicts):
each node's fate (:func:`fates`) and one line for ``status`` and ``watch`` (:func:`engine_line`). Pure: no I/O.

A pod's index is its node (``batch.kubernetes.io/job-completion-index``, the spec's order); of several pods of one
index (a lost pod started again), the newest counts. Words come from the cluster: the scheduler's
``FailedScheduling`` message, a container's waiting reason and message (``ImagePullBackOff``), its terminated
reason (``OOMKilled``), a ``DisruptionTarget`` condition (evicted, preempted), the Job's own conditions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

from launcher.backends.base import NodeFate
from launcher.backends.kubernetes.objects import CONTAINER, FAILURE_COUNT
from launcher.wording import plural

INDEX = "batch.kubernetes.io/job-completion-index"
TERMINAL = ("Succeeded", "Failed")


def index_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"].get("annotations", {}).get(INDEX, -1))


def newest_pods(pods: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Index -> its newest pod (the highest failure count, then the latest created)."""
    newest: dict[int, Mapping[str, Any]] = {}
    for pod in sorted(pods, key=lambda p: (int(p["metadata"].get("annotations", {}).get(FAILURE_COUNT, 0)),
                                           p["metadata"].get("creationTimestamp") or "")):
        newest[index_of(pod)] = pod
    return newest


def _condition(body: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in (body.get("status") or {}).get("conditions") or []
                 if c.get("type") == kind and c.get("status") == "True"), None)


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == CONTAINER), statuses[0] if statuses else {})


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def job_end(job: Mapping[str, Any] | None) -> str | None:
    """How the Job ended or is ending, in its controller's words (None: it goes on)."""
    if job is None:
        return None
    for kind in ("Failed", "FailureTarget"):
        found = _condition(job, kind)
        if found:
            return f"failed: {found.get('reason')}: {found.get('message')}"
    return "complete" if _condition(job, "Complete") else None


def waiting(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a pod that has not started waits: the scheduler's reason, an image that cannot be pulled, a Secret it
    lacks (None: it is on its way)."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending":
        return None
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled is not None and scheduled.get("status") == "False":
        said = [e for e in events if e.get("reason") == "FailedScheduling"]
        message = said[-1].get("message") if said else scheduled.get("message")
        return f"FailedScheduling: {message}"
    container = _container(pod)
    state = (container.get("state") or {}).get("waiting") or {}
    if state.get("reason") and state["reason"] not in ("ContainerCreating", "PodInitializing"):
        image = f" image {container.get('image')}" if "Image" in state["reason"] else ""  # ErrImagePull, ...BackOff
        return f"{state['reason']}:{image}: {state.get('message') or ''}".rstrip(": ")
    return None


def ended(pod: Mapping[str, Any]) -> str:
    """How a pod ended, for a cause: disrupted (evicted, preempted, deleted by the cluster), or its container's end."""
    meta, status = pod["metadata"], pod.get("status") or {}
    where = f" on node {pod['spec']['nodeName']}" if (pod.get("spec") or {}).get("nodeName") else ""
    disrupted = _condition(pod, "DisruptionTarget")
    if disrupted:
        return f"Kubernetes: pod {meta['name']}{where} was disrupted ({disrupted.get('reason')}: " \
               f"{disrupted.get('message')})"
    terminated = (_container(pod).get("state") or {}).get("terminated") or {}
    if terminated:
        return f"Kubernetes: pod {meta['name']}{where}: container {terminated.get('reason')} " \
               f"(exit code {terminated.get('exitCode')})"
    return f"Kubernetes: pod {meta['name']}{where} ended {status.get('phase', '')}".rstrip()


def _exit_code(pod: Mapping[str, Any]) -> int | None:
    code = ((_container(pod).get("state") or {}).get("terminated") or {}).get("exitCode")
    return None if code is None else int(code)


def fates(nodes: Sequence[str], job_ref: str, job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]],
          last_lines: Callable[[Mapping[str, Any]], tuple[str, ...]]) -> dict[str, NodeFate]:
    """Each node's fate: its newest pod running (or waiting), ended, or started again by the Job controller (a
    failed pod whose index the Job still runs reads as running); ``last_lines`` gives a failed pod's last log
    lines (a container that died before launcher's node could say why)."""
    newest = newest_pods(pods)
    going_on = job is not None and job_end(job) is None and "deletionTimestamp" not in job["metadata"]
    failed_indexes = _indexes((job or {}).get("status", {}).get("failedIndexes"))
    result: dict[str, NodeFate] = {}
    for index, name in enumerate(nodes):
        pod = newest.get(index)
        if pod is None:
            result[name] = NodeFate(True) if going_on else NodeFate(
                False, None, f"Kubernetes Job {job_ref} is gone (deleted, or by its ttlSecondsAfterFinished)"
                if job is None else f"Kubernetes Job {job_ref} has no pod for it ({job_end(job) or 'deleted'})")
            continue
        phase = (pod.get("status") or {}).get("phase")
        if phase not in TERMINAL:
            result[name] = NodeFate(True)
        elif phase == "Failed" and going_on and index not in failed_indexes:
            result[name] = NodeFate(True, reason=f"{ended(pod)}; the Job controller starts index {index} again")
        else:
            end = job_end(job) or ""
            why = ended(pod) + (f"; Job {end}" if end.startswith("failed") else "")
            result[name] = NodeFate(False, _exit_code(pod), why, None,
                                    _epoch(((_container(pod).get("state") or {}).get("terminated") or {})
                                           .get("finishedAt")),
                                    last_lines(pod) if phase == "Failed" else ())
    return result


def _indexes(text: str | None) -> set[int]:
    found: set[int] = set()
    for part in (text or "").split(","):
        if part:
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return found


def engine_line(job_ref: str, job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]],
                events: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """``Kubernetes Job NS/NAME: 2 pods running (on node-a, node-b), 1 pending; pod P: FailedScheduling: ...``."""
    if job is None:
        return f"Kubernetes Job {job_ref}: gone from the cluster"
    newest = newest_pods(pods)
    counts: dict[str, list[str]] = {}
    details: list[str] = []
    for index, pod in sorted(newest.items()):
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        counts.setdefault(phase.lower(), []).append((pod.get("spec") or {}).get("nodeName") or "")
        why = waiting(pod, events.get(pod["metadata"]["name"], ()))
        if why:
            details.append(f"pod {pod['metadata']['name']} (index {index}) pending: {why}")
        elif phase == "Failed":
            details.append(ended(pod).removeprefix("Kubernetes: "))
        restarts = int(pod["metadata"].get("annotations", {}).get(FAILURE_COUNT, 0))
        if restarts:
            details.append(f"index {index} started again {plural(restarts, 'time')}")
    parts = []
    for phase, hosts in counts.items():
        on = sorted({host for host in hosts if host})
        parts.append(f"{plural(len(hosts), 'pod')} {phase}" + (f" (on {', '.join(on)})" if on else ""))
    state = job_end(job) or ("being deleted" if "deletionTimestamp" in job["metadata"] else None)
    head = f"Kubernetes Job {job_ref}: " + (", ".join(parts) or "no pods yet") + (f"; Job {state}" if state else "")
    return "; ".join([head, *details])
