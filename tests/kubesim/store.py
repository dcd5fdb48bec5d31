"""The simulated API server's storage: objects by resource, namespace and name, one resourceVersion counter, and
the history of changes that watches read.

Behaviour from https://kubernetes.io/docs/reference/using-api/api-concepts/ ("Efficient detection of changes",
"Resource versions"): every change gets a new, increasing resourceVersion; a list answers the collection's
resourceVersion, from which a watch goes on; a watch asked to start from a version older than the history the
server keeps is answered 410 Gone ("Expired"). Deletion follows
https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/: an object with finalizers is only
marked (``metadata.deletionTimestamp``) and goes once its last finalizer is removed.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

HISTORY = 5000  # changes kept for watches; one that starts from an older resourceVersion gets 410 Gone


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ApiError(Exception):
    """An answer other than success, as the server's Status object: code, reason, message."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": self.reason, "details": self.details, "code": self.code}


@dataclass(frozen=True)
class Change:
    version: int
    resource: str
    namespace: str | None
    type: str  # ADDED | MODIFIED | DELETED
    object: dict[str, Any]


Key = tuple[str, "str | None", str]  # resource, namespace (None: cluster-scoped), name


class Store:
    def __init__(self) -> None:
        self.changed = threading.Condition()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._version = 0
        self._history: list[Change] = []
        self._holders: list[Callable[[str, dict[str, Any]], bool]] = []
        self.closed = False

    @property
    def version(self) -> int:
        return self._version

    def after(self, seen: int, timeout: float) -> int:
        """Wait until the store changes past version ``seen`` (or ``timeout`` passes); the version now."""
        with self.changed:
            if self.version == seen:
                self.changed.wait(timeout)
            return self.version

    def _record(self, resource: str, namespace: str | None, kind: str, body: dict[str, Any]) -> None:
        self._history.append(Change(self._version, resource, namespace, kind, copy.deepcopy(body)))
        del self._history[:-HISTORY]
        self.changed.notify_all()

    def _bump(self, body: dict[str, Any]) -> None:
        self._version += 1
        body["metadata"]["resourceVersion"] = str(self._version)

    def create(self, resource: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        with self.changed:
            meta = body.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            key = (resource, namespace, meta.get("name", ""))
            if not key[2]:
                raise ApiError(422, "Invalid", f"{resource}: metadata.name: Required value: name or generateName is "
                                              "required")
            if key in self._objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{key[2]}" already exists',
                               {"name": key[2], "kind": resource})
            if namespace is not None:
                meta["namespace"] = namespace
            meta.setdefault("uid", str(uuid.uuid4()))  # admission may have given one (a Job's selector names it)
            meta.update(creationTimestamp=now(), generation=1)
            self._bump(body)
            self._objects[key] = body
            self._record(resource, namespace, "ADDED", body)
            return copy.deepcopy(body)

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
        with self.changed:
            return copy.deepcopy(self._find(resource, namespace, name))

    def _find(self, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
        try:
            return self._objects[(resource, namespace, name)]
        except KeyError:
            raise ApiError(404, "NotFound", f'{resource} "{name}" not found',
                           {"name": name, "kind": resource}) from None

    def update(self, resource: str, namespace: str | None, name: str,
               change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        """Apply ``change`` to the stored object in place (under the lock); a new resourceVersion if it changed."""
        with self.changed:
            body = self._find(resource, namespace, name)
            before = copy.deepcopy(body)
            change(body)
            if body != before:
                self._bump(body)
                if self._finalized(resource, body):
                    return self._remove((resource, namespace, name))
                self._record(resource, namespace, "MODIFIED", body)
            return copy.deepcopy(body)

    def mark_deleted(self, resource: str, namespace: str | None, name: str, grace: int | None = None,
                     finalizers: tuple[str, ...] = ()) -> dict[str, Any] | None:
        """Begin deleting: gone at once unless it has finalizers (or ``finalizers`` to add); else marked, and
        returned marked. None: it went at once."""
        with self.changed:
            body = self._find(resource, namespace, name)
            meta = body["metadata"]
            if "deletionTimestamp" in meta:
                return copy.deepcopy(body)
            if not meta.get("finalizers") and not finalizers and not self._held(resource, body):
                self._remove((resource, namespace, name))
                return None
            meta["deletionTimestamp"] = now()
            meta["finalizers"] = list(dict.fromkeys([*meta.get("finalizers", []), *finalizers]))
            if grace is not None:
                meta["deletionGracePeriodSeconds"] = grace
            self._bump(body)
            self._record(resource, namespace, "MODIFIED", body)
            return copy.deepcopy(body)

    def _held(self, resource: str, body: dict[str, Any]) -> bool:
        return any(holder(resource, body) for holder in self._holders)

    def _finalized(self, resource: str, body: dict[str, Any]) -> bool:
        meta = body["metadata"]
        return "deletionTimestamp" in meta and not meta.get("finalizers") and not self._held(resource, body)

    def hold(self, holder: Callable[[str, dict[str, Any]], bool]) -> None:
        """``holder`` keeps a marked object until it lets go and calls :meth:`settle` (the kubelet keeps a pod
        until its containers are stopped: the pod's graceful termination)."""
        self._holders.append(holder)

    def settle(self, resource: str, namespace: str | None, name: str) -> None:
        """Remove the object if it is marked deleted and nothing holds it any longer."""
        with self.changed:
            body = self._objects.get((resource, namespace, name))
            if body is not None and self._finalized(resource, body):
                self._remove((resource, namespace, name))

    def _remove(self, key: Key) -> dict[str, Any]:
        body = self._objects.pop(key)
        self._bump(body)
        self._record(key[0], key[1], "DELETED", body)
        return copy.deepcopy(body)

    def items(self, resource: str, namespace: str | None = None,
              match: Callable[[dict[str, Any]], bool] = lambda body: True) -> tuple[list[dict[str, Any]], int]:
        """The objects of ``resource`` (in ``namespace``; None: every namespace) that ``match``, and the version."""
        with self.changed:
            found = [copy.deepcopy(body) for (kind, ns, _), body in sorted(self._objects.items(),
                                                                        key=lambda item: str(item[0]))
                     if kind == resource and (namespace is None or ns == namespace) and match(body)]
            return found, self._version

    def changes(self, resource: str, namespace: str | None, since: int, stop: threading.Event,
                timeout: float) -> Iterator[Change]:
        """The changes to ``resource`` after version ``since``, as they happen, for ``timeout`` seconds; raises
        ApiError 410 where ``since`` is older than the history kept."""
        deadline = time.monotonic() + timeout
        with self.changed:
            if self._history and since < self._history[0].version - 1:
                raise ApiError(410, "Expired", f"too old resource version: {since} ({self._history[0].version - 1})")
        while not stop.is_set() and not self.closed:
            with self.changed:
                fresh = [change for change in self._history if change.version > since and change.resource == resource
                         and (namespace is None or change.namespace == namespace)]
                if not fresh:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self.changed.wait(min(left, 1.0))
                    continue
            for change in fresh:
                since = change.version
                yield change

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()
