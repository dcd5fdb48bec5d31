"""The simulated API server's HTTP side: discovery, the verbs on namespaced collections and objects, watches,
pod logs and evictions, each answered as https://kubernetes.io/docs/reference/using-api/api-concepts/ describes
(paths ``/api/v1/namespaces/NS/RESOURCE[/NAME[/SUBRESOURCE]]`` and ``/apis/GROUP/VERSION/...``; lists carry the
collection's resourceVersion; ``?watch=1`` streams ``{"type", "object"}`` lines; errors are Status objects).
Request bodies are checked against the official OpenAPI schema of the simulated version (kubernetes-validate):
an invalid object is answered 422 Invalid; a field the schema does not know is refused (400) under
``fieldValidation=Strict``, and warned about (a ``Warning`` header) under ``Warn``, the default
(api-concepts, "Field validation").
"""

from __future__ import annotations

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

from kubesim import selectors
from kubesim.store import ApiError, Store

# (group, version) -> resource -> (kind, namespaced, verbs)
VERBS = ["create", "delete", "get", "list", "patch", "watch"]
RESOURCES: dict[tuple[str, str], dict[str, tuple[str, bool, list[str]]]] = {
    ("", "v1"): {"pods": ("Pod", True, VERBS), "services": ("Service", True, VERBS),
                 "events": ("Event", True, VERBS), "secrets": ("Secret", True, VERBS),
                 "namespaces": ("Namespace", False, VERBS), "nodes": ("Node", False, ["get", "list", "watch"])},
    ("batch", "v1"): {"jobs": ("Job", True, VERBS)},
}
SUBRESOURCES = {("", "v1"): {"pods/log": ("Pod", ["get"]), "pods/eviction": ("Eviction", ["create"])},
                ("batch", "v1"): {"jobs/status": ("Job", ["get"])}}
PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                  r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[^/]+)"
                  r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")
WATCH_SECONDS = 1800  # a watch without timeoutSeconds ends after this (the server's own bound)


class Api:
    """What the handler calls: the store, the admission of bodies, and the kubelet for logs."""

    def __init__(self, store: Store, version: str, logs: Any, admit: Any, delete: Any) -> None:
        self.store, self.version, self.logs, self.admit, self.delete = store, version, logs, admit, delete


def serve(api: Api) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"api": api})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="kubesim-api", daemon=True).start()
    return server


def discovery(path: str, version: str) -> dict[str, Any] | None:
    """/version, /api, /apis and each group version's resources (enough for kubectl's discovery)."""
    major, minor = version.split(".")
    if path == "/version":
        return {"major": major, "minor": minor, "gitVersion": f"v{version}.0", "gitCommit": "kubesim",
                "gitTreeState": "clean", "buildDate": "2024-08-13T07:28:49Z", "goVersion": "go1.22.5",
                "compiler": "gc", "platform": "linux/amd64"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
    groups = [{"name": group, "versions": [{"groupVersion": f"{group}/{ver}", "version": ver}],
               "preferredVersion": {"groupVersion": f"{group}/{ver}", "version": ver}}
              for group, ver in RESOURCES if group]
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    for group in groups:
        if path == f"/apis/{group['name']}":
            return {"kind": "APIGroup", "apiVersion": "v1", **group}
    for (group, ver), resources in RESOURCES.items():
        if path == (f"/apis/{group}/{ver}" if group else f"/api/{ver}"):
            listed = [{"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
                       "verbs": verbs} for name, (kind, namespaced, verbs) in resources.items()]
            listed += [{"name": name, "singularName": "", "namespaced": True, "kind": kind, "verbs": verbs}
                       for name, (kind, verbs) in SUBRESOURCES.get((group, ver), {}).items()]
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{ver}".lstrip("/"),
                    "resources": listed}
    return None


def openapi(path: str, version: str) -> dict[str, Any] | None:
    """The OpenAPI v3 discovery kubectl reads to learn that the server validates fields itself
    (https://kubernetes.io/docs/concepts/overview/kubernetes-api/#openapi-v3; kubectl then sends
    ``fieldValidation=Strict`` instead of checking the object itself): ``/openapi/v3`` lists each group version, and
    each group version's document has its resources' create and patch operations, each naming its kind and taking
    ``fieldValidation`` (kubectl looks at the patch operation). Only what that needs; the schemas themselves are
    kubernetes-validate's copies. PATCH is served (:mod:`kubesim.patch`); PUT is not (405)."""
    versions = {(f"apis/{group}/{ver}" if group else f"api/{ver}"): (group, ver) for group, ver in RESOURCES}
    if path == "/openapi/v3":
        return {"paths": {name: {"serverRelativeURL": f"/openapi/v3/{name}?hash=kubesim"} for name in versions}}
    found = versions.get(path.removeprefix("/openapi/v3/"))
    if found is None:
        return None
    group, ver = found
    field_validation = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
    paths = {}
    for name, (kind, namespaced, verbs) in RESOURCES[found].items():
        if "create" in verbs:
            where = f"/{path.removeprefix('/openapi/v3/')}{'/namespaces/{namespace}' if namespaced else ''}/{name}"
            for action, verb, at in (("post", "create", where), ("patch", "patch", where + "/{name}")):
                paths.setdefault(at, {})[action] = {
                    "operationId": f"{verb}{kind}", "parameters": [field_validation],
                    "responses": {"200": {"description": "OK"}}, "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": {"group": group, "version": ver, "kind": kind}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": f"v{version}.0"}, "paths": paths,
            "components": {"schemas": {}}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: Api

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read answers, not the access log
        pass

    # -- answers ---------------------------------------------------------------------------------------------------

    def _send(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, content_type: str, chunks: Iterator[bytes]) -> None:
        """A chunked answer that lasts as long as ``chunks`` (a watch, a followed log)."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading
            self.close_connection = True

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            import yaml

            return yaml.safe_load(raw)

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            if method == "GET" and (found := discovery(url.path.rstrip("/") or "/", self.api.version)) is not None:
                return self._send(200, found)
            if method == "GET" and (found := openapi(url.path.rstrip("/"), self.api.version)) is not None:
                return self._send(200, found)
            if url.path in ("/healthz", "/readyz", "/livez"):
                data = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(data)
                return
            route = PATH.match(url.path)
            if route is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            self._route(method, route.groupdict(), query)
        except ApiError as error:
            self._send(error.code, error.status())

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    # -- the verbs -------------------------------------------------------------------------------------------------

    def _route(self, method: str, parts: dict[str, str | None], query: dict[str, str]) -> None:
        group, version = ("", "v1") if parts["core"] else (parts["group"] or "", parts["version"] or "")
        resource, namespace, name, sub = parts["resource"] or "", parts["namespace"], parts["name"], parts["sub"]
        known = RESOURCES.get((group, version), {})
        if resource not in known:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        kind, namespaced, verbs = known[resource]
        if namespaced != (namespace is not None) and not (method == "GET" and name is None and namespaced):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        api_version = f"{group}/{version}" if group else version
        if sub:
            return self._subresource(method, resource, sub, namespace, name or "", query)
        if method == "POST" and name is None:
            return self._create(resource, kind, api_version, namespace, self._body(), query)
        if method == "GET" and name is None:
            match = _match(query)
            if _true(query.get("watch")):
                return self._watch(resource, kind, api_version, namespace, query, match)
            items, at = self.api.store.items(resource, namespace, match)
            return self._send(200, {"kind": f"{kind}List", "apiVersion": api_version,
                                    "metadata": {"resourceVersion": str(at)}, "items": items})
        if method == "GET":
            return self._send(200, self.api.store.get(resource, namespace, name or ""))
        if method == "DELETE" and name is not None:
            options = {**self._body(), **{key: value for key, value in query.items()
                                          if key in ("propagationPolicy", "gracePeriodSeconds")}}
            left = self.api.delete(resource, namespace, name, options)
            if left is not None:
                return self._send(200, left)
            return self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                    "details": {"name": name, "kind": resource}})
        if method == "PATCH" and name is not None:
            return self._patch(resource, kind, namespace, name, query)
        raise ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource "
                                               f"({method} {resource}; the simulation serves create, get, list, "
                                               "watch, patch and delete)")

    def _patch(self, resource: str, kind: str, namespace: str | None, name: str, query: dict[str, str]) -> None:
        """The patch applied to the stored object as it is when it is written (tried again, as the API server does,
        where the object changed meanwhile and the patch named no resourceVersion); the result checked against the
        schema as a created object is."""
        from kubesim.admission import check
        from kubesim.patch import patched

        body, content_type = self._body(), self.headers.get("Content-Type") or ""
        for _ in range(10):
            current = self.api.store.get(resource, namespace, name)
            result = patched(current, body, content_type, kind, self.api.version)
            warnings = check(result, self.api.version, query.get("fieldValidation") or "Warn")
            if query.get("dryRun") == "All":
                return self._send(200, result)
            seen = current["metadata"].get("resourceVersion")

            def write(stored: dict[str, Any]) -> None:
                if stored["metadata"].get("resourceVersion") != seen:
                    raise _Moved()
                stored.clear()
                stored.update(copy.deepcopy(result))

            try:
                written = self.api.store.update(resource, namespace, name, write)
            except _Moved:
                continue
            return self._send(200, written, {"Warning": f'299 - "{warnings}"'} if warnings else None)
        raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object keeps '
                                        "changing; try again")

    def _create(self, resource: str, kind: str, api_version: str, namespace: str | None, body: dict[str, Any],
                query: dict[str, str]) -> None:
        if body.get("kind") != kind or body.get("apiVersion") != api_version:
            raise ApiError(400, "BadRequest", f"the API version in the data ({body.get('apiVersion')}) does not match "
                                              f"the expected API version ({api_version}) or kind {kind}")
        if namespace is not None:
            self.api.store.get("namespaces", None, namespace)  # 404 namespaces "x" not found
            if body.get("metadata", {}).get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                                  "sent on the request")
        warnings = self.api.admit(resource, body, query.get("fieldValidation") or "Warn")
        if query.get("dryRun") == "All":
            return self._send(201, body)
        created = self.api.store.create(resource, namespace, body)
        self._send(201, created, {"Warning": f'299 - "{warnings}"'} if warnings else None)

    def _watch(self, resource: str, kind: str, api_version: str, namespace: str | None, query: dict[str, str],
               match: selectors.Match) -> None:
        """Without resourceVersion (or "0"): every object now as ADDED, then the changes; from a version: the changes
        after it, or one ERROR event 410 Expired where it is older than the history kept. A streaming list
        (``sendInitialEvents=true``, api-concepts "Streaming lists") ends its ADDED events with a BOOKMARK
        annotated ``k8s.io/initial-events-end``."""
        store, stop = self.api.store, threading.Event()
        timeout = float(query.get("timeoutSeconds") or WATCH_SECONDS)
        since = query.get("resourceVersion")

        def events() -> Iterator[bytes]:
            initial = _true(query.get("sendInitialEvents"))
            start = int(since) if since and since != "0" and not initial else None
            if start is None:
                items, start = store.items(resource, namespace, match)
                for item in items:
                    yield _line("ADDED", {"kind": kind, "apiVersion": api_version, **item})
                if initial:
                    yield _line("BOOKMARK", {"kind": kind, "apiVersion": api_version, "metadata": {
                        "resourceVersion": str(start), "annotations": {"k8s.io/initial-events-end": "true"}}})
            seen: set[str] = set()  # objects that matched the selector: leaving it reads as DELETED
            try:
                for change in store.changes(resource, namespace, start, stop, timeout):
                    uid = change.object["metadata"].get("uid", "")
                    body = {"kind": kind, "apiVersion": api_version, **change.object}
                    if match(change.object):
                        seen.add(uid)
                        yield _line(change.type, body)
                    elif uid in seen:
                        seen.discard(uid)
                        yield _line("DELETED", body)
            except ApiError as error:
                yield _line("ERROR", error.status())

        try:
            self._stream("application/json", events())
        finally:
            stop.set()

    def _subresource(self, method: str, resource: str, sub: str, namespace: str | None, name: str,
                     query: dict[str, str]) -> None:
        if (resource, sub, method) == ("pods", "log", "GET"):
            pod = self.api.store.get("pods", namespace, name)
            chunks = self.api.logs(pod, query.get("container"), follow=_true(query.get("follow")),
                                   tail=int(query["tailLines"]) if "tailLines" in query else None,
                                   previous=_true(query.get("previous")))
            return self._stream("text/plain", chunks)
        if (resource, sub, method) == ("pods", "eviction", "POST"):
            self._body()
            self.api.delete("pods", namespace, name, {"eviction": True})
            return self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        if (resource, sub, method) == ("jobs", "status", "GET"):
            return self._send(200, self.api.store.get(resource, namespace, name))
        raise ApiError(404, "NotFound", "the server could not find the requested resource")


class _Moved(Exception):
    """The object changed between reading it and writing the patch's result."""


def _true(value: str | None) -> bool:
    """A boolean query parameter as the server parses it (Go's strconv.ParseBool: 1, t, T, true, TRUE, True)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _match(query: dict[str, str]) -> selectors.Match:
    by_labels = selectors.labels(query.get("labelSelector"))
    try:
        by_fields = selectors.fields(query.get("fieldSelector"))
    except ValueError as exc:
        raise ApiError(400, "BadRequest", str(exc)) from None
    return lambda body: by_labels(body) and by_fields(body)


def _line(kind: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": body}).encode() + b"\n"
