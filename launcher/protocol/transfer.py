"""Whole files to and from the work dir in bounded memory, in parts and in parallel where the store has parts.

Uploads to S3 go through s3transfer, the transfer code AWS keeps (what boto3's ``upload_file`` and the AWS CLI
run: 8 MiB parts, 10 requests at once, at most 10 parts in memory); OCI Object Storage through the SDK's
multipart calls, driven here because its UploadManager misses the goal (see ``OciTransfers``); a local
directory by a kernel copy (``sendfile``). Parts go several at once, a failed part is retried, a failed upload
aborted. Downloads from both object stores are one streamed GET per object up to SINGLE_GET_UP_TO, and at most
RANGES_PER_OBJECT ranged GETs above (see ``ranges``), pinned to one version of the object.

Every transfer is watched as it goes (``Watch``): each chunk moved is a sign of life for the store's outage
clock (a slow transfer that moves bytes is no outage; one that moves none for the limit ends), counts in the
caller's ``Progress``, and a transfer whose ``Progress`` is stopped ends at its next chunk (``Cancelled``).

No reader ever sees part of a file: a multipart upload is invisible until it is completed, a local copy
is written under a hidden name (listings skip dot-names) and renamed, and a download goes to a hidden
sibling that is renamed into place. An upload reads the file through the handle the caller opened, so a
checkpoint renamed over the file meanwhile cannot mix two versions in one object.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import uuid
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any, BinaryIO, Callable, Iterable, Protocol, Sequence, TypeVar

from launcher.protocol.outage import Request

T = TypeVar("T")
R = TypeVar("R")

FILES_AT_ONCE = 4  # files transferred in parallel by one sync or restore; each also sends parts in parallel
OCI_PART_SIZE = 16 * 2**20  # above the service's smallest part
OCI_PARTS_AT_ONCE = 4  # per file
SINGLE_GET_UP_TO = 128 * 2**20  # an object up to this size comes down in one streamed GET
RANGES_PER_OBJECT = 8  # a bigger one in this many ranged GETs, at once
GETS_AT_ONCE = 10  # per process, over all files (botocore's connection pool holds 10)
CHECK_SECONDS = 0.5  # how often a transfer's waiter looks at its Watch while no part ends
OCI_PARTS_IN_MEMORY = 6  # per process: at most 96 MiB of parts read and not yet sent
OCI_MAX_PARTS = 10_000  # Object Storage's limit per upload: bigger files get bigger parts
COPY_CHUNK = 8 * 2**20
STREAM_CHUNK = 2**20


class Cancelled(Exception):
    """A transfer stopped because its process is ending (the run was cancelled): never retried."""


def temporary_name(path: str) -> str:
    """A hidden sibling: listings skip names starting with a dot, so readers never see partial files."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.{uuid.uuid4().hex}.tmp")


class Progress:
    """The bytes a set of transfers (a restore) has moved, of ``total``; ``stop`` set, each ends at its next chunk."""

    def __init__(self, total: int = 0, stop: threading.Event | None = None):
        self.total = total
        self.done = 0
        self.stop = stop or threading.Event()
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        with self._lock:
            self.done += count


class Watch:
    """What one transfer tells and asks as it goes: a chunk moved is a sign of life on its request's outage clock and
    counts in ``progress``; ``check`` raises once it must end (``Cancelled``; the clock's ``TimeoutError``)."""

    def __init__(self, request: Request | None = None, progress: Progress | None = None):
        self.request = request
        self.progress = progress

    def moved(self, count: int) -> None:
        if self.request and count > 0:
            self.request.moved()
        if self.progress:
            self.progress.add(count)

    def check(self) -> None:
        if self.progress and self.progress.stop.is_set():
            raise Cancelled("stopped: the node is ending")
        if self.request:
            self.request.check()


class Transfers(Protocol):
    def upload(self, handle: BinaryIO, path: str, watch: Watch) -> None:
        """Write the file open as ``handle`` (from its start) as the object ``path``, whole or not at all."""

    def download(self, path: str, target: BinaryIO, watch: Watch) -> bool:
        """Write the object ``path`` into ``target`` (an empty file); False if there is no such object."""

    def abort_unfinished(self, prefix: str) -> None:
        """Abort the multipart uploads of objects under ``prefix`` that were begun and never completed."""


def for_store(fs: Any, *, local: bool) -> Transfers:
    """The transfers for an fsspec filesystem: a local directory, s3fs or ocifs."""
    if local:
        return LocalTransfers()
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if "s3" in protocols:
        return S3Transfers(fs)
    if "oci" in protocols:
        return OciTransfers(fs)
    raise ValueError(f"no file transfers for {protocols[0]}:// work dirs")


def download_file(transfers: Transfers, path: str, local_path: str, watch: Watch) -> bool:
    """The object ``path`` into ``local_path``, which appears once complete; False if there is no such object."""
    return _publish(local_path, lambda target: transfers.download(path, target, watch))


def _publish(path: str, write: Callable[[BinaryIO], bool]) -> bool:
    """A new file written by ``write`` into a hidden sibling of ``path`` (listings and syncs skip dot-names), renamed
    to ``path`` if ``write`` returns True. The sibling never outlives this, also when ``write`` fails."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as target:
            written = write(target)
        if written:
            os.replace(tmp, path)
        return written
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def each(action: Callable[[T], R], items: Sequence[T]) -> list[R | Exception]:
    """``action`` on every item, FILES_AT_ONCE at a time: each item's result, or the exception it raised.

    Every action has ended when this returns: nothing still writes while the caller reports a failure."""
    def attempt(item: T) -> R | Exception:
        try:
            return action(item)
        except Exception as exc:
            return exc

    if len(items) <= 1:
        return [attempt(item) for item in items]
    with ThreadPoolExecutor(FILES_AT_ONCE, thread_name_prefix="launcher-transfer") as pool:
        return list(pool.map(attempt, items))


def raise_first_failure(outcomes: Sequence[object]) -> None:
    """Raise the first exception among ``each``'s outcomes, if any."""
    failed = next((outcome for outcome in outcomes if isinstance(outcome, Exception)), None)
    if failed is not None:
        raise failed


def same_file(handle: BinaryIO) -> str:
    """A path that opens the very file ``handle`` has open, even after it was renamed over or removed
    (Linux's /proc/self/fd); the libraries open files by path, once per part."""
    path = f"/proc/self/fd/{handle.fileno()}"
    return path if os.path.exists(path) else handle.name


class LocalTransfers:
    def abort_unfinished(self, prefix: str) -> None:
        """A directory has no uploads in parts: a copy under way is a hidden file, removed with its directory."""

    def upload(self, handle: BinaryIO, path: str, watch: Watch) -> None:
        def copy(target: BinaryIO) -> bool:
            _copy(handle, target, watch)
            return True

        _publish(path, copy)

    def download(self, path: str, target: BinaryIO, watch: Watch) -> bool:
        try:
            source = open(path, "rb")
        except FileNotFoundError:
            return False
        with source:
            _copy(source, target, watch)
        return True


def _copy(source: BinaryIO, target: BinaryIO, watch: Watch) -> None:
    """The whole of ``source`` into ``target`` by the kernel, a chunk at a time."""
    offset = 0
    while sent := os.sendfile(target.fileno(), source.fileno(), offset, COPY_CHUNK):
        offset += sent
        watch.moved(sent)
        watch.check()


def ranges(size: int) -> list[tuple[int, int]]:
    """The (start, end) byte ranges an object of ``size`` bytes is fetched in: one up to SINGLE_GET_UP_TO, else
    RANGES_PER_OBJECT equal ones. Their number is bounded, not their size: a store that reads the whole object for
    each ranged GET (moto) pays for it RANGES_PER_OBJECT times at most, where s3transfer's 8 MiB ranges made a 1 GiB
    restore read 128 GiB there (97 s, against 2.1 s for one GET); S3 itself streams each range as fast."""
    if size <= SINGLE_GET_UP_TO:
        return [(0, size)] if size else []
    part = -(-size // RANGES_PER_OBJECT)
    return [(start, min(start + part, size)) for start in range(0, size, part)]


def fetch_ranges(size: int, fetch: Callable[[int, int], Iterable[bytes]], target: BinaryIO, watch: Watch,
                 slots: threading.BoundedSemaphore) -> None:
    """``size`` bytes into ``target``, each of ``ranges(size)`` streamed into its place by ``fetch(start, end)``
    (its chunks), several at once, each holding one of ``slots`` (the process's requests at once) while it runs."""
    def one(bounds: tuple[int, int], abandoned: threading.Event) -> None:
        start, end = bounds
        with slots:
            watch.check()
            fd = os.dup(target.fileno())  # its own: a range still running when the waiter gave up writes nowhere else
            try:
                offset = start
                for chunk in fetch(start, end):
                    offset += os.pwrite(fd, chunk, offset)
                    watch.moved(len(chunk))
                    if abandoned.is_set():
                        return
                    watch.check()
            finally:
                os.close(fd)
        if offset != end:
            raise ConnectionError(f"the store sent {offset - start} bytes of {end - start} (bytes {start}-{end - 1})")

    in_parallel(one, ranges(size), watch, RANGES_PER_OBJECT)


class S3Transfers:
    def __init__(self, fs: Any):
        from s3transfer.manager import TransferConfig, TransferManager

        self._split = fs.split_path
        self._client = _s3_client(fs)
        # s3transfer's defaults are boto3's upload_file's: 8 MiB parts, 10 requests, 10 parts in memory.
        self._manager = TransferManager(self._client, TransferConfig())
        self._gets = threading.BoundedSemaphore(GETS_AT_ONCE)

    def upload(self, handle: BinaryIO, path: str, watch: Watch) -> None:
        from s3transfer.subscribers import BaseSubscriber

        ended = threading.Event()

        class Watching(BaseSubscriber):
            def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
                watch.moved(bytes_transferred)  # negative when a part is sent again

            def on_done(self, future: Any, **kwargs: Any) -> None:
                ended.set()

        bucket, key, _ = self._split(path)
        future = self._manager.upload(same_file(handle), bucket, key, subscribers=[Watching()])
        try:
            while not ended.wait(CHECK_SECONDS):
                watch.check()
        except BaseException:
            future.cancel()  # s3transfer aborts the multipart upload
            raise
        future.result()

    def abort_unfinished(self, prefix: str) -> None:
        bucket, key_prefix, _ = self._split(prefix)
        pages = self._client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket,
                                                                              Prefix=key_prefix.rstrip("/") + "/")
        for upload in (upload for page in pages for upload in page.get("Uploads", [])):
            self._client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])

    def download(self, path: str, target: BinaryIO, watch: Watch) -> bool:
        bucket, key, _ = self._split(path)
        try:
            head = self._client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return False
            raise

        def fetch(start: int, end: int) -> Iterable[bytes]:
            body = self._client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                                           IfMatch=head["ETag"])["Body"]
            with body:
                yield from body.iter_chunks(STREAM_CHUNK)

        fetch_ranges(head["ContentLength"], fetch, target, watch, self._gets)
        return True


def _s3_client(fs: Any) -> Any:
    """A botocore client made as s3fs makes its own (credentials, endpoint, client and config options), for
    s3transfer, which needs a synchronous one."""
    import botocore
    import botocore.config
    import botocore.session

    options = {"connect_timeout": fs.connect_timeout, "read_timeout": fs.read_timeout, **fs.config_kwargs}
    credentials = {"aws_access_key_id": fs.key, "aws_secret_access_key": fs.secret, "aws_session_token": fs.token}
    if fs.anon:
        options["signature_version"] = botocore.UNSIGNED
        credentials = {}
    arguments = {name: value for name, value in {**credentials, "endpoint_url": fs.endpoint_url}.items()
                 if value is not None}
    session = botocore.session.Session(**fs.kwargs)
    return session.create_client("s3", config=botocore.config.Config(**options), **{**arguments, **fs.client_kwargs})


class OciTransfers:
    def __init__(self, fs: Any):
        self._fs = fs
        self._client = fs.oci_client
        self._parts_in_memory = threading.BoundedSemaphore(OCI_PARTS_IN_MEMORY)  # over all files at once
        self._gets = threading.BoundedSemaphore(GETS_AT_ONCE)

    def upload(self, handle: BinaryIO, path: str, watch: Watch) -> None:
        bucket, namespace, name = self._fs.split_path(path)
        size = os.fstat(handle.fileno()).st_size
        part_size = max(OCI_PART_SIZE, -(-size // OCI_MAX_PARTS))
        if size <= part_size:
            self._client.put_object(namespace, bucket, name, os.pread(handle.fileno(), size, 0))
            watch.moved(size)
            return
        from oci.object_storage.models import CommitMultipartUploadDetails, CreateMultipartUploadDetails

        upload_id = self._client.create_multipart_upload(
            namespace, bucket, CreateMultipartUploadDetails(object=name)).data.upload_id
        try:
            parts = in_parallel(lambda number, abandoned: self._upload_part(
                handle, (namespace, bucket, name, upload_id), number, part_size, watch, abandoned),
                range(1, -(-size // part_size) + 1), watch, OCI_PARTS_AT_ONCE, wait_for_running=True)
            self._client.commit_multipart_upload(namespace, bucket, name, upload_id,
                                                 CommitMultipartUploadDetails(parts_to_commit=parts))
        except BaseException:
            self._abort(namespace, bucket, name, upload_id)
            raise

    def _upload_part(self, handle: BinaryIO, upload: tuple[str, str, str, str], number: int, part_size: int,
                     watch: Watch, abandoned: threading.Event) -> Any:
        """Part ``number`` (from 1) read as bytes, which the SDK can send again when it retries.

        Not the SDK's MultipartObjectAssembler: it streams parts through a reader that its own retries cannot
        rewind (BufferedPartReader.seek leaves its count of bytes read), so a retried part hangs, sent empty."""
        from oci.object_storage.models import CommitMultipartUploadPartDetails

        with self._parts_in_memory:
            if abandoned.is_set():
                raise Cancelled("another part failed")
            watch.check()
            data = os.pread(handle.fileno(), part_size, (number - 1) * part_size)
            md5 = base64.b64encode(hashlib.md5(data).digest()).decode()  # the service checks the part against it
            answer = self._client.upload_part(*upload, number, data, content_md5=md5)
            watch.moved(len(data))
        return CommitMultipartUploadPartDetails(part_num=number, etag=answer.headers["etag"])

    def abort_unfinished(self, prefix: str) -> None:
        from oci.pagination import list_call_get_all_results

        bucket, namespace, name_prefix = self._fs.split_path(prefix)
        uploads = list_call_get_all_results(self._client.list_multipart_uploads, namespace, bucket).data
        for upload in uploads:
            if upload.object.startswith(name_prefix.rstrip("/") + "/"):
                self._client.abort_multipart_upload(namespace, bucket, upload.object, upload.upload_id)

    def _abort(self, namespace: str, bucket: str, name: str, upload_id: str) -> None:
        """Drop an unfinished upload's parts; the store may be what failed, so this may fail too, and matters less."""
        try:
            self._client.abort_multipart_upload(namespace, bucket, name, upload_id)
        except Exception:
            pass

    def download(self, path: str, target: BinaryIO, watch: Watch) -> bool:
        """The object's ranges (``ranges``), each streamed into its place in the file (1 MiB at a time) and pinned
        by if-match to the version the first look found. Not the SDK's DownloadManager: it holds each whole part in
        memory (a process restoring one file of 160 MiB peaked at 203 MiB with it, 66 MiB with streamed ranges),
        and several files at once multiply that."""
        bucket, namespace, name = self._fs.split_path(path)
        try:
            head = self._client.head_object(namespace, bucket, name)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return False
            raise

        def fetch(start: int, end: int) -> Iterable[bytes]:
            answer = self._client.get_object(namespace, bucket, name, range=f"bytes={start}-{end - 1}",
                                             if_match=head.headers["etag"])
            return answer.data.iter_content(chunk_size=STREAM_CHUNK)

        fetch_ranges(int(head.headers["content-length"]), fetch, target, watch, self._gets)
        return True


def in_parallel(action: Callable[[T, threading.Event], R], items: Iterable[T], watch: Watch, at_once: int, *,
                wait_for_running: bool = False) -> list[R]:
    """``action(item, abandoned)`` on every item, ``at_once`` at a time, each result in order; meanwhile the waiter
    checks ``watch``. On the first failure (or the watch's) what has not begun is cancelled, ``abandoned`` is set for
    what runs (it ends at its next chunk), and the error is raised: at once, or with ``wait_for_running`` once what
    ran has ended (parts read from the caller's file, which it closes then)."""
    abandoned = threading.Event()
    pool = ThreadPoolExecutor(at_once, thread_name_prefix="launcher-part")
    futures: list[Future[R]] = [pool.submit(action, item, abandoned) for item in items]
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=CHECK_SECONDS, return_when=FIRST_EXCEPTION)
            for future in done:
                future.result()  # raises the part's error
            watch.check()
        return [future.result() for future in futures]
    except BaseException:
        abandoned.set()
        raise
    finally:
        pool.shutdown(wait=wait_for_running, cancel_futures=True)
