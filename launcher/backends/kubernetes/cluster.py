"""The cluster through the official ``kubernetes`` client: the kubeconfig's context (or, inside a pod without one,
the in-cluster config), the server's version, and the calls the backend makes. Objects go and come back as the
API's own JSON (plain dicts): what ``--dry-run`` prints is what is sent. Imported only by the verbs that talk to a
cluster."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, TypeVar

from launcher.errors import BackendError

T = TypeVar("T")
KUBECONFIG_HINT = "KUBECONFIG or ~/.kube/config"


def _library() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise BackendError("the kubernetes backend talks to clusters with the official client: "
                           "pip install 'launcher[kubernetes]'") from None
    return kubernetes


class Cluster:
    def __init__(self, context: str | None) -> None:
        kubernetes = _library()
        self.context = context
        self.api = _api_client(kubernetes, context)
        self.server = self.api.configuration.host
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.batch = kubernetes.client.BatchV1Api(self.api)
        self._errors = (kubernetes.client.ApiException,)

    def _call(self, what: str, call: Callable[[], T], missing_ok: bool = False) -> T | None:
        """``call``, its API error as a BackendError saying what was asked and the server's own message; None for
        404 where ``missing_ok``."""
        import urllib3.exceptions

        try:
            return call()
        except self._errors as exc:
            if missing_ok and exc.status == 404:
                return None
            raise BackendError(f"Kubernetes API at {self.server}: {what}: {exc.status} {_message(exc)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise BackendError(f"cannot reach the Kubernetes API server at {self.server} "
                               f"({self._where()}): {exc}") from None

    def _where(self) -> str:
        return f"kubeconfig context {self.context}" if self.context else f"the current context of {KUBECONFIG_HINT}" \
            if not os.environ.get("KUBERNETES_SERVICE_HOST") else "in-cluster config"

    def _json(self, what: str, call: Callable[[], Any], missing_ok: bool = False) -> Any:
        response = self._call(what, call, missing_ok)
        return None if response is None else json.loads(response.data)

    def version(self) -> str:
        """``major.minor`` of the server (``/version``); clouds write minors like ``31+``."""
        import kubernetes

        info = self._call("read /version", lambda: kubernetes.client.VersionApi(self.api).get_code())
        assert info is not None
        major, minor = ("".join(c for c in part if c.isdigit()) for part in (info.major, info.minor))
        return f"{int(major)}.{int(minor)}"

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        namespace, kind = body["metadata"]["namespace"], body["kind"]
        create = {"Service": self.core.create_namespaced_service, "Job": self.batch.create_namespaced_job}[kind]
        return self._json(f"create {kind} {namespace}/{body['metadata']['name']}",
                          lambda: create(namespace, body, field_validation="Strict", _preload_content=False))

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._json(f"read Job {namespace}/{name}", lambda: self.batch.read_namespaced_job(
            name, namespace, _preload_content=False), missing_ok=True)

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self._pod_list(namespace, job)["items"]

    def _pod_list(self, namespace: str, job: str) -> dict[str, Any]:
        return self._json(f"list the pods of Job {namespace}/{job}", lambda: self.core.list_namespaced_pod(
            namespace, label_selector=f"batch.kubernetes.io/job-name={job}", _preload_content=False))

    def events(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        return self._json(f"list the events of pod {namespace}/{pod}", lambda: self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod}", _preload_content=False))["items"]

    def log_tail(self, namespace: str, pod: str, container: str, lines: int) -> tuple[str, ...]:
        """The last lines a pod's container wrote (the client's own decoding of logs is unreliable: read raw)."""
        try:
            response = self._call(f"read the log of pod {namespace}/{pod}", lambda: self.core.read_namespaced_pod_log(
                pod, namespace, container=container, tail_lines=lines, _preload_content=False))
        except BackendError:
            return ()
        return tuple((response.data if response else b"").decode(errors="replace").splitlines())

    def delete(self, kind: str, namespace: str, name: str, policy: str = "Background") -> bool:
        """Delete one object (``policy``: how its dependents go); False where it was gone already."""
        import kubernetes

        delete = {"Service": self.core.delete_namespaced_service, "Job": self.batch.delete_namespaced_job}[kind]
        body = kubernetes.client.V1DeleteOptions(propagation_policy=policy)
        return self._call(f"delete {kind} {namespace}/{name}", lambda: delete(name, namespace, body=body,
                                                                             _preload_content=False),
                          missing_ok=True) is not None

    def wait(self, namespace: str, job: str, done: Callable[[dict[str, Any] | None, list[dict[str, Any]]], bool],
             timeout: float) -> bool:
        """Until ``done(job, pods)`` holds or ``timeout`` seconds pass (whether it held), woken by a watch on the
        Job's pods from the version listed (and every few seconds, for a change to the Job alone)."""
        import kubernetes

        deadline = time.monotonic() + timeout
        while True:
            listed = self._pod_list(namespace, job)
            if done(self.job(namespace, job), listed["items"]):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            stream = kubernetes.watch.Watch()
            try:
                for _ in stream.stream(self.core.list_namespaced_pod, namespace,
                                       label_selector=f"batch.kubernetes.io/job-name={job}",
                                       resource_version=listed["metadata"]["resourceVersion"],
                                       timeout_seconds=max(1, int(min(left, 3)))):
                    break  # any change: look again
            except self._errors:
                pass  # the watch expired (410) or was cut: the next look starts a fresh one
            finally:
                stream.stop()


def _api_client(kubernetes: Any, context: str | None) -> Any:
    if context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException as exc:
            raise BackendError(f"in-cluster config: {exc}") from None
        return kubernetes.client.ApiClient(configuration)
    try:
        return kubernetes.config.new_client_from_config(context=context)
    except (kubernetes.config.ConfigException, OSError) as exc:
        where = f"context {context!r} of " if context else ""
        raise BackendError(f"kubeconfig ({where}{KUBECONFIG_HINT}): {exc}") from None


def _message(exc: Any) -> str:
    try:
        return json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(exc.reason)
