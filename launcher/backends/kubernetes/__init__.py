"""Kubernetes: the run as one Indexed Job and a headless Service (:mod:`.objects`), every object checked against
the official schema (:mod:`.schemas`). This version prints them (``launcher run --dry-run``, ``--output yaml`` for
``kubectl apply -f -``); submitting them and following the pods come next: the nodes need nothing more than
these objects, since they meet in the work dir on every backend.
"""

from __future__ import annotations

from launcher.backends.base import Backend, DryRun, Request
from launcher.backends.kubernetes.objects import NODE_ENTRY, PYTHON, gpus_per_pod, workload
from launcher.errors import BackendError, BadInput
from launcher.plan import Plan
from launcher.spec.model import KubernetesInfra, Spec
from launcher.workdirs import scheme

DEFAULT_NAMESPACE = "default"
NOT_YET = "this version of the kubernetes backend prints the run's objects but does not submit them"


def _infra(spec: Spec) -> KubernetesInfra:
    return spec.infra if isinstance(spec.infra, KubernetesInfra) else KubernetesInfra()


class KubernetesBackend(Backend):
    name = "kubernetes"
    node_command = (PYTHON, "-m", NODE_ENTRY)

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
        notes = [f"every object validates against the official schema of Kubernetes {schemas.OLDEST} (and later)"]
        if not _infra(spec).namespace:
            notes.append(f"namespace {DEFAULT_NAMESPACE} (infrastructure.spec.namespace to choose one)")
        gpus = gpus_per_pod(request.plan)
        if gpus and _infra(spec).gpus is None:
            notes.append(f"processesPerNode: {gpus} asks for {gpus} nvidia.com/gpu per pod; on nodes without GPUs set "
                         "infrastructure.spec.resources.gpus: 0")
        notes += [f"run would refuse: {problem}" for problem in self._problems(request)]
        notes.append(f"{NOT_YET}: apply the objects below with kubectl (--output yaml prints them alone)")
        return replace(request, notes=request.notes + tuple(notes))

    def manifest(self, request: DryRun) -> str:
        import yaml

        return yaml.safe_dump_all([item.body for item in request.requests], sort_keys=False)

    @staticmethod
    def _problems(request: DryRun) -> list[str]:
        plan = request.plan
        if plan.image and plan.nodes[0].image == plan.image.tag:
            return ['"@image" must be pushed for the cluster to pull it: launcher build -f SPEC --tag '
                    "REGISTRY/REPOSITORY:TAG --push"]
        return []

    def check(self, dryrun: DryRun) -> list[str]:
        problems = self._problems(dryrun)
        if problems:
            raise BadInput("\n".join(problems))
        raise BackendError(f"{NOT_YET}: launcher run -f SPEC --dry-run --output yaml | kubectl apply -f -")
