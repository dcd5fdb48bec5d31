"""Whole files to and from the work dir in bounded memory, in parts and in parallel where the store has parts.

S3 goes through s3transfer, the transfer code AWS keeps (what boto3's ``upload_file`` and the AWS CLI run:
8 MiB parts, 10 requests at once, at most 10 parts in memory); OCI Object Storage through the SDK's multipart
and ranged calls, driven here because its UploadManager and DownloadManager miss the goal (see
``OciTransfers``); a local directory by a kernel copy (``sendfile``). Parts go several at once, a failed part
is retried, a failed upload aborted, and ranged reads are pinned to one version of the object.

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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Callable, Protocol, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

FILES_AT_ONCE = 4  # files transferred in parallel by one sync or restore; each also sends parts in parallel
OCI_PART_SIZE = 16 * 2**20  # above the service's smallest part
OCI_PARTS_AT_ONCE = 4  # per file
OCI_PARTS_IN_MEMORY = 6  # per process: at most 96 MiB of parts read and not yet sent
OCI_MAX_PARTS = 10_000  # Object Storage's limit per upload: bigger files get bigger parts
COPY_CHUNK = 8 * 2**20
STREAM_CHUNK = 2**20


class Transfers(Protocol):
    def upload(self, handle: BinaryIO, path: str) -> None:
        """Write the file open as ``handle`` (from its start) as the object ``path``, whole or not at all."""

    def download(self, path: str, target: BinaryIO) -> bool:
        """Write the object ``path`` into ``target`` (an empty file); False if there is no such object."""


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


def download_file(transfers: Transfers, path: str, local_path: str) -> bool:
    """The object ``path`` into ``local_path``, which appears once complete; False if there is no such object."""
    return _publish(local_path, lambda target: transfers.download(path, target))


def _publish(path: str, write: Callable[[BinaryIO], bool]) -> bool:
    """A new file written by ``write`` into a hidden sibling of ``path`` (listings and syncs skip dot-names), renamed
    to ``path`` if ``write`` returns True. The sibling never outlives this, also when ``write`` fails."""
    from launcher.node.store import temporary_name

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
    def upload(self, handle: BinaryIO, path: str) -> None:
        def copy(target: BinaryIO) -> bool:
            _copy(handle, target)
            return True

        _publish(path, copy)

    def download(self, path: str, target: BinaryIO) -> bool:
        try:
            source = open(path, "rb")
        except FileNotFoundError:
            return False
        with source:
            _copy(source, target)
        return True


def _copy(source: BinaryIO, target: BinaryIO) -> None:
    """The whole of ``source`` into ``target`` by the kernel, a chunk at a time."""
    offset = 0
    while sent := os.sendfile(target.fileno(), source.fileno(), offset, COPY_CHUNK):
        offset += sent


class S3Transfers:
    def __init__(self, fs: Any):
        from s3transfer.manager import TransferConfig, TransferManager

        self._split = fs.split_path
        # s3transfer's defaults are boto3's upload_file's: 8 MiB parts, 10 requests, 10 parts in memory.
        self._manager = TransferManager(_s3_client(fs), TransferConfig())

    def upload(self, handle: BinaryIO, path: str) -> None:
        bucket, key, _ = self._split(path)
        self._manager.upload(same_file(handle), bucket, key).result()

    def download(self, path: str, target: BinaryIO) -> bool:
        bucket, key, _ = self._split(path)
        try:
            self._manager.download(bucket, key, target).result()  # ranged GETs pinned with IfMatch
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return False
            raise
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

    def upload(self, handle: BinaryIO, path: str) -> None:
        bucket, namespace, name = self._fs.split_path(path)
        size = os.fstat(handle.fileno()).st_size
        part_size = max(OCI_PART_SIZE, -(-size // OCI_MAX_PARTS))
        if size <= part_size:
            self._client.put_object(namespace, bucket, name, os.pread(handle.fileno(), size, 0))
            return
        from oci.object_storage.models import CommitMultipartUploadDetails, CreateMultipartUploadDetails

        upload_id = self._client.create_multipart_upload(
            namespace, bucket, CreateMultipartUploadDetails(object=name)).data.upload_id
        try:
            parts = _in_parallel(lambda number: self._upload_part(handle, (namespace, bucket, name, upload_id), number,
                                                                  part_size), range(1, -(-size // part_size) + 1))
            self._client.commit_multipart_upload(namespace, bucket, name, upload_id,
                                                 CommitMultipartUploadDetails(parts_to_commit=parts))
        except BaseException:
            self._abort(namespace, bucket, name, upload_id)
            raise

    def _upload_part(self, handle: BinaryIO, upload: tuple[str, str, str, str], number: int, part_size: int) -> Any:
        """Part ``number`` (from 1) read as bytes, which the SDK can send again when it retries.

        Not the SDK's MultipartObjectAssembler: it streams parts through a reader that its own retries cannot
        rewind (BufferedPartReader.seek leaves its count of bytes read), so a retried part hangs, sent empty."""
        from oci.object_storage.models import CommitMultipartUploadPartDetails

        with self._parts_in_memory:
            data = os.pread(handle.fileno(), part_size, (number - 1) * part_size)
            md5 = base64.b64encode(hashlib.md5(data).digest()).decode()  # the service checks the part against it
            answer = self._client.upload_part(*upload, number, data, content_md5=md5)
        return CommitMultipartUploadPartDetails(part_num=number, etag=answer.headers["etag"])

    def _abort(self, namespace: str, bucket: str, name: str, upload_id: str) -> None:
        """Drop an unfinished upload's parts; the store may be what failed, so this may fail too, and matters less."""
        try:
            self._client.abort_multipart_upload(namespace, bucket, name, upload_id)
        except Exception:
            pass

    def download(self, path: str, target: BinaryIO) -> bool:
        """Ranges of the object, several at once, each streamed into its place in the file (1 MiB at a time) and
        pinned by if-match to the version the first look found. Not the SDK's DownloadManager: it holds each whole
        part in memory (a process restoring one file of 160 MiB peaked at 203 MiB with it, 66 MiB with this), and
        several files at once multiply that."""
        bucket, namespace, name = self._fs.split_path(path)
        try:
            head = self._client.head_object(namespace, bucket, name)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return False
            raise
        size, etag = int(head.headers["content-length"]), head.headers["etag"]
        _in_parallel(lambda start: self._download_range((namespace, bucket, name), etag, start,
                                                        min(start + OCI_PART_SIZE, size), target.fileno()),
                     range(0, size, OCI_PART_SIZE))
        return True

    def _download_range(self, location: tuple[str, str, str], etag: str, start: int, end: int, fd: int) -> None:
        answer = self._client.get_object(*location, range=f"bytes={start}-{end - 1}", if_match=etag)
        offset = start
        for chunk in answer.data.iter_content(chunk_size=STREAM_CHUNK):
            offset += os.pwrite(fd, chunk, offset)
        if offset != end:
            raise ConnectionError(f"got {offset - start} bytes of {end - start} from {location[2]}")


def _in_parallel(action: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``action`` on every item, OCI_PARTS_AT_ONCE at a time; the first failure cancels what has not begun."""
    with ThreadPoolExecutor(OCI_PARTS_AT_ONCE, thread_name_prefix="launcher-part") as pool:
        futures = [pool.submit(action, item) for item in items]
        try:
            return [future.result() for future in futures]
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
