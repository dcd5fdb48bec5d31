"""A simulation of a Kubernetes API server and its cluster, for the kubernetes backend's tests, written from the
Kubernetes documentation (each module cites the pages it follows), not from the backend:

- :mod:`.server`: the HTTP API (discovery, create/get/list/watch/delete, pod logs, evictions), bodies checked
  against the official schema of the simulated version (:mod:`.admission`);
- :mod:`.store`: objects, resourceVersions, watches' history, finalizers;
- :mod:`.jobs`: the Job controller's Indexed-Job rules and the garbage collector;
- :mod:`.kubelet`: the scheduler and a kubelet that runs each pod as a container on the real Docker engine, on
  one network where pods reach each other by ``hostname.subdomain``.

No Kubernetes API server can be installed on these machines; both the ``kubernetes`` Python client and ``kubectl``
talk to this one as they would to a cluster.
"""

from __future__ import annotations

import base64
import tempfile
import uuid
from pathlib import Path
from typing import Any

from kubesim import admission, server
from kubesim.forward import Relay
from kubesim.jobs import JobController
from kubesim.kubelet import Kubelet, set_condition
from kubesim.store import ApiError, Store, now

VERSION = "1.31"


class KubeSim:
    """``KubeSim(nodes=3)``: three nodes of 8 CPUs, 32Gi and ``gpus`` nvidia.com/gpu each, namespace default."""

    def __init__(self, *, nodes: int = 3, cpu: str = "8", memory: str = "32Gi", gpus: int = 0,
                 version: str = VERSION) -> None:
        import docker

        self.id = uuid.uuid4().hex[:8]
        self.version = version
        self.store = Store()
        self._root = tempfile.mkdtemp(prefix=f"kubesim-{self.id}-")
        self.network = f"kubesim-{self.id}"
        engine = docker.from_env()
        created = engine.networks.create(self.network, driver="bridge", labels={"kubesim.sim": self.id})
        created.reload()
        self.gateway = created.attrs["IPAM"]["Config"][0]["Gateway"]
        self._relays: list[Relay] = []
        self.store.create("namespaces", None, {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": "default"}, "status": {"phase": "Active"}})
        machines = []
        for number in range(nodes):
            allocatable = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": "110"}
            name = f"kubesim-node-{number}"
            labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
            machines.append({"name": name, "labels": labels, "allocatable": allocatable})
            self.store.create("nodes", None, {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name, "labels": labels}, "status": {"allocatable": allocatable, "capacity": allocatable,
                                                            "conditions": [{"type": "Ready", "status": "True"}]}})
        self.kubelet = Kubelet(self.store, self.id, self.network, machines, self._root, self.record_event)
        self.jobs = JobController(self.store, lambda namespace, name, _: self._delete_pod(namespace, name, {}))
        self._http = server.serve(server.Api(self.store, version, self.kubelet.logs, self._admit, self.delete))
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self.kubelet.start()
        self.jobs.start()

    # -- what the tests use ----------------------------------------------------------------------------------------

    def kubeconfig(self, path: Path, context: str = "kubesim") -> Path:
        import yaml

        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "kubesim", "cluster": {"server": self.url}}],
            "users": [{"name": "kubesim", "user": {"token": "kubesim"}}],
            "contexts": [{"name": context, "context": {"cluster": "kubesim", "user": "kubesim",
                                                       "namespace": "default"}}]}))
        return path

    def expose(self, port: int) -> str:
        """``HOST:PORT`` at which the pods reach this machine's loopback ``port``."""
        relay = Relay(self.gateway, port)
        self._relays.append(relay)
        return relay.address

    def evict(self, namespace: str, name: str) -> None:
        """The control plane evicts the pod (a node drained, say): DisruptionTarget, then deletion."""
        self.delete("pods", namespace, name, {"eviction": True})

    def containers(self) -> list[str]:
        """The ids of the Docker containers the simulation's pods run in now."""
        import docker

        found = docker.from_env().api.containers(all=True, filters={"label": f"kubesim.sim={self.id}"})
        return [item["Id"] for item in found]

    def stop(self) -> None:
        import docker

        self.store.close()
        self._http.shutdown()
        self._http.server_close()
        for relay in self._relays:
            relay.close()
        self.kubelet.stop_all()
        docker.from_env().networks.get(self.network).remove()

    # -- the API's verbs beyond the store --------------------------------------------------------------------------

    def _admit(self, resource: str, body: dict[str, Any], validation: str) -> str | None:
        warning = admission.admit(resource, body, self.version, validation)
        if resource == "secrets" and body.get("stringData"):  # write-only: merged into data (Secret docs)
            body["data"] = {**body.get("data", {}), **{key: base64.b64encode(value.encode()).decode()
                                                       for key, value in body.pop("stringData").items()}}
        return warning

    def delete(self, resource: str, namespace: str | None, name: str,
               options: dict[str, Any]) -> dict[str, Any] | None:
        """Delete as the API does: pods gracefully, Jobs by propagationPolicy (the batch/v1 Job's default is Orphan,
        for compatibility; kubectl asks for Background), everything else at once. The object as it is left (marked
        for deletion), or None where it went at once."""
        if resource == "pods":
            return self._delete_pod(namespace or "", name, options)
        if resource == "jobs":
            policy = options.get("propagationPolicy") or "Orphan"
            if policy == "Foreground":
                return self.store.mark_deleted(resource, namespace, name, finalizers=("foregroundDeletion",))
            if policy == "Orphan":
                job = self.store.get(resource, namespace, name)
                for pod in self.store.items("pods", namespace)[0]:
                    refs = pod["metadata"].get("ownerReferences", [])
                    if any(ref["uid"] == job["metadata"]["uid"] for ref in refs):
                        self.store.update("pods", namespace, pod["metadata"]["name"], lambda body: body[
                            "metadata"].__setitem__("ownerReferences", [r for r in refs if r["uid"] !=
                                                                        job["metadata"]["uid"]]))
            elif policy != "Background":
                raise ApiError(422, "Invalid", f"propagationPolicy: Unsupported value: {policy!r}")
        return self.store.mark_deleted(resource, namespace, name)

    def _delete_pod(self, namespace: str, name: str, options: dict[str, Any]) -> dict[str, Any] | None:
        pod = self.store.get("pods", namespace, name)
        if options.get("eviction"):
            self.store.update("pods", namespace, name, lambda body: set_condition(
                body["status"], "DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting"))
        grace = options.get("gracePeriodSeconds")
        grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace)
        return self.store.mark_deleted("pods", namespace, name, grace=grace)

    def record_event(self, pod: dict[str, Any], kind: str, reason: str, message: str, component: str) -> None:
        meta = pod["metadata"]
        try:
            self.store.create("events", meta["namespace"], {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta["uid"]},
                "reason": reason, "message": message, "type": kind, "source": {"component": component},
                "reportingComponent": component, "firstTimestamp": now(), "lastTimestamp": now(), "count": 1})
        except ApiError:
            pass
