"""A simulation of the OCI services launcher uses, at the wire, that really runs the nodes.

One HTTP server on 127.0.0.1 serves Data Science (jobs, job runs), Object Storage (objects),
Logging search and the subnet lookup of Networking, as the ``oci`` SDK and ocifs call them
(``LAUNCHER_OCI_ENDPOINT`` points every client here). It checks what the real service would:
every request signed (the RSA signature over the listed headers verified with the caller's
public key, ``x-content-sha256`` matching the body), unknown or missing fields, discriminators,
and the documented env and command limits.

It follows independent sources, not launcher: the SDK's models and docstrings
(``oci/data_science/models/``), Oracle ADS, which runs multi-node jobs on the real service
(``oracle/accelerated-data-science``: ``ads/jobs/templates/driver_pytorch.py``,
``ads/jobs/builders/infrastructure/dsc_job.py``, ``ads/common/oci_logging.py``), and OCI's
documentation pages. Each simulated behaviour names its source where it is implemented.

A created job run really runs its nodes as local processes with the env the service sets (its
OCIDs and a resource principal the nodes sign with; in multi-node runs ``NODE_RANK``,
``INITIAL_CLUSTER_SIZE`` and ``CLUSTER_NODES_METADATA_FILE``, nothing else), moves through
ACCEPTED, IN_PROGRESS and SUCCEEDED/FAILED/CANCELING/CANCELED, and keeps each node's output for
Logging search. Faults and timing on demand: :meth:`OciSim.fail` and the attributes set in ``__init__``.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import http.server
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

REGION = "us-ashburn-1"
TENANCY = "ocid1.tenancy.oc1..simtenancy"
USER = "ocid1.user.oc1..simuser"
MAX_ENV_CHARACTERS = 20_000
MAX_COMMAND_BYTES = 2_048

# Fields the service accepts, per model (camelCase), with the required ones; nested models by name.
MODELS: dict[str, tuple[set[str], set[str]]] = {
    "CreateJobDetails": ({"projectId", "compartmentId", "displayName", "description", "jobConfigurationDetails",
                          "jobInfrastructureConfigurationDetails", "jobEnvironmentConfigurationDetails",
                          "jobLogConfigurationDetails", "jobNodeConfigurationDetails", "freeformTags",
                          "definedTags", "jobStorageMountConfigurationDetailsList"}, {"projectId", "compartmentId"}),
    "CreateJobRunDetails": ({"projectId", "compartmentId", "jobId", "displayName", "jobConfigurationOverrideDetails",
                             "jobEnvironmentConfigurationOverrideDetails", "jobLogConfigurationOverrideDetails",
                             "jobInfrastructureConfigurationOverrideDetails", "jobNodeConfigurationOverrideDetails",
                             "freeformTags", "definedTags"}, {"projectId", "compartmentId", "jobId"}),
    "DEFAULT": ({"jobType", "environmentVariables", "commandLineArguments", "maximumRuntimeInMinutes",
                 "startupProbeDetails"}, {"jobType"}),
    "STANDALONE": ({"jobInfrastructureType", "shapeName", "subnetId", "blockStorageSizeInGBs", "jobShapeConfigDetails"},
                   {"jobInfrastructureType", "shapeName", "subnetId", "blockStorageSizeInGBs"}),
    "ME_STANDALONE": ({"jobInfrastructureType", "shapeName", "blockStorageSizeInGBs", "jobShapeConfigDetails"},
                      {"jobInfrastructureType", "shapeName", "blockStorageSizeInGBs"}),
    "MULTI_NODE": ({"jobInfrastructureType", "shapeName", "blockStorageSizeInGBs", "jobShapeConfigDetails"},
                   {"jobInfrastructureType", "shapeName", "blockStorageSizeInGBs"}),
    "OCIR_CONTAINER": ({"jobEnvironmentType", "image", "cmd", "entrypoint", "imageDigest", "imageSignatureId"},
                       {"jobEnvironmentType", "image"}),
    "log": ({"enableLogging", "enableAutoLogCreation", "logGroupId", "logId"}, set()),
    "MULTI_NODE_CONFIG": ({"jobNodeType", "startupOrder", "maximumRuntimeInMinutes", "jobNetworkConfiguration",
                           "jobNodeGroupConfigurationDetailsList"},
                          {"jobNodeType", "jobNodeGroupConfigurationDetailsList"}),
    "CUSTOM_NETWORK": ({"jobNetworkType", "subnetId"}, {"jobNetworkType", "subnetId"}),
    "DEFAULT_NETWORK": ({"jobNetworkType"}, {"jobNetworkType"}),
    "group": ({"name", "replicas", "minimumSuccessReplicas", "jobInfrastructureConfigurationDetails",
               "jobConfigurationDetails", "jobEnvironmentConfigurationDetails"}, {"name"}),
    "shape": ({"ocpus", "memoryInGBs", "cpuBaseline"}, set()),
}
DISCRIMINATED = {"jobConfigurationDetails": "jobType", "jobConfigurationOverrideDetails": "jobType",
                 "jobInfrastructureConfigurationDetails": "jobInfrastructureType",
                 "jobEnvironmentConfigurationDetails": "jobEnvironmentType",
                 "jobEnvironmentConfigurationOverrideDetails": "jobEnvironmentType",
                 "jobNetworkConfiguration": "jobNetworkType"}
NAMED = {"jobLogConfigurationDetails": "log", "jobNodeConfigurationDetails": "MULTI_NODE_CONFIG",
         "jobNodeConfigurationOverrideDetails": "MULTI_NODE_CONFIG",
         "jobShapeConfigDetails": "shape"}


# What a JobRun returns of the run's create request (the SDK's JobRun model; GetJobRun, not ListJobRuns).
OVERRIDES = ("jobConfigurationOverrideDetails", "jobEnvironmentConfigurationOverrideDetails",
             "jobNodeConfigurationOverrideDetails")


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def validate(body: Any, model: str, where: str = "") -> None:
    """Refuse what the service would: unknown and missing fields, bad discriminators, limits."""
    if not isinstance(body, dict):
        raise Refused(400, "InvalidParameter", f"{where or model}: expected an object")
    allowed, required = MODELS[model]
    for name in sorted(set(body) - allowed):
        raise Refused(400, "InvalidParameter", f"{where}{name}: unknown field for {model}")
    for name in sorted(required - set(body)):
        raise Refused(400, "MissingParameter", f"{where}{name}: required")
    for name, value in body.items():
        path = f"{where}{name}."
        if name in DISCRIMINATED:
            kind = value.get(DISCRIMINATED[name]) if isinstance(value, dict) else None
            if kind not in MODELS or kind in ("log", "group", "shape"):
                raise Refused(400, "InvalidParameter", f"{path}{DISCRIMINATED[name]}: unknown value {kind!r}")
            validate(value, kind, path)
        elif name in NAMED:
            validate(value, NAMED[name], path)
        elif name == "jobNodeGroupConfigurationDetailsList":
            for index, group in enumerate(value):
                validate(group, "group", f"{where}{name}[{index}].")
        elif name == "environmentVariables":
            size = sum(len(k) + len(str(v)) for k, v in value.items())
            if size > MAX_ENV_CHARACTERS:
                raise Refused(400, "InvalidParameter", f"{path[:-1]}: {size} characters, over {MAX_ENV_CHARACTERS}")
    if model == "OCIR_CONTAINER" and len(json.dumps(body.get("cmd", []) + body.get("entrypoint", [])).encode()) \
            >= MAX_COMMAND_BYTES:
        raise Refused(400, "InvalidParameter", f"{where}cmd: cmd and entrypoint over {MAX_COMMAND_BYTES} bytes")


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def fingerprint(key: rsa.RSAPrivateKey) -> str:
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashlib.md5(der).hexdigest()
    return ":".join(digest[i:i + 2] for i in range(0, 32, 2))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Node:
    name: str
    rank: int
    group: str
    env: dict[str, str]
    process: subprocess.Popen | None = None
    output: list[tuple[float, str]] = field(default_factory=list)  # (when written, line)
    exit_code: int | None = None


@dataclass
class JobRun:
    id: str
    job: dict[str, Any]
    body: dict[str, Any]
    state: str = "ACCEPTED"
    details: str = ""
    nodes: list[Node] = field(default_factory=list)
    groups: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (state, details)
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    cancelled: float | None = None  # when a cancel was asked for
    ended_as: str | None = None  # the state it ended in (SUCCEEDED, FAILED, CANCELED), kept once it is DELETED
    log: dict[str, str] = field(default_factory=dict)  # logDetails: logGroupId, logId


class OciSim:
    """The server. ``images`` maps an image name to the code directory its container would hold."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.user_key = new_key()
        self.keys: dict[str, Any] = {f"{TENANCY}/{USER}/{fingerprint(self.user_key)}": self.user_key.public_key()}
        self.images: dict[str, Path] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, JobRun] = {}
        self.objects: dict[tuple[str, str, str], tuple[bytes, float]] = {}
        self.multipart_md5: dict[tuple[str, str, str], str] = {}  # objects made by a multipart upload: their md5
        self.uploads: dict[str, tuple[tuple[str, str, str], dict[int, bytes]]] = {}  # upload id -> (object, parts)
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, parsed body) of every accepted request
        self.faults: list[tuple[str, str, int, str, str, int]] = []  # (method, path regex, status, code, msg, times)
        self.lost_answers: list[tuple[str, str]] = []  # (method, path regex): done, then answered 500 once
        self.created_by_token: dict[str, dict[str, Any]] = {}  # opc-retry-token -> what it created
        self.dying: dict[str, str] = {}  # node name -> "never_starts" | "dies" | "dies_once" (its replacement lives)
        self.dies_at = " epoch "  # the line of its output at which a dying node is killed
        self.refusals: list[tuple[str, str, int, str]] = []  # (method, path, status, code) of every refused request
        self.served_states: list[tuple[str, str]] = []  # (job run id, lifecycle state) as GET jobRuns/{id} answered
        # Multi-node runs: where the nodes are on the cluster network, and whether the metadata file is held back
        # for the test to write (write_metadata) as late and as incomplete as it likes: ADS waits for a file that
        # may be missing or incomplete when a node starts (driver_pytorch.py Runner.read_metadata).
        self.node_address = "127.0.0.1"
        self.metadata_held = False
        # NODE_RANK in a job with several node groups: how it counts there is documented nowhere ("per_group"
        # or "global"); in one node group it is 0..N-1 (ADS reads it so, rank 0 the host).
        self.rank_numbering = "per_group"
        self.subnet_cidr = "127.0.0.0/8"
        self.cancel_seconds = 0.5  # a cancelled run stays CANCELING at least this long
        self.log_delay = 0.0  # seconds before a line written by a node can be found in Logging
        self.search_page = 1000  # results per Logging page (at most the request's limit)
        self.search_too_large: int | None = None  # more results than this in one window: 400 "too large"
        self.node_env: dict[str, str] = {}  # extra env for every node: test settings, not something the service sets
        self.lock = threading.RLock()
        self.stopped = False  # set by stop(): no node process starts after it
        self.ids = itertools.count(1)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    # -- the user's side ---------------------------------------------------------------------------
    def write_config(self, directory: Path) -> Path:
        """An ~/.oci/config with an API key the server knows."""
        key_file = directory / "oci_api_key.pem"
        key_file.write_bytes(pem(self.user_key))
        config = directory / "config"
        config.write_text(f"[DEFAULT]\nuser={USER}\nfingerprint={fingerprint(self.user_key)}\ntenancy={TENANCY}\n"
                          f"region={REGION}\nkey_file={key_file}\n")
        return config

    def write_session_config(self, directory: Path) -> Path:
        """A profile as `oci session authenticate` writes it: a session token and the key it was issued for."""
        key = new_key()
        jti = f"session-{next(self.ids)}"
        with self.lock:
            self.keys[f"rpst:{jti}"] = key.public_key()
        claims = {"sub": USER, "tenant": TENANCY, "jti": jti, "exp": int(time.time()) + 3600}
        token_file = directory / "token"
        token_file.write_text(f"{_b64url(b'{}')}.{_b64url(json.dumps(claims).encode())}.{_b64url(b'sim')}")
        key_file = directory / "session_key.pem"
        key_file.write_bytes(pem(key))
        config = directory / "session_config"
        config.write_text(f"[SESSION]\nfingerprint={fingerprint(key)}\ntenancy={TENANCY}\nregion={REGION}\n"
                          f"key_file={key_file}\nsecurity_token_file={token_file}\n")
        return config

    def fail(self, method: str, path: str, status: int, code: str, message: str, times: int = 1) -> None:
        with self.lock:
            self.faults.append((method, path, status, code, message, times))

    def lose_answer(self, method: str, path: str) -> None:
        """Carry out the next matching request, then answer 500 as if the answer was lost on the way."""
        with self.lock:
            self.lost_answers.append((method, path))

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            for run in self.runs.values():
                for node in run.nodes:
                    if node.process and node.process.poll() is None:
                        os.killpg(node.process.pid, signal.SIGKILL)
        self.server.shutdown()

    # -- HTTP ----------------------------------------------------------------------------------------
    def _handler(self) -> type:
        sim = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                try:
                    sim._verify(self.command, self.path, self.headers, body)
                    sim._fault(self.command, self.path)
                    status, payload, headers = sim._route(self.command, self.path, self.headers, body)
                    sim._lose_answer(self.command, self.path)
                except Refused as refusal:
                    status, headers = refusal.status, {}
                    payload = {"code": refusal.code, "message": refusal.message}
                    with sim.lock:
                        sim.refusals.append((self.command, self.path, refusal.status, refusal.code))
                raw = payload if isinstance(payload, bytes) else (
                    b"" if payload is None else json.dumps(payload).encode())
                self.send_response(status)
                self.send_header("opc-request-id", f"sim-{next(sim.ids)}")
                if not isinstance(payload, bytes):
                    self.send_header("content-type", "application/json")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                if self.command != "HEAD":
                    try:
                        self.wfile.write(raw)
                    except (BrokenPipeError, ConnectionResetError):  # a client may read part of an answer: the
                        self.close_connection = True  # SDK's DownloadManager reads one part of its first GET
                        return

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

        return Handler

    def _verify(self, method: str, target: str, headers: Any, body: bytes) -> None:
        auth = headers.get("authorization") or ""
        fields = dict(re.findall(r'(\w+)="([^"]*)"', auth))
        if not auth.startswith("Signature ") or fields.get("algorithm") != "rsa-sha256":
            raise Refused(401, "NotAuthenticated", "the request is not signed")
        names = fields.get("headers", "").split()
        needed = ["date", "(request-target)", "host"]
        # Object bodies (PutObject, UploadPart) are signed without content headers: the SDK's put_object and
        # upload_part call with enforce_content_headers=False (oci/object_storage/object_storage_client.py).
        if method in ("POST", "PUT") and "/o/" not in target and not (method == "PUT" and "/u/" in target):
            needed += ["content-length", "content-type", "x-content-sha256"]
        if any(name not in names for name in needed):
            raise Refused(401, "NotAuthenticated", f"signed headers {names} lack some of {needed}")
        if "x-content-sha256" in names and headers.get("x-content-sha256") != \
                base64.b64encode(hashlib.sha256(body).digest()).decode():
            raise Refused(401, "NotAuthenticated", "x-content-sha256 does not match the body")
        key = self._public_key(fields.get("keyId", ""))
        lines = [f"(request-target): {method.lower()} {target}" if name == "(request-target)"
                 else f"{name}: {headers.get(name)}" for name in names]
        try:
            key.verify(base64.b64decode(fields.get("signature", "")), "\n".join(lines).encode(),
                       padding.PKCS1v15(), hashes.SHA256())
        except Exception:
            raise Refused(401, "NotAuthenticated", "the signature does not verify") from None
        date = email.utils.parsedate_to_datetime(headers.get("date"))
        if abs(date.timestamp() - time.time()) > 300:
            raise Refused(401, "NotAuthenticated", "the date header is more than 5 minutes off")

    def _public_key(self, key_id: str) -> Any:
        with self.lock:
            if key_id.startswith("ST$"):  # a resource principal session token: its key is the one we issued
                claims = json.loads(base64.urlsafe_b64decode(key_id[3:].split(".")[1] + "=="))
                key = self.keys.get(f"rpst:{claims.get('jti')}")
            else:
                key = self.keys.get(key_id)
        if key is None:
            raise Refused(401, "NotAuthenticated", f"unknown keyId {key_id[:40]}")
        return key

    def _fault(self, method: str, target: str) -> None:
        with self.lock:
            for index, (want_method, pattern, status, code, message, times) in enumerate(self.faults):
                if want_method == method and re.search(pattern, target):
                    if times <= 1:
                        self.faults.pop(index)
                    else:
                        self.faults[index] = (want_method, pattern, status, code, message, times - 1)
                    raise Refused(status, code, message)

    def _lose_answer(self, method: str, target: str) -> None:
        with self.lock:
            for index, (want_method, pattern) in enumerate(self.lost_answers):
                if want_method == method and re.search(pattern, target):
                    self.lost_answers.pop(index)
                    raise Refused(500, "InternalServerError", "the answer was lost")

    def _created(self, headers: Any, create: Any, data: Any) -> dict[str, Any]:
        """Create once per opc-retry-token, as the service does: a retried create returns the first result."""
        token = headers.get("opc-retry-token")
        with self.lock:
            if token and token in self.created_by_token:
                return self.created_by_token[token]
        result = create(data)
        if token:
            with self.lock:
                self.created_by_token[token] = result
        return result

    def _route(self, method: str, target: str, headers: Any, body: bytes) -> tuple[int, Any, dict]:
        url = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(url.query))
        path = url.path
        match = re.fullmatch(r"/n/([^/]+)/b/([^/]+)/o(?:/(.+))?", path)
        if match:
            with self.lock:
                self.requests.append((method, path, None))
            namespace, bucket, name = match[1], match[2], urllib.parse.unquote(match[3] or "")
            return self._object(method, namespace, bucket, name, query, headers, body)
        match = re.fullmatch(r"/n/([^/]+)/b/([^/]+)/u(?:/(.+))?", path)
        if match:
            with self.lock:
                self.requests.append((method, path, None))
            key = (match[1], match[2], urllib.parse.unquote(match[3] or ""))
            return self._multipart(method, key, query, headers, body)
        if re.fullmatch(r"/n/[^/]+/b/[^/]+", path) and method in ("GET", "HEAD"):  # the bucket exists
            return 200, {"name": path.rsplit("/", 1)[1]}, {"etag": "bucket-1"}
        try:
            data = json.loads(body) if body else None
        except ValueError:
            raise Refused(400, "InvalidParameter", "the body is not JSON") from None
        with self.lock:
            self.requests.append((method, path, data))
        if path == "/20190101/jobs" and method == "POST":
            validate(data, "CreateJobDetails")
            return 200, self._created(headers, self._create_job, data), {"etag": "1"}
        if (found := re.fullmatch(r"/20190101/jobs/([^/]+)", path)) and method in ("GET", "DELETE"):
            job = self.jobs.get(found[1])
            if job is None:
                raise Refused(404, "NotAuthorizedOrNotFound", f"job {found[1]} not found")
            if method == "DELETE":
                return self._delete_job(job, query)
            return 200, job, {"etag": "1"}
        if path == "/20190101/jobRuns" and method == "GET":
            if "compartmentId" not in query:
                raise Refused(400, "MissingParameter", "compartmentId: required")
            with self.lock:
                found = [self._run_view(run) for run in self.runs.values()
                         if run.body["compartmentId"] == query["compartmentId"]
                         and query.get("jobId") in (None, run.job["id"])]
            for summary in found:  # a JobRunSummary has no node groups and no override details (the SDK's model)
                for name in ("nodeGroupDetailsList", *OVERRIDES):
                    summary.pop(name, None)
            start = int(query.get("page", "0"))
            limit = int(query.get("limit", "2"))  # small pages, so that paging is exercised
            more = {"opc-next-page": str(start + limit)} if start + limit < len(found) else {}
            return 200, found[start:start + limit], more
        if path == "/20190101/jobRuns" and method == "POST":
            validate(data, "CreateJobRunDetails")
            return 200, self._created(headers, self._create_run, data), {"etag": "1"}
        if (found := re.fullmatch(r"/20190101/jobRuns/([^/]+)(/actions/cancelJobRun)?", path)):
            run = self.runs.get(found[1])
            if run is None:
                raise Refused(404, "NotAuthorizedOrNotFound", f"job run {found[1]} not found")
            if found[2] and method == "POST":
                self._cancel(run)
                return 202, None, {}
            view = self._run_view(run)
            with self.lock:
                self.served_states.append((run.id, view["lifecycleState"]))
            return 200, view, {"etag": "1"}
        if path == "/20190909/search" and method == "POST":
            return self._search(data, query)
        if (found := re.fullmatch(r"/20160918/subnets/([^/]+)", path)) and method == "GET":
            # Networking's GetSubnet, which ADS calls to learn the subnet's CIDR (driver_pytorch.py find_self_ip).
            return 200, {"id": found[1], "cidrBlock": self.subnet_cidr, "compartmentId": "ocid1.compartment.oc1..sim",
                         "vcnId": "ocid1.vcn.oc1.iad.sim", "lifecycleState": "AVAILABLE"}, {"etag": "1"}
        raise Refused(404, "NotFound", f"{method} {path} is not served by this simulation")

    # -- Object Storage ------------------------------------------------------------------------------
    def _object(self, method: str, namespace: str, bucket: str, name: str, query: dict, headers: Any,
                body: bytes) -> tuple[int, Any, dict]:
        key = (namespace, bucket, name)
        with self.lock:
            if method == "PUT":
                # PutObject with ``if-none-match: *`` fails if the object exists, checked and written as one step
                # (under the lock): the SDK's put_object documents the header ("The only valid value is '*', which
                # indicates that the request should fail if the resource already exists",
                # oci/object_storage/object_storage_client.py), and its oci/base_client.py names the answer
                # Object Storage gives, HTTP 412 (Precondition Failed) with code IfNoneMatchFailed.
                if headers.get("if-none-match") == "*" and key in self.objects:
                    raise Refused(412, "IfNoneMatchFailed", f"object {name} already exists")
                self.objects[key] = (body, time.time())
                self.multipart_md5.pop(key, None)
                return 200, None, {"etag": hashlib.md5(body).hexdigest()}
            if not name and method == "GET":
                return 200, self._list(namespace, bucket, query), {}
            stored = self.objects.get(key)
            if stored is None:
                raise Refused(404, "ObjectNotFound", f"object {name} not found in bucket {bucket}")
            if method == "DELETE":
                del self.objects[key]
                self.multipart_md5.pop(key, None)
                return 204, None, {}
            data, modified = stored
            etag = hashlib.md5(data).hexdigest()
            # if-match pins a read to one version of the object; another answers 412 (the SDK's get_object docstring:
            # "If the specified ETag matches the ETag of the existing resource, GET and HEAD requests will return
            # the resource"), which the SDK's DownloadManager relies on for the parts of one download.
            if headers.get("if-match") not in (None, etag):
                raise Refused(412, "IfMatchFailed", f"object {name} has changed")
            # An object committed from parts carries opc-multipart-md5 instead of content-md5 (the SDK's
            # DownloadManager tells the two apart by these headers).
            md5 = ({"opc-multipart-md5": self.multipart_md5[key]} if key in self.multipart_md5
                   else {"content-md5": base64.b64encode(hashlib.md5(data).digest()).decode()})
            meta = {"etag": etag, **md5, "last-modified": email.utils.formatdate(modified, usegmt=True),
                    "content-type": "application/octet-stream", "accept-ranges": "bytes",
                    "version-id": f"v{int(modified * 1e6)}", "storage-tier": "Standard"}
            wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", headers.get("range") or "")
            if wanted and method == "GET":
                first = int(wanted[1])
                last = min(int(wanted[2]) if wanted[2] else len(data) - 1, len(data) - 1)
                meta["content-range"] = f"bytes {first}-{last}/{len(data)}"
                return 206, data[first:last + 1], meta
            return 200, data, meta  # for HEAD the handler sends the headers only

    def _multipart(self, method: str, key: tuple[str, str, str], query: dict, headers: Any,
                   body: bytes) -> tuple[int, Any, dict]:
        """Multipart uploads as the SDK calls them (oci/object_storage/object_storage_client.py): POST .../u starts
        one (CreateMultipartUploadDetails: object), PUT .../u/{object}?uploadId&uploadPartNum uploads a part
        (answered with its etag and opc-content-md5, which MultipartObjectAssembler reads), POST
        .../u/{object}?uploadId commits the parts listed (partsToCommit: partNum, etag) as one object, DELETE
        aborts, GET .../u lists the uploads not yet committed or aborted (ListMultipartUploads: a list of
        MultipartUpload). OCI's multipart page: part numbers 1 to 10,000, the object is assembled in part-number order
        and appears only once committed; Content-MD5, when sent, must match the body (HTTP 400 otherwise)."""
        namespace, bucket, name = key
        if method == "GET" and not name:
            with self.lock:
                listed = [{"namespace": ns, "bucket": b, "object": obj, "uploadId": upload_id,
                           "timeCreated": _iso(time.time()), "storageTier": "Standard"}
                          for upload_id, ((ns, b, obj), _) in self.uploads.items() if (ns, b) == (namespace, bucket)]
            return 200, listed, {}
        if method == "POST" and not name:
            details = json.loads(body or b"{}")
            if not isinstance(details.get("object"), str):
                raise Refused(400, "InvalidParameter", "object: required")
            upload_id = f"upload-{next(self.ids)}"
            with self.lock:
                self.uploads[upload_id] = ((namespace, bucket, details["object"]), {})
            return 200, {"namespace": namespace, "bucket": bucket, "object": details["object"], "uploadId": upload_id,
                         "timeCreated": _iso(time.time()), "storageTier": "Standard"}, {}
        with self.lock:
            upload = self.uploads.get(query.get("uploadId", ""))
        if upload is None or upload[0] != key:
            raise Refused(404, "NoSuchUpload", f"no upload {query.get('uploadId')} of {name}")
        parts = upload[1]
        if method == "PUT":
            number = int(query.get("uploadPartNum", "0"))
            if not 1 <= number <= 10_000:
                raise Refused(400, "InvalidParameter", "uploadPartNum: 1 to 10000")
            md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
            if headers.get("content-md5") not in (None, md5):
                raise Refused(400, "UnmatchedContentMD5", f"The computed MD5 of the request body ({md5}) does not "
                                                          f"match the Content-MD5 header ({headers['content-md5']})")
            with self.lock:
                parts[number] = body
            return 200, None, {"etag": hashlib.md5(body).hexdigest(), "opc-content-md5": md5}
        if method == "DELETE":
            with self.lock:
                self.uploads.pop(query["uploadId"], None)
            return 204, None, {}
        if method == "POST":
            listed = sorted((part["partNum"], part["etag"]) for part in json.loads(body)["partsToCommit"])
            with self.lock:
                if any(number not in parts or hashlib.md5(parts[number]).hexdigest() != etag
                       for number, etag in listed):
                    raise Refused(400, "InvalidParameter", "a part to commit was not uploaded as listed")
                data = b"".join(parts[number] for number, _ in listed)
                digest = hashlib.md5(b"".join(hashlib.md5(parts[number]).digest() for number, _ in listed))
                self.objects[key] = (data, time.time())
                self.multipart_md5[key] = f"{base64.b64encode(digest.digest()).decode()}-{len(listed)}"
                del self.uploads[query["uploadId"]]
            return 200, None, {"etag": hashlib.md5(data).hexdigest(), "opc-multipart-md5": self.multipart_md5[key]}
        raise Refused(404, "NotFound", f"{method} on a multipart upload is not served by this simulation")

    def _list(self, namespace: str, bucket: str, query: dict) -> dict[str, Any]:
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter")
        start, limit = query.get("start", ""), int(query.get("limit", "1000"))
        objects, prefixes = [], set()
        for (ns, b, name), (data, modified) in sorted(self.objects.items()):
            if ns != namespace or b != bucket or not name.startswith(prefix) or name < start:
                continue
            rest = name[len(prefix):]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter)[0] + delimiter)
                continue
            objects.append({"name": name, "size": len(data), "etag": hashlib.md5(data).hexdigest(),
                            "md5": base64.b64encode(hashlib.md5(data).digest()).decode(),
                            "timeCreated": _iso(modified), "timeModified": _iso(modified)})
        page, rest = objects[:limit], objects[limit:]
        return {"objects": page, "prefixes": sorted(prefixes), **({"nextStartWith": rest[0]["name"]} if rest else {})}

    # -- Data Science --------------------------------------------------------------------------------
    def _create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        job_id = f"ocid1.datasciencejob.oc1.iad.sim{next(self.ids)}"
        job = {**body, "id": job_id, "lifecycleState": "ACTIVE", "timeCreated": _iso(time.time()),
               "createdBy": USER}
        with self.lock:
            self.jobs[job_id] = job
        return job

    def _delete_job(self, job: dict[str, Any], query: dict[str, str]) -> tuple[int, Any, dict]:
        """The service refuses to delete a job while its runs are in progress (ADS, dsc_job.py DSCJob.delete:
        "the deletion fails when associated job runs are in progress"); 409 IncorrectState is how OCI's API
        answers a request that conflicts with a resource's state."""
        with self.lock:
            runs = [run for run in self.runs.values() if run.job is job]
            busy = [run.id for run in runs if run.state not in ("SUCCEEDED", "FAILED", "CANCELED", "DELETED")]
            if busy:
                raise Refused(409, "IncorrectState", f"job {job['id']} has job runs in progress: {', '.join(busy)}")
            job["lifecycleState"] = "DELETED"
            if query.get("deleteRelatedJobRuns") == "true":
                for run in runs:
                    run.state = "DELETED"
        return 204, None, {}

    def _create_run(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self.jobs.get(body["jobId"])
        if job is None or job["lifecycleState"] != "ACTIVE":
            raise Refused(404, "NotAuthorizedOrNotFound", f"job {body['jobId']} not found or not active")
        run = JobRun(f"ocid1.datasciencejobrun.oc1.iad.sim{next(self.ids)}", job, body, log=self._log_of(job))
        with self.lock:
            self.runs[run.id] = run
        threading.Thread(target=self._execute, args=(run,), daemon=True).start()
        return self._run_view(run)

    def _log_of(self, job: dict[str, Any]) -> dict[str, str]:
        """A job run's logDetails: the job's log, or one the service creates in the job's log group when the job
        names only the group (enableAutoLogCreation; JobRun.log_details in the SDK)."""
        config = job.get("jobLogConfigurationDetails") or {}
        if not config.get("enableLogging") or not config.get("logGroupId"):
            return {}
        log_id = config.get("logId") if not config.get("enableAutoLogCreation") else \
            f"ocid1.log.oc1.iad.simauto{next(self.ids)}"
        return {"logGroupId": config["logGroupId"], "logId": log_id}

    def _run_view(self, run: JobRun) -> dict[str, Any]:
        view = {"id": run.id, "jobId": run.job["id"], "projectId": run.body["projectId"],
                "compartmentId": run.body["compartmentId"], "displayName": run.body.get("displayName"),
                "lifecycleState": run.state, "lifecycleDetails": run.details, "timeAccepted": _iso(run.created),
                "createdBy": USER, "freeformTags": run.body.get("freeformTags", {}),
                **({"timeStarted": _iso(run.started)} if run.started else {}),
                **({"timeFinished": _iso(run.finished)} if run.finished else {}),
                **({"logDetails": run.log} if run.log else {}),
                **{name: run.body[name] for name in OVERRIDES if name in run.body}}
        if run.groups:
            view["nodeGroupDetailsList"] = [{"name": name, "lifecycleState": state, "lifecycleDetails": details}
                                            for name, (state, details) in run.groups.items()]
        return view

    def _node_plan(self, run: JobRun) -> list[tuple[str, int, str, dict[str, str], dict[str, Any]]]:
        """(group, NODE_RANK, node label, env, container) per node, as the service would start them."""
        job = run.job
        multi = _node_configuration(run)
        if multi:
            groups = multi["jobNodeGroupConfigurationDetailsList"]
            plan = []
            for group in groups:
                for index in range(group["replicas"]):
                    rank = index if self.rank_numbering == "per_group" and len(groups) > 1 else len(plan)
                    plan.append((group["name"], rank, f"{group['name']}#{index}",
                                 dict(group["jobConfigurationDetails"].get("environmentVariables", {})),
                                 group["jobEnvironmentConfigurationDetails"]))
            return plan
        env = {**job["jobConfigurationDetails"].get("environmentVariables", {}),
               **run.body.get("jobConfigurationOverrideDetails", {}).get("environmentVariables", {})}
        container = (run.body.get("jobEnvironmentConfigurationOverrideDetails")
                     or job["jobEnvironmentConfigurationDetails"])
        return [("", 0, env.get("LAUNCHER_NODE_NAME", run.id), env, container)]

    def _execute(self, run: JobRun) -> None:
        plan = self._node_plan(run)
        multi = bool(_node_configuration(run))
        if multi:
            run.groups = {group: ("CREATING", "") for group, *_ in plan}
        metadata = self.workdir / f"{run.id}-nodes.json"
        for group, rank, label, env, container in plan:
            code_dir = self.images.get(container["image"])
            if code_dir is None or self.dying.get(env.get("LAUNCHER_NODE_NAME", label)) == "never_starts":
                self._finish(run, "FAILED", f"image {container['image']} could not be pulled for node {label}: "
                             "manifest unknown", group or None)
                return
            node = Node(label, rank, group, self._service_env(run, len(run.nodes), multi, rank, len(plan), metadata)
                        | env | self.node_env)
            argv = [sys.executable if part == "python" else part for part in container.get("entrypoint", []) +
                    container.get("cmd", [])]
            with self.lock:  # stop() kills every node it can see: none may start after it looked
                if self.stopped:
                    return
                node.process = subprocess.Popen(argv, cwd=code_dir, env=node.env, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, start_new_session=True)
                run.nodes.append(node)
            threading.Thread(target=self._pump, args=(node,), daemon=True).start()
        if multi and not self.metadata_held:
            self.write_metadata(run)
        with self.lock:
            if run.state == "ACCEPTED":
                run.state, run.started = "IN_PROGRESS", time.time()
                run.groups = {group: ("ACTIVE", "") for group in run.groups}
            elif run.state == "CANCELING":  # cancelled while its nodes were being started
                self._stop_nodes(run)
        ended = []  # in the order the nodes exit: the first failure is the one the service reports
        waiters = [threading.Thread(target=self._wait, args=(node, ended)) for node in run.nodes]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join()
        failed = [node for node in ended if node.exit_code != 0]
        if run.state in ("CANCELING", "CANCELED"):
            time.sleep(max(0.0, (run.cancelled or 0) + self.cancel_seconds - time.time()))
            self._finish(run, "CANCELED", "canceled by the user", None)
        elif failed:
            # How the service states a failed run's exit code (ADS reads "exit code N" from lifecycleDetails:
            # dsc_job.py DataScienceJobRun.exit_code; the wording is that of ADS's tests, test_jobs_run.py).
            self._finish(run, "FAILED", f"Job run artifact execution failed with exit code {failed[0].exit_code}.",
                         failed[0].group or None)
        else:
            self._finish(run, "SUCCEEDED", "", None)

    def _wait(self, node: Node, ended: list[Node]) -> None:
        status = node.process.wait()
        node.exit_code = 128 - status if status < 0 else status  # a container killed by signal N exits 128+N
        with self.lock:
            ended.append(node)

    def write_metadata(self, run: JobRun, count: int | None = None) -> None:
        """CLUSTER_NODES_METADATA_FILE: a JSON list of {"Rank", "IPAddress"} (ADS's DTv2 constants), of the
        first ``count`` nodes (None: all)."""
        entries = [{"Rank": node.rank, "IPAddress": self.node_address} for node in run.nodes]
        path = self.workdir / f"{run.id}-nodes.json"
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(entries[:count] if count is not None else entries))
        partial.replace(path)

    def _service_env(self, run: JobRun, index: int, multi: bool, rank: int, size: int,
                     metadata: Path) -> dict[str, str]:
        """What the service sets: the job run's OCIDs and a resource principal (OCI's "Job Environment
        Variables" page; ADS signs with OCI_RESOURCE_PRINCIPAL_VERSION), and in multi-node runs NODE_RANK,
        INITIAL_CLUSTER_SIZE and CLUSTER_NODES_METADATA_FILE (what ADS's driver_pytorch.py reads). No node
        group name and no socket interface variables: no source documents either."""
        key = new_key()
        jti = f"{run.id}-{index}"
        claims = {"res_tenant": TENANCY, "res_compartment": run.body["compartmentId"], "jti": jti,
                  "exp": int(time.time()) + 3600, "iat": int(time.time())}
        header = _b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
        token = f"{header}.{_b64url(json.dumps(claims).encode())}.{_b64url(b'sim')}"
        with self.lock:
            self.keys[f"rpst:{jti}"] = key.public_key()
        pem_file = self.workdir / f"{jti}.pem"
        pem_file.write_bytes(pem(key))
        env = {"PATH": os.environ["PATH"], "HOME": str(self.workdir), "LANG": "C.UTF-8",
               "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
               "JOB_RUN_OCID": run.id, "JOB_OCID": run.job["id"], "TENANCY_OCID": TENANCY,
               "PROJECT_OCID": run.body["projectId"], "JOB_RUN_COMPARTMENT_OCID": run.body["compartmentId"],
               "OCI_RESOURCE_PRINCIPAL_VERSION": "2.2", "OCI_RESOURCE_PRINCIPAL_RPST": token,
               "OCI_RESOURCE_PRINCIPAL_PRIVATE_PEM": str(pem_file), "OCI_RESOURCE_PRINCIPAL_REGION": REGION}
        if multi:
            env.update({"NODE_RANK": str(rank), "INITIAL_CLUSTER_SIZE": str(size),
                        "CLUSTER_NODES_METADATA_FILE": str(metadata)})
        return env

    def _pump(self, node: Node) -> None:
        for raw in node.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            node.output.append((time.time(), line))
            name = node.env.get("LAUNCHER_NODE_NAME", node.name)
            if self.dying.get(name) in ("dies", "dies_once") and self.dies_at in line:
                if self.dying[name] == "dies_once":
                    del self.dying[name]
                os.killpg(node.process.pid, signal.SIGKILL)

    def _finish(self, run: JobRun, state: str, details: str, failed_group: str | None) -> None:
        with self.lock:
            run.state, run.details, run.finished, run.ended_as = state, details, time.time(), state
            run.groups = {name: (("FAILED", details) if name == failed_group else
                                 ("DELETED" if state != "FAILED" else "ACTIVE", "")) for name in run.groups}

    def _cancel(self, run: JobRun) -> None:
        """CANCELING until its nodes have stopped (and ``cancel_seconds`` have passed), then CANCELED."""
        with self.lock:
            if run.state in ("SUCCEEDED", "FAILED", "CANCELED", "DELETED"):
                return
            run.state, run.cancelled = "CANCELING", time.time()
            self._stop_nodes(run)

    def _stop_nodes(self, run: JobRun) -> None:
        for node in run.nodes:
            if node.process and node.process.poll() is None:
                os.killpg(node.process.pid, signal.SIGTERM)

    # -- Logging -------------------------------------------------------------------------------------
    def _search(self, data: dict[str, Any], query: dict[str, str]) -> tuple[int, Any, dict]:
        """SearchLogs as ADS meets it (ads/common/oci_logging.py): a window of at most 14 days, pages of at most
        the request's limit (1,000), 400 "search result is too large" for a window holding too much; lines become
        searchable only some time after they were written (ADS reads on 90 s after a run ends, dsc_job.py)."""
        start, end = (_parse_time(data.get(name, "")) for name in ("timeStart", "timeEnd"))
        if not start < end or end - start > 14 * 24 * 3600:
            raise Refused(400, "InvalidParameter", "timeStart must be before timeEnd, at most 14 days earlier")
        found = re.search(r'search "([^"]+)/([^"/]+)/([^"/]+)" \| where source = \'\*([^\']+)\'',
                          data.get("searchQuery", ""))
        run = self.runs.get(found[4]) if found else None
        if run is None or run.log != {"logGroupId": found[2], "logId": found[3]}:
            return 200, {"results": [], "summary": {"resultCount": 0, "fieldCount": 0}}, {}
        visible = time.time() - self.log_delay
        lines = sorted((at, line) for node in run.nodes for at, line in node.output
                       if start <= at < end and at <= visible)
        if self.search_too_large is not None and len(lines) > self.search_too_large:
            raise Refused(400, "InvalidParameter", "The search result is too large. Please narrow the time range.")
        first = int(query.get("page", "0"))
        size = min(int(query.get("limit", "100")), self.search_page)
        results = [{"data": {"datetime": int(at * 1000), "logContent": {
            "data": {"message": line}, "source": run.id, "type": "com.oraclecloud.datascience.jobrun.stdout"}}}
            for at, line in lines[first:first + size]]
        more = {"opc-next-page": str(first + size)} if first + size < len(lines) else {}
        return 200, {"results": results, "summary": {"resultCount": len(results), "fieldCount": 0}}, more


def _node_configuration(run: JobRun) -> dict[str, Any] | None:
    """A multi-node run's nodes: its own override (CreateJobRunDetails.jobNodeConfigurationOverrideDetails, a
    MultiNodeJobNodeConfigurationDetails in the SDK; the Terraform provider's oci_datascience_job_run documents its
    node groups and their env), else the job's. The override is taken whole here: how the service combines one with
    the job's node groups is documented nowhere, and launcher sends every group, so either way starts the same nodes."""
    return run.body.get("jobNodeConfigurationOverrideDetails") or run.job.get("jobNodeConfigurationDetails")


def _parse_time(text: str) -> float:
    import datetime

    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise Refused(400, "InvalidParameter", f"not an RFC 3339 time: {text!r}") from None


def _iso(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp * 1000) % 1000:03d}Z"
