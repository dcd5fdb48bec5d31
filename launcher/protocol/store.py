"""The work dir as a small object store over fsspec: whole-object put, create-if-absent, get, list.

Local directories, ``s3://`` (s3fs) and ``oci://`` (ocifs) are chosen by URL;
credentials come from each library's usual places. Transient errors are retried
with exponential backoff and full jitter. Every request is counted so the
request rate per node can be measured (benchmarks/) and bounded (docs/protocol.md).
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from launcher.errors import EXIT_BACKEND, LauncherError
from launcher.protocol.outage import Outage, Request, deadline_from_env
from launcher.protocol.transfer import Cancelled, temporary_name
from launcher.wording import plural

if TYPE_CHECKING:
    from launcher.protocol.transfer import Progress, Transfers

T = TypeVar("T")

# Errors that retrying cannot fix; anything else from a store is treated as transient.
PERMANENT_TYPES = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError,
                   ValueError, TypeError, ImportError)
PERMANENT_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG,
                    errno.ENOTDIR, errno.EISDIR}
# Names of the exceptions (and S3 / OCI error codes in their messages) that mean "fix the setup":
# matched by name so this module never imports botocore or oci.
PERMANENT_NAMES = ("NoCredentialsError", "PartialCredentialsError", "NoRegionError", "InvalidAccessKeyId",
                   "SignatureDoesNotMatch", "AccessDenied", "NoSuchBucket", "InvalidBucketName",
                   "BucketNotFound", "NotAuthenticated", "NotAuthorizedOrNotFound", "InvalidConfig",
                   "ConfigFileNotFound", "ProfileNotFound")


DEFAULT_REQUEST_TIMEOUT_SECONDS = 60.0
MIN_REQUEST_TIMEOUT_SECONDS = 1.0  # the last request of an outage that nearly reached its limit


class StoreError(LauncherError):
    """The work dir could not be used: a permanent error at once, a transient one after retries."""

    exit_status = EXIT_BACKEND

    def __init__(self, message: str, *, permanent: bool, key: str | None = None, reason: str = ""):
        super().__init__(message)
        self.permanent = permanent
        self.key = key  # the object the operation was about, where it was about one
        self.reason = reason or message  # the store's words alone, e.g. "No space left on device"


def is_permanent(exc: BaseException) -> bool:
    """Whether retrying ``exc`` is pointless: missing bucket, read-only or full disk, no credentials, ..."""
    if isinstance(exc, PERMANENT_TYPES):
        return True
    if isinstance(exc, OSError) and exc.errno in PERMANENT_ERRNOS:
        return True
    if getattr(exc, "status", None) in (401, 403, 404):  # oci.exceptions.ServiceError
        return True
    return bool(set(_error_names(exc)) & set(PERMANENT_NAMES))


def _error_names(exc: BaseException) -> list[str]:
    """Type names and service error codes along the exception's chain (s3fs wraps botocore's
    ClientError in an OSError): matched exactly, never searched for in messages, which hold URLs."""
    names: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names.append(type(current).__name__)
        response = getattr(current, "response", None)
        if isinstance(response, dict):
            names.append(str(response.get("Error", {}).get("Code", "")))
        if type(current).__module__.startswith("oci."):  # ServiceError's code (aiohttp deprecates its own)
            names.append(str(getattr(current, "code", "")))
        current = current.__cause__ or current.__context__
    return names


def describe_error(exc: BaseException) -> str:
    """The store's own words, without a traceback: ``PermissionError: [Errno 13] Permission denied: '/x'``."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def short_reason(exc: BaseException) -> str:
    """What went wrong in a few words: ``No space left on device`` for an OSError with an errno, else its words."""
    if isinstance(exc, OSError) and exc.errno is not None and exc.strerror:
        return exc.strerror
    return describe_error(exc)


class WorkDir:
    """One run's directory, ``{work_dir}/{run_id}``; keys are relative paths like ``nodes/a.json``."""

    def __init__(self, url: str, *, attempts: int | None = None, base_delay: float = 0.1, max_delay: float = 5.0,
                 fresh_instance: bool = False, storage_options: dict[str, Any] | None = None,
                 deadline: float | None = None, request_timeout: float | None = None, outage: Outage | None = None):
        """``attempts``: at most this many tries per operation (None: as many as the outage limit allows);
        ``deadline``: how long an outage may last before this client gives up (default: LAUNCHER_STORE_DEADLINE);
        ``outage``: a clock shared with other clients (then ``deadline`` is its limit)."""
        import fsspec

        self.url = url.rstrip("/")
        kwargs: dict[str, Any] = dict(storage_options or {})
        if fresh_instance:
            kwargs["skip_instance_cache"] = True
        if "://" in self.url and not self.url.startswith("file://"):
            # The protocol needs every LIST fresh from the store: a cached listing of logs/<node>/
            # hides chunks written since, and a follower that then sees the final status stops early.
            kwargs["use_listings_cache"] = False

        if self.url.startswith("oci://"):
            from launcher.ociauth import ocifs_options

            try:
                kwargs = _merged(ocifs_options(), kwargs)
            except LauncherError as exc:
                raise StoreError(f"work dir {self.url}: {exc}", permanent=True) from None
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **kwargs)
        except ImportError as exc:
            raise StoreError(f"work dir {self.url}: {exc}", permanent=True) from None
        self.root = self.root.rstrip("/")
        self.is_local = "file" in _protocols(self.fs)
        self.attempts = attempts
        # Once the store has been unreachable this long, across operations, this client gives up on it:
        # a stalled or vanished store ends in a clear failure within one stated time, never a hang.
        try:
            self.outage = outage or (Outage(deadline, source="this step's own bound") if deadline is not None
                                     else Outage(deadline_from_env()))
        except ValueError as exc:
            raise StoreError(f"work dir {self.url}: {exc}", permanent=True) from None
        # One request to an asynchronous store (s3fs) gives up after this long: a PUT to a store that
        # accepts and never answers otherwise waits forever (its read timeout does not cover it).
        self.request_timeout = request_timeout if request_timeout is not None else float(
            os.environ.get("LAUNCHER_STORE_TIMEOUT", DEFAULT_REQUEST_TIMEOUT_SECONDS))
        self._async = bool(getattr(self.fs, "async_impl", False))
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.requests = 0
        self.retries = 0
        self._lock = threading.Lock()
        self._random = random.Random()

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    @property
    def _timeout(self) -> dict[str, float]:
        """The request timeout for an asynchronous store (s3fs), never past the end of the outage's limit."""
        if not self._async:
            return {}
        return {"timeout": max(MIN_REQUEST_TIMEOUT_SECONDS, min(self.request_timeout, self.outage.remaining()))}

    @property
    def gone(self) -> bool:
        """This client has given up on the store: it was unreachable for the outage limit."""
        return self.outage.exhausted()

    def local_stamp(self, prefixes: tuple[str, ...]) -> tuple[int, ...] | None:
        """For a local work dir, the modification times of these prefixes' directories: a record written (by
        rename) into one changes its stamp, so a reader can look again at once instead of on its next round.
        None for object stores, which offer no such cheap question."""
        if not self.is_local:
            return None
        stamp = []
        for prefix in prefixes:
            try:
                stamp.append(os.stat(self._path(prefix)).st_mtime_ns)
            except OSError:
                stamp.append(0)
        return tuple(stamp)

    def _given_up(self, what: str, key: str | None, error: str) -> StoreError:
        """The error for an operation the outage ended; the clock is told, for clocks that start afresh after."""
        message = f"work dir {self.url}: {what}; the store was {self.outage.describe()}"
        if self.outage.exhausted():
            self.outage.gave_up()
        return StoreError(message, permanent=False, key=key, reason=f"unreachable ({error})")

    def _call(self, what: str, action: Callable[[], T], key: str | None = None) -> T:
        """``action`` until it succeeds; permanent errors at once, transient ones retried while the outage lasts
        less than its limit (and ``attempts`` allows)."""
        return self._call_heard(what, lambda _request: action(), key)

    def _call_heard(self, what: str, action: Callable[[Request], T], key: str | None = None) -> T:
        """``_call`` for an action told of its request on the outage clock: a transfer, which says when bytes move
        (the store's signs of life) and stops when the clock runs out."""
        for attempt in itertools.count(1):
            if self.outage.exhausted():  # given up: no request, so a process that ends does so at once
                raise self._given_up(f"{what} not tried", key, self.outage.error)
            with self._lock:
                self.requests += 1
            request = self.outage.track(self.url, what)
            try:
                result = action(request)
            except Cancelled:
                raise
            except Exception as exc:
                if is_permanent(exc):
                    raise StoreError(f"work dir {self.url}: {what} failed: {describe_error(exc)}",
                                     permanent=True, key=key, reason=short_reason(exc)) from exc
                self.outage.failed(request.heard, describe_error(exc), self.url)
                if attempt == self.attempts or self.outage.exhausted():  # transient, but it lasted
                    raise self._given_up(f"{what} failed after {plural(attempt, 'attempt')}", key,
                                         describe_error(exc)) from exc
                with self._lock:
                    self.retries += 1
                # Full jitter: spreads retries of many nodes hitting the same fault.
                delay = self._random.uniform(0, min(self.max_delay, self.base_delay * 2 ** attempt))
                time.sleep(max(0.0, min(delay, self.outage.remaining())))
                continue
            finally:
                self.outage.untrack(request)
            self.outage.answered(self.url)
            return result
        raise AssertionError("unreachable")

    # -- objects ---------------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        """Write a whole object; readers see the old or the new bytes, never a part."""
        path = self._path(key)
        if self.is_local:
            self._call(f"put {key}", lambda: _local_replace(path, data), key)
        else:
            self._call(f"put {key}", lambda: self.fs.pipe_file(path, data, **self._timeout), key)

    def create(self, key: str, data: bytes) -> bool:
        """Write only if absent; False if the object already exists.

        Atomic on local directories (link), S3 and OCI Object Storage (If-None-Match); on other stores it is
        check-then-write, which the protocol tolerates because racing writers write equal bytes.
        """
        path = self._path(key)

        def attempt() -> bool:
            try:
                if self.is_local:
                    _local_create(path, data)
                elif "oci" in _protocols(self.fs):  # ocifs passes the header on to PutObject
                    self.fs.touch(path, data=data, if_none_match="*")
                else:
                    self.fs.pipe_file(path, data, mode="create", **self._timeout)
                return True
            except FileExistsError:
                return False
            except Exception as exc:
                if _is_precondition_failure(exc):
                    return False
                raise

        return self._call(f"create {key}", attempt, key)

    def get(self, key: str) -> bytes | None:
        path = self._path(key)

        def attempt() -> bytes | None:
            try:
                return self.fs.cat_file(path, **self._timeout)
            except FileNotFoundError:
                return None

        return self._call(f"get {key}", attempt, key)

    def get_record(self, key: str) -> dict[str, Any]:
        """A JSON object record; {} when absent or damaged (a broken node must not break its readers)."""
        import json

        data = self.get(key)
        try:
            value = json.loads(data) if data else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def list(self, prefix: str) -> list[str]:
        """Names directly under ``prefix`` (a directory-like key), fresh from the store; [] if none."""
        return self._keys(prefix, recursive=False)

    def find(self, prefix: str) -> list[str]:
        """Every object key under ``prefix``, recursively, relative to ``prefix``."""
        return self._keys(prefix, recursive=True)

    def _keys(self, prefix: str, *, recursive: bool) -> list[str]:
        path = self._path(prefix).rstrip("/")

        def attempt() -> list[str]:
            try:
                found = (self.fs.find(path, **self._timeout) if recursive
                         else self.fs.ls(path, detail=False, **self._timeout))
            except FileNotFoundError:
                return []
            keys = (name.rstrip("/")[len(path) + 1:] for name in found if name.startswith(path + "/"))
            return sorted(key for key in keys if not key.rsplit("/", 1)[-1].startswith("."))

        return self._call(f"{'find' if recursive else 'list'} {prefix}", attempt)

    def find_stats(self, prefix: str) -> dict[str, tuple[float, int]]:
        """Every object key under ``prefix``, recursively, with the time it was last written (Unix seconds) and its
        size in bytes."""
        path = self._path(prefix).rstrip("/")

        def attempt() -> dict[str, tuple[float, int]]:
            try:
                found = self.fs.find(path, detail=True, **self._timeout)
            except FileNotFoundError:
                return {}
            return {name[len(path) + 1:]: (_modified(info), int(info.get("size") or 0)) for name, info in found.items()
                    if name.startswith(path + "/") and not name.rsplit("/", 1)[-1].startswith(".")}

        return self._call(f"find {prefix}", attempt)

    def remove_all(self) -> None:
        """Delete this run's whole directory. Only ``launcher clean`` does this: nodes never delete.

        On object stores also the uploads a node killed mid-upload left unfinished: no listing shows them, yet the
        store keeps (and bills) their parts until they are aborted."""
        def attempt() -> None:
            try:
                self.fs.rm(self.root, recursive=True, **self._timeout)
            except FileNotFoundError:
                pass
            if not self.is_local:
                self._transfers().abort_unfinished(self.root + "/")

        self._call("remove the run's data", attempt)

    def upload(self, local_path: str, key: str, progress: Progress | None = None) -> tuple[int, int]:
        """Stream a file into the object ``key``, in parts where the store has them; readers see all of it or none.
        ``progress`` counts the bytes and may stop the transfer (:class:`~launcher.protocol.transfer.Cancelled`).

        Returns the (size, mtime in ns) of the bytes uploaded: the file may have been replaced since."""
        from launcher.protocol.transfer import Watch

        transfers = self._transfers()  # made before the request's outage clock starts: making it asks no store
        with open(local_path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            self._call_heard(f"upload {key}", lambda request: transfers.upload(
                handle, self._path(key), Watch(request, progress)), key)
        return stat.st_size, stat.st_mtime_ns

    def download(self, key: str, local_path: str, progress: Progress | None = None) -> bool:
        """Stream the object ``key`` into ``local_path``, which appears only once complete; False if absent.
        ``progress`` as for ``upload``."""
        from launcher.protocol.transfer import Watch, download_file

        transfers = self._transfers()  # made before the request's outage clock starts: making it asks no store
        return self._call_heard(f"download {key}", lambda request: download_file(
            transfers, self._path(key), local_path, Watch(request, progress)), key)

    def _transfers(self) -> Transfers:
        """Made on first use, once: only nodes that move files start s3transfer's threads or load the OCI SDK."""
        from launcher.protocol.transfer import for_store

        with self._lock:
            if getattr(self, "_file_transfers", None) is None:
                self._file_transfers = for_store(self.fs, local=self.is_local)
            return self._file_transfers


def _modified(info: dict[str, Any]) -> float:
    """When an object was written, from a listing's details (local: mtime; S3: LastModified; OCI: timeModified)."""
    for name in ("mtime", "LastModified", "last_modified", "timeModified", "time_modified"):
        value = info.get(name)
        if isinstance(value, (int, float)):
            return float(value)
        if hasattr(value, "timestamp"):
            return value.timestamp()
    return 0.0


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Filesystem options: ``extra`` over ``base``, their client settings (``config_kwargs``) merged too."""
    client = {**base.get("config_kwargs", {}), **extra.get("config_kwargs", {})}
    return {**base, **extra, **({"config_kwargs": client} if client else {})}


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _write_temporary(path: str, data: bytes) -> str:
    """``data`` in a new hidden sibling of ``path``; nothing is left behind when that fails (a full disk)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
    except BaseException:
        _remove_quietly(tmp)
        raise
    return tmp


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _local_replace(path: str, data: bytes) -> None:
    tmp = _write_temporary(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def _local_create(path: str, data: bytes) -> None:
    """Publish complete bytes under ``path`` only if it does not exist (hard link is atomic and exclusive)."""
    tmp = _write_temporary(path, data)
    try:
        os.link(tmp, path)
    finally:
        _remove_quietly(tmp)


def _is_precondition_failure(exc: Exception) -> bool:
    """The store refused a create-if-absent because the object exists (HTTP 412).

    Judged by status and error code, never by digits in a message: an unreachable endpoint on
    port 41234 once read as "already exists".
    """
    current: BaseException | None = exc
    while current is not None:  # ocifs raises OSError(EINVAL) from the SDK's ServiceError(412)
        status = getattr(current, "status", None)  # oci.exceptions.ServiceError
        response = getattr(current, "response", None)  # botocore.exceptions.ClientError
        if isinstance(response, dict):
            status = status or response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if response.get("Error", {}).get("Code") == "PreconditionFailed":
                return True
        if status == 412 or "PreconditionFailed" in type(current).__name__:
            return True
        current = current.__cause__ or current.__context__
    return False
