"""Kubernetes: the run as one Indexed Job and a headless Service (:mod:`.objects`), every object checked against
the official schema of the cluster's version (:mod:`.schemas`), created through the official ``kubernetes`` client
(:mod:`.cluster`) exactly as ``launcher run --dry-run`` prints them. The nodes need nothing more than these
objects: they meet in the work dir as on every backend. The Job controller starts a lost pod's index again itself;
``status`` and ``watch`` show the cluster's view beside the work dir's (:mod:`.view`); ``cancel`` asks the nodes
through the work dir, then deletes the Job (foreground) and the Service.
"""

from __future__ import annotations

import json
from typing import Any

from launcher.backends.base import Backend, DryRun, NodeFate, Request
from launcher.backends.kubernetes.objects import CONTAINER, NODE_ENTRY, PYTHON, gpus_per_pod, workload
from launcher.errors import BackendError, BadInput
from launcher.plan import Plan
from launcher.runs.state import RunInfo
from launcher.spec.model import KubernetesInfra, Spec
from launcher.workdirs import scheme

DEFAULT_NAMESPACE = "default"
GONE_SECONDS = 120.0  # how long cancel waits for the deleted Job's pods to go (their containers stopped)
LOG_LINES = 20  # of a failed pod's own log, for a container that died before launcher's node could say why


def _infra(spec: Spec) -> KubernetesInfra:
    return spec.infra if isinstance(spec.infra, KubernetesInfra) else KubernetesInfra()


class KubernetesBackend(Backend):
    name = "kubernetes"
    node_command = (PYTHON, "-m", NODE_ENTRY)
    _cluster: Any = None  # the connection (a Cluster), made once per command
    _version: str | None = None  # the cluster's version, as check() read it

    def work_dir(self, spec: Spec) -> tuple[str, list[str]]:
        """An object store, or a directory on a volume every pod mounts; never a directory of this machine."""
        url, notes = super().work_dir(spec)
        if scheme(url) != "file":
            return url, notes
        mounts = [volume["mountPath"].rstrip("/") for volume in _infra(spec).volumes]
        if url.startswith("/") and any(url == mount or url.startswith(mount + "/") for mount in mounts):
            return url, notes + [f"the work dir {url} is on a volume every pod mounts; launcher reads it from this "
                                 "machine only where it is mounted at the same path here"]
        raise BadInput(f"spec.cluster.spec.workDir {url!r}: pods cannot reach a directory of this machine; use "
                       "s3://bucket/prefix or oci://bucket@namespace/prefix, or an absolute path on a "
                       "PersistentVolumeClaim the spec mounts (infrastructure.spec.volumes)")

    def built_image(self, spec: Spec) -> str | None:
        """What "@image" names: the image `launcher build --push` pushed for this spec, by digest (None: not
        pushed; a cluster cannot pull an image that is only on this machine)."""
        from launcher.image import records

        record = records.load(spec.source)
        return record.pushed if record else None

    def requests(self, plan: Plan) -> list[Request]:
        """One create per object, in order (the Service first: the pods' DNS names exist when they start)."""
        from launcher.backends.kubernetes import schemas

        namespace = _infra(plan.spec).namespace or DEFAULT_NAMESPACE
        objects = workload(plan, namespace)
        schemas.check(objects)
        return [Request("create", f"{body['kind']}/{namespace}/{body['metadata']['name']}", body) for body in objects]

    def dryrun(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> DryRun:
        from dataclasses import replace

        from launcher.backends.kubernetes import schemas

        request = super().dryrun(spec, run_id=run_id, resume_from=resume_from)
        notes = [f"every object validates against the official schema of Kubernetes {schemas.OLDEST} (and later); "
                 "run checks them against the cluster's own version first"]
        if not _infra(spec).namespace:
            notes.append(f"namespace {DEFAULT_NAMESPACE} (infrastructure.spec.namespace to choose one)")
        gpus = gpus_per_pod(request.plan)
        if gpus and _infra(spec).gpus is None:
            notes.append(f"processesPerNode: {gpus} asks for {gpus} nvidia.com/gpu per pod; on nodes without GPUs set "
                         "infrastructure.spec.resources.gpus: 0")
        notes += [f"run would refuse: {problem}" for problem in self._problems(request)]
        return replace(request, notes=request.notes + tuple(notes))

    def manifest(self, request: DryRun) -> str:
        import yaml

        return yaml.safe_dump_all([item.body for item in request.requests], sort_keys=False)

    def pytorchjob(self, request: DryRun) -> tuple[list[str], str]:
        """The run as a Kubeflow PyTorchJob (an export: launcher does not submit it), checked, and its notes."""
        import yaml

        from launcher.backends.kubernetes.pytorchjob import NODE_ENTRY, SDK_VERSION, export

        spec = request.plan.spec
        namespace = _infra(spec).namespace or DEFAULT_NAMESPACE
        body = export(request.plan, namespace)
        notes = [f"a Kubeflow PyTorchJob ({body['apiVersion']}) for a cluster that runs the training operator; "
                 "launcher does not submit, follow or cancel it: kubectl apply -f FILE, kubectl delete pytorchjob "
                 f"{body['metadata']['name']} -n {namespace}",
                 f"checked with the Kubeflow training SDK {SDK_VERSION}'s models (it ships no CRD schema), its pod "
                 "templates against the official Kubernetes schemas, and the training operator's admission rules",
                 f"every pod runs launcher's node bootstrap ({NODE_ENTRY}): the nodes elect the main and their ranks "
                 "in the work dir; the operator's MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and PET_* variables are "
                 "dropped at the pod's start, and torchrun gets launcher's"]
        if "elasticPolicy" in body["spec"]:
            notes.append("elasticPolicy tells the operator the run's bounds; launcher's rounds in the work dir, not "
                         "torchrun's elastic agent, decide who trains")
        grows = json.loads(request.plan.nodes[0].env.get("LAUNCHER_RECOVERY") or "{}").get("maxNodes")
        if grows and grows > len(request.plan.nodes):
            notes.append(f"elastic maxNodes {grows}: an exported PyTorchJob has the spec's {len(request.plan.nodes)} "
                         "nodes (launcher scale needs a run launcher started)")
        notes += [note for note in request.notes if not note.startswith("every object validates")]
        return notes, yaml.safe_dump(body, sort_keys=False)

    @staticmethod
    def _problems(request: DryRun) -> list[str]:
        from launcher.plan import image_tag

        plan = request.plan
        if plan.nodes[0].image == image_tag(plan.spec):  # "@image" that `launcher build --push` has not pushed
            return ['"@image" must be pushed for the cluster to pull it: launcher build -f SPEC --tag '
                    "REGISTRY/REPOSITORY:TAG --push"]
        return []

    def check(self, dryrun: DryRun) -> list[str]:
        """Refuse an image the cluster cannot pull, then ask the cluster its version and check every object against
        that version's schema (a cluster older than a field the run needs is refused, naming the version that has
        it)."""
        from launcher.backends.kubernetes import schemas
        from launcher.backends.kubernetes.cluster import Cluster

        problems = self._problems(dryrun)
        if problems:
            raise BadInput("\n".join(problems))
        cluster = Cluster(_infra(dryrun.plan.spec).context)
        self._version = cluster.version()
        schemas.check_for_cluster([request.body for request in dryrun.requests], self._version)
        self._cluster = cluster
        return []

    def schedule(self, dryrun: DryRun, state_dir: str) -> dict[str, Any]:
        """Create the requests' objects in order (the Service, then the Job); a Job the cluster refuses takes the
        Service just created with it."""
        from launcher.backends.kubernetes.cluster import Cluster

        cluster = self._cluster or Cluster(_infra(dryrun.plan.spec).context)
        created: list[dict[str, Any]] = []
        try:
            for request in dryrun.requests:
                created.append(cluster.create(request.body))
        except BackendError:
            for body in reversed(created):
                cluster.delete(body["kind"], body["metadata"]["namespace"], body["metadata"]["name"])
            raise
        job = created[-1]["metadata"]
        return {"namespace": job["namespace"], "job": job["name"], "service": created[0]["metadata"]["name"],
                "context": _infra(dryrun.plan.spec).context, "server": cluster.server,
                "version": self._version, "uid": job["uid"]}

    def _connect(self, info: RunInfo) -> Any:
        from launcher.backends.kubernetes.cluster import Cluster

        if self._cluster is None:
            self._cluster = Cluster(info.backend_ids.get("context"))
        return self._cluster

    @staticmethod
    def _ref(info: RunInfo) -> tuple[str, str]:
        return info.backend_ids["namespace"], info.backend_ids["job"]

    def node_fates(self, info: RunInfo) -> dict[str, NodeFate]:
        from launcher.backends.kubernetes import view

        if not info.backend_ids.get("job"):
            return {}
        namespace, name = self._ref(info)
        try:
            cluster = self._connect(info)
            job, pods = cluster.job(namespace, name), cluster.pods(namespace, name)
        except BackendError:
            return {}  # the cluster cannot be asked now: the work dir's records stand alone
        return view.fates(info.nodes, f"{namespace}/{name}", job, pods, lambda pod: cluster.log_tail(
            namespace, pod["metadata"]["name"], CONTAINER, LOG_LINES))

    def engine_state(self, info: RunInfo) -> str | None:
        from launcher.backends.kubernetes import view

        if not info.backend_ids.get("job"):
            return None
        namespace, name = self._ref(info)
        try:
            cluster = self._connect(info)
            job, pods = cluster.job(namespace, name), cluster.pods(namespace, name)
            events = {pod["metadata"]["name"]: cluster.events(namespace, pod["metadata"]["name"]) for pod in pods
                      if (pod.get("status") or {}).get("phase") == "Pending"}
        except BackendError as exc:
            return f"Kubernetes Job {namespace}/{name}: cannot be read now: {exc}"
        return view.engine_line(f"{namespace}/{name}", job, pods, events)

    def stop(self, info: RunInfo, grace: float) -> list[str]:
        """The nodes were asked to stop through the work dir; once their pods have ended (or after ``grace``
        seconds), the Job is deleted in the foreground (its pods first) and the Service; returns once they are gone,
        naming the pods that were still running."""
        if not info.backend_ids.get("job"):
            return []
        namespace, name = self._ref(info)
        cluster = self._connect(info)
        cluster.wait(namespace, name, lambda job, pods: not _in_phase(pods, "Running"), grace)
        forced = sorted(pod["metadata"]["name"] for pod in _in_phase(cluster.pods(namespace, name), "Running"))
        cluster.delete("Job", namespace, name, "Foreground")
        cluster.delete("Service", namespace, info.backend_ids.get("service", name))
        if not cluster.wait(namespace, name, lambda job, pods: job is None and not pods, GONE_SECONDS):
            raise BackendError(f"Kubernetes Job {namespace}/{name} was deleted but its pods are still there after "
                               f"{GONE_SECONDS:g}s: kubectl get pods -n {namespace} -l "
                               f"batch.kubernetes.io/job-name={name}")
        return forced

    def release(self, info: RunInfo, *, discard: bool = False) -> list[str]:
        """The run has ended: its Service goes, and its Job too where pods of it still wait to start (nothing is left
        for them to join; those running end on their own); a finished Job stays for ``kubectl logs`` until its
        ttlSecondsAfterFinished, or until ``clean`` (``discard``) deletes it."""
        if not info.backend_ids.get("job"):
            return []
        namespace, name = self._ref(info)
        freed = []
        try:
            cluster = self._connect(info)
            if discard or _in_phase(cluster.pods(namespace, name), "Pending"):
                if cluster.delete("Job", namespace, name, "Background"):
                    freed.append(f"Job {namespace}/{name}")
            service = info.backend_ids.get("service", name)
            if cluster.delete("Service", namespace, service):
                freed.append(f"Service {namespace}/{service}")
        except BackendError:
            return freed  # the next command that sees the run ended tries again
        return freed


def _in_phase(pods: list[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    return [pod for pod in pods if (pod.get("status") or {}).get("phase") == phase]
