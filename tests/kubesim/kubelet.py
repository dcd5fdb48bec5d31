"""The simulated cluster's nodes: a scheduler that binds pods to nodes their requests fit, and a kubelet that runs
each bound pod's container on the real Docker engine, on one network where a pod is reachable by
``hostname.subdomain``.

From the Kubernetes documentation:

- Scheduling (https://kubernetes.io/docs/concepts/scheduling-eviction/kube-scheduler/,
  .../resource-bin-packing/ and .../assign-pod-node/): a pod goes to a node whose allocatable resources hold its
  requests (a container's limits stand for requests it does not state) beside the pods already there, and whose
  labels match its ``nodeSelector``; a pod that fits no node stays Pending with the condition PodScheduled=False,
  reason Unschedulable, and a Warning event FailedScheduling, both saying ``0/N nodes are available: N Insufficient
  nvidia.com/gpu.`` (the scheduler's words, counted per reason).
- Pod lifecycle (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/): phase Pending -> Running ->
  Succeeded (every container exited 0) or Failed; ``containerStatuses[].state`` waiting / running / terminated
  (``exitCode``, ``reason`` Completed, Error or OOMKilled); a deleted pod's containers get SIGTERM and, after its
  grace period (``gracePeriodSeconds``, else ``terminationGracePeriodSeconds``), SIGKILL; the pod object goes once
  they have stopped. Pod disruption conditions (".../pod-lifecycle/#pod-disruption-conditions"): a pod the
  control plane evicts or preempts gets ``DisruptionTarget=True`` before it is deleted.
- Images (https://kubernetes.io/docs/concepts/containers/images/): pulled per ``imagePullPolicy``; a pull that
  fails leaves the container waiting with reason ErrImagePull, then ImagePullBackOff, retried with a back-off.
- Commands (https://kubernetes.io/docs/tasks/inject-data-application/define-command-argument-container/):
  ``command`` replaces the image's entrypoint, ``args`` its cmd; env from values, the downward API
  (``fieldRef``) and Secrets (``secretKeyRef``, ``envFrom.secretRef``); a missing Secret is
  CreateContainerConfigError.
- DNS (https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/): a pod with ``hostname`` and
  ``subdomain`` in a namespace with a headless Service of that name is ``hostname.subdomain.NS.svc.cluster.local``
  (and ``hostname.subdomain`` from the namespace's pods).
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
from typing import Any, Iterator

from kubesim.store import ApiError, Store, now

CONTAINER_LABEL = "kubesim.sim"  # every container of one simulation (its id), for the clean-up
POD_LABEL = "kubesim.pod-uid"
PULL_BACKOFF = (2.0, 5.0, 10.0)  # seconds between pull attempts (the kubelet's back-off, shortened)
SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "k": 10**3, "M": 10**6, "G": 10**9,
          "T": 10**12, "m": 1e-3}


def quantity(text: str | int | float) -> float:
    """A resource quantity (``500m``, ``2``, ``16Gi``) as a number."""
    found = re.fullmatch(r"([0-9.eE+-]+)([A-Za-z]*)", str(text).strip())
    if found is None:
        raise ValueError(f"bad quantity {text!r}")
    return float(found.group(1)) * SUFFIX.get(found.group(2), 1)


def requests_of(pod: dict[str, Any]) -> dict[str, float]:
    total: dict[str, float] = {}
    for container in pod["spec"]["containers"]:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in wanted.items():
            total[name] = total.get(name, 0) + quantity(value)
    return total


class Kubelet:
    """Schedules and runs pods; one thread watches the store, one thread per running pod."""

    def __init__(self, store: Store, sim_id: str, network: str, nodes: list[dict[str, Any]], volumes_root: str,
                 record_event: Any) -> None:
        import docker

        self.store, self.sim_id, self.network, self.nodes = store, sim_id, network, nodes
        self.volumes_root = volumes_root
        self.event = record_event  # (pod, type, reason, message, component) -> None
        self.docker = docker.from_env(timeout=300)
        self._holding: set[str] = set()  # pods whose containers are not yet stopped and removed
        self._containers: dict[str, str] = {}  # pod uid -> container id
        self._unschedulable: dict[str, str] = {}  # pod uid -> the message last reported
        self._stopping: set[str] = set()
        self._done: set[str] = set()  # pods whose container thread has ended
        self._lock = threading.Lock()
        store.hold(lambda resource, body: resource == "pods" and body["metadata"]["uid"] in self._holding)
        self._thread = threading.Thread(target=self._loop, name="kubesim-kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        seen = -1
        while not self.store.closed:
            seen = self.store.after(seen, 1.0)
            pods = self.store.items("pods")[0]
            for pod in pods:
                try:
                    self._sync(pod, pods)
                except ApiError:  # the pod changed or went meanwhile: the next pass sees it
                    pass

    def _sync(self, pod: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta, uid = pod["metadata"], pod["metadata"]["uid"]
        if "deletionTimestamp" in meta:
            if uid in self._holding and uid not in self._stopping:
                self._stopping.add(uid)
                threading.Thread(target=self._stop, args=(pod,), daemon=True).start()
            elif uid not in self._holding and pod["status"].get("phase") not in ("Succeeded", "Failed"):
                # no container ever ran (not scheduled yet): the pod garbage collector makes it Failed
                # (pod-lifecycle, "Pod disruption conditions": DeletionByPodGC)
                self.store.update("pods", meta["namespace"], meta["name"], lambda body: (
                    body["status"].__setitem__("phase", "Failed"),
                    set_condition(body["status"], "DisruptionTarget", "True", "DeletionByPodGC",
                                  "PodGC: node no longer exists")))
            return
        if pod["spec"].get("nodeName") is None:
            self._schedule(pod, pods)
        elif uid not in self._holding and pod["status"].get("phase") == "Pending" \
                and not pod["status"].get("containerStatuses"):
            with self._lock:
                self._holding.add(uid)
            threading.Thread(target=self._run, args=(pod,), name=f"kubesim-pod-{meta['name']}", daemon=True).start()

    # -- the scheduler ---------------------------------------------------------------------------------------------

    def _schedule(self, pod: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        wanted = requests_of(pod)
        reasons: dict[str, int] = {}
        chosen = None
        for node in self.nodes:
            used: dict[str, float] = {}
            for other in pods:
                if other["spec"].get("nodeName") == node["name"] and other["status"].get("phase") not in (
                        "Succeeded", "Failed"):
                    for name, value in requests_of(other).items():
                        used[name] = used.get(name, 0) + value
            selector = pod["spec"].get("nodeSelector") or {}
            if any(node["labels"].get(key) != value for key, value in selector.items()):
                reasons["node(s) didn't match Pod's node affinity/selector"] = \
                    reasons.get("node(s) didn't match Pod's node affinity/selector", 0) + 1
                continue
            short = [name for name, value in wanted.items()
                     if used.get(name, 0) + value > quantity(node["allocatable"].get(name, 0))]
            for name in short:
                reasons[f"Insufficient {name}"] = reasons.get(f"Insufficient {name}", 0) + 1
            if not short and chosen is None:
                chosen = node
        meta = pod["metadata"]
        if chosen is not None:
            self.store.update("pods", meta["namespace"], meta["name"], lambda body: (
                body["spec"].__setitem__("nodeName", chosen["name"]),
                set_condition(body["status"], "PodScheduled", "True")))
            self.event(pod, "Normal", "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to "
                                                   f"{chosen['name']}", "default-scheduler")
            return
        count = len(self.nodes)
        message = (f"0/{count} nodes are available: "
                   + ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
                   + f". preemption: 0/{count} nodes are available: {count} No preemption victims found for "
                     "incoming pod.")
        if self._unschedulable.get(meta["uid"]) == message:
            return
        self._unschedulable[meta["uid"]] = message
        self.store.update("pods", meta["namespace"], meta["name"], lambda body: set_condition(
            body["status"], "PodScheduled", "False", "Unschedulable", message))
        self.event(pod, "Warning", "FailedScheduling", message, "default-scheduler")

    # -- a pod's container -----------------------------------------------------------------------------------------

    def _run(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            container = pod["spec"]["containers"][0]  # the simulation runs single-container pods
            if not self._pull(pod, container):
                return
            created = self._create(pod, container)
            if created is None:
                return
            self.docker.api.start(created)
            self._running(pod, container, created)
            self.event(pod, "Normal", "Started", f"Started container {container['name']}", "kubelet")
            self.docker.api.wait(created)
            self._terminated(pod, container, created)
        except ApiError:  # the pod went
            pass
        finally:
            with self._lock:
                self._done.add(meta["uid"])
            if self._deleted(pod):  # else kept with its container until it is deleted (its logs stay readable)
                self._release(pod)

    def _deleted(self, pod: dict[str, Any]) -> bool:
        try:
            current = self.store.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError:
            return True
        return "deletionTimestamp" in current["metadata"]

    def _pull(self, pod: dict[str, Any], container: dict[str, Any]) -> bool:
        import docker.errors

        image = container["image"]
        for attempt in range(10**6):
            if self._deleted(pod):
                return False
            try:
                if container.get("imagePullPolicy") != "Always":
                    self.docker.images.get(image)
                    self.event(pod, "Normal", "Pulled", f'Container image "{image}" already present on machine',
                               "kubelet")
                    return True
            except docker.errors.ImageNotFound:
                pass
            self.event(pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet")
            try:
                self.docker.images.pull(image)
                self.event(pod, "Normal", "Pulled", f'Successfully pulled image "{image}"', "kubelet")
                return True
            except docker.errors.DockerException as exc:
                why = getattr(exc, "explanation", None) or str(exc)
                self._waiting(pod, container, "ErrImagePull", f'failed to pull and unpack image "{image}": {why}')
                self.event(pod, "Warning", "Failed", f'Failed to pull image "{image}": {why}', "kubelet")
                self.event(pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet")
                self._waiting(pod, container, "ImagePullBackOff", f'Back-off pulling image "{image}": '
                                                                   f"ErrImagePull: {why}")
                self.event(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"', "kubelet")
                self._sleep_unless_deleted(pod, PULL_BACKOFF[min(attempt, len(PULL_BACKOFF) - 1)])
        return False

    def _sleep_unless_deleted(self, pod: dict[str, Any], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        with self.store.changed:
            while time.monotonic() < deadline and not self.store.closed:
                self.store.changed.wait(deadline - time.monotonic())
                body = next(iter(self.store.items("pods", pod["metadata"]["namespace"], lambda b: b["metadata"][
                    "uid"] == pod["metadata"]["uid"])[0]), None)
                if body is None or "deletionTimestamp" in body["metadata"]:
                    return

    def _env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        namespace = pod["metadata"]["namespace"]
        for source in container.get("envFrom", []):
            ref = source.get("secretRef")
            if ref:
                data = self._secret(namespace, ref["name"], ref.get("optional", False))
                env.update({source.get("prefix", "") + key: value for key, value in data.items()})
        for item in container.get("env", []):
            if "value" in item or "valueFrom" not in item:
                env[item["name"]] = _expand(item.get("value", ""), env)
                continue
            source = item["valueFrom"]
            if "fieldRef" in source:
                env[item["name"]] = _field(pod, source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                data = self._secret(namespace, ref["name"], ref.get("optional", False))
                if ref["key"] in data:
                    env[item["name"]] = data[ref["key"]]
                elif not ref.get("optional"):
                    raise _ConfigError(f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
        return env

    def _secret(self, namespace: str, name: str, optional: bool) -> dict[str, str]:
        try:
            secret = self.store.get("secrets", namespace, name)
        except ApiError:
            if optional:
                return {}
            raise _ConfigError(f'secret "{name}" not found') from None
        return {key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}

    def _create(self, pod: dict[str, Any], container: dict[str, Any]) -> str | None:
        meta, spec = pod["metadata"], pod["spec"]
        while True:
            if self._deleted(pod):
                return None
            try:
                env = self._env(pod, container)
                break
            except _ConfigError as exc:
                self._waiting(pod, container, "CreateContainerConfigError", str(exc))
                self.event(pod, "Warning", "Failed", f"Error: {exc}", "kubelet")
                self._sleep_unless_deleted(pod, PULL_BACKOFF[0])
        hostname = (spec.get("hostname") or meta["name"])[:63]
        subdomain = spec.get("subdomain")
        aliases = [meta["name"]]
        if subdomain and self._has_service(meta["namespace"], subdomain):
            aliases += [f"{hostname}.{subdomain}", f"{hostname}.{subdomain}.{meta['namespace']}.svc",
                        f"{hostname}.{subdomain}.{meta['namespace']}.svc.cluster.local"]
        limits = (container.get("resources") or {}).get("limits") or {}
        tmpfs, binds = self._volumes(pod, container)
        api = self.docker.api
        host_config = api.create_host_config(
            mem_limit=int(quantity(limits["memory"])) if "memory" in limits else None,
            nano_cpus=int(quantity(limits["cpu"]) * 1e9) if "cpu" in limits else None,
            tmpfs=tmpfs or None, binds=binds or None, network_mode=self.network)
        created = api.create_container(
            container["image"], command=container.get("args"), entrypoint=container.get("command"),
            environment=env, hostname=hostname,
            domainname=f"{subdomain}.{meta['namespace']}.svc.cluster.local" if subdomain else None,
            working_dir=container.get("workingDir"), name=f"kubesim-{self.sim_id}-{meta['name']}",
            labels={**meta.get("labels", {}), CONTAINER_LABEL: self.sim_id, POD_LABEL: meta["uid"]},
            host_config=host_config,
            networking_config=api.create_networking_config({self.network: api.create_endpoint_config(
                aliases=aliases)}))
        with self._lock:
            self._containers[meta["uid"]] = created["Id"]
        self.event(pod, "Normal", "Created", f"Created container {container['name']}", "kubelet")
        return created["Id"]

    def _has_service(self, namespace: str, name: str) -> bool:
        try:
            service = self.store.get("services", namespace, name)
        except ApiError:
            return False
        return service.get("spec", {}).get("clusterIP") == "None"

    def _volumes(self, pod: dict[str, Any], container: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
        """emptyDir of medium Memory as tmpfs, others and PersistentVolumeClaims as directories of the simulation
        (one per claim name, shared by every pod that mounts the claim)."""
        volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes", [])}
        tmpfs: dict[str, str] = {}
        binds: list[str] = []
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            mode = "ro" if mount.get("readOnly") else "rw"
            if "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
                size = volume["emptyDir"].get("sizeLimit")
                tmpfs[mount["mountPath"]] = f"size={int(quantity(size))}" if size else ""
                continue
            if "persistentVolumeClaim" in volume:
                where = os.path.join(self.volumes_root, "claims", pod["metadata"]["namespace"],
                                     volume["persistentVolumeClaim"]["claimName"])
            else:
                where = os.path.join(self.volumes_root, "pods", pod["metadata"]["uid"], mount["name"])
            os.makedirs(where, exist_ok=True)
            binds.append(f"{where}:{mount['mountPath']}:{mode}")
        return tmpfs, binds

    # -- status ----------------------------------------------------------------------------------------------------

    def _update(self, pod: dict[str, Any], change: Any) -> None:
        self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"],
                          lambda body: change(body["status"]))

    def _waiting(self, pod: dict[str, Any], container: dict[str, Any], reason: str, message: str) -> None:
        self._update(pod, lambda status: status.update(containerStatuses=[{
            "name": container["name"], "image": container["image"], "imageID": "", "ready": False,
            "restartCount": 0, "started": False, "state": {"waiting": {"reason": reason, "message": message}}}]))

    def _running(self, pod: dict[str, Any], container: dict[str, Any], container_id: str) -> None:
        details = self.docker.api.inspect_container(container_id)
        address = details["NetworkSettings"]["Networks"].get(self.network, {}).get("IPAddress", "")
        started = now()

        def change(status: dict[str, Any]) -> None:
            status.update(phase="Running", podIP=address, podIPs=[{"ip": address}], hostIP="127.0.0.1",
                          startTime=status.get("startTime") or started, containerStatuses=[{
                              "name": container["name"], "image": container["image"],
                              "imageID": details["Image"], "containerID": f"docker://{container_id}",
                              "ready": True, "restartCount": 0, "started": True,
                              "state": {"running": {"startedAt": started}}}])
            for kind in ("Initialized", "ContainersReady", "Ready"):
                set_condition(status, kind, "True")

        self._update(pod, change)

    def _terminated(self, pod: dict[str, Any], container: dict[str, Any], container_id: str) -> None:
        state = self.docker.api.inspect_container(container_id)["State"]
        code = int(state.get("ExitCode", -1))
        reason = "OOMKilled" if state.get("OOMKilled") else "Completed" if code == 0 else "Error"

        def change(status: dict[str, Any]) -> None:
            previous = (status.get("containerStatuses") or [{}])[0]
            status.update(phase="Succeeded" if code == 0 else "Failed", containerStatuses=[{
                **previous, "ready": False, "started": False,
                "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": state.get("StartedAt"),
                                         "finishedAt": state.get("FinishedAt"),
                                         "containerID": f"docker://{container_id}"}}}])
            for kind in ("ContainersReady", "Ready"):
                set_condition(status, kind, "False", "PodCompleted")

        self._update(pod, change)

    def _stop(self, pod: dict[str, Any]) -> None:
        """A deleted pod: SIGTERM, SIGKILL after its grace period (at once for 0); then it can go."""
        import docker.errors

        grace = pod["metadata"].get("deletionGracePeriodSeconds", pod["spec"].get("terminationGracePeriodSeconds", 30))
        uid = pod["metadata"]["uid"]
        with self._lock:
            container_id = self._containers.get(uid)
        try:
            if container_id is not None and int(grace) == 0:
                self.docker.api.kill(container_id)
            elif container_id is not None:
                self.event(pod, "Normal", "Killing", "Stopping container", "kubelet")
                self.docker.api.stop(container_id, timeout=int(grace))
        except docker.errors.APIError:
            pass  # it had exited: its thread records how
        with self._lock:
            done = uid in self._done
        if done:  # else its thread, once it has recorded the container's end, lets go
            self._release(pod)

    def _release(self, pod: dict[str, Any]) -> None:
        """The pod's container has stopped and the pod is deleted: remove the container, let the object go."""
        import docker.errors

        uid = pod["metadata"]["uid"]
        with self._lock:
            container_id = self._containers.pop(uid, None)
        if container_id is not None:
            try:
                self.docker.api.remove_container(container_id, force=True)
            except docker.errors.APIError:  # gone, or being removed (the simulation's end)
                pass
        with self._lock:
            self._holding.discard(uid)
            self._stopping.discard(uid)
        self.store.settle("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])

    # -- logs ------------------------------------------------------------------------------------------------------

    def logs(self, pod: dict[str, Any], container: str | None, *, follow: bool, tail: int | None,
             previous: bool) -> Iterator[bytes]:
        names = [c["name"] for c in pod["spec"]["containers"]]
        if container not in (None, *names):
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {pod['metadata']['name']}")
        if previous:
            raise ApiError(400, "BadRequest", f'previous terminated container "{names[0]}" in pod '
                                              f'"{pod["metadata"]["name"]}" not found')
        with self._lock:
            container_id = self._containers.get(pod["metadata"]["uid"])
        if container_id is None:
            waiting = ((pod["status"].get("containerStatuses") or [{}])[0].get("state") or {}).get("waiting") or {}
            raise ApiError(400, "BadRequest", f'container "{names[0]}" in pod "{pod["metadata"]["name"]}" is waiting '
                                              f'to start: {waiting.get("reason", "ContainerCreating")}')
        return self.docker.api.logs(container_id, stream=True, follow=follow, tail=tail if tail is not None else "all")

    def stop_all(self) -> None:
        """The simulation ends: every container it made goes."""
        import docker.errors

        for found in self.docker.api.containers(all=True, filters={"label": f"{CONTAINER_LABEL}={self.sim_id}"}):
            try:
                self.docker.api.remove_container(found["Id"], force=True)
            except docker.errors.APIError:  # a pod's own thread removes it at this moment
                pass


class _ConfigError(Exception):
    pass


def set_condition(status: dict[str, Any], kind: str, value: str, reason: str | None = None,
                  message: str | None = None) -> None:
    conditions = [c for c in status.get("conditions", []) if c["type"] != kind]
    condition = {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": now()}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    status["conditions"] = conditions + [condition]


def _field(pod: dict[str, Any], path: str) -> str:
    """A downward API field: metadata.name, metadata.labels['k'], metadata.annotations['k'], spec.nodeName..."""
    found = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if found:
        return pod["metadata"].get(found.group(1), {}).get(found.group(2), "")
    here: Any = pod
    for part in path.split("."):
        here = here.get(part) if isinstance(here, dict) else None
    return "" if here is None else str(here)


def _expand(value: str, env: dict[str, str]) -> str:
    """``$(NAME)`` of a variable defined before it; ``$$`` escapes (define-environment-variable-container)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)
