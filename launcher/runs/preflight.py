"""Checks the client makes before it starts anything, shared by every backend.

The work-dir check writes the run's own record ``run.json`` with create-if-absent: that
proves the store can be written with this machine's credentials, and refuses a run id that
was used before in the same work dir. Permanent store errors (missing bucket, read-only
directory, no credentials) fail at once; transient ones get a few quick retries. The verbs
that read a run later (status, watch, data, ``run`` while it follows) ride out an outage of the
store as long as its nodes do (``LAUNCHER_STORE_DEADLINE``), saying so once; ``list`` keeps the
quick bounds, so that one run's store does not hold up the listing of the others.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
import time
from typing import Any

from launcher.errors import BackendError, BadInput
from launcher.protocol.outage import Outage, deadline_from_env
from launcher.protocol.outputs import OUTPUTS_PREFIX
from launcher.protocol.store import StoreError, WorkDir
from launcher.workdirs import REMOTE_SCHEMES, scheme, unusable_reason

RUN_RECORD = "run.json"
QUICK_DEADLINE_SECONDS = 10.0  # for all attempts, and for any one request


def quick_options(kind: str) -> dict[str, Any] | None:
    """Store client settings for one quick try per request. The client asks once and reports: the store
    libraries' own retries (s3fs and botocore: 5 each; the OCI SDK: 8) kept a user waiting 70 to 95 s
    in silence for an endpoint that is not there."""
    if kind == "s3":
        return {"config_kwargs": {"connect_timeout": 5, "read_timeout": 10, "retries": {"total_max_attempts": 1}}}
    if kind == "oci" and importlib.util.find_spec("oci") is not None:
        import oci

        return {"config_kwargs": {"timeout": (5, 10), "retry_strategy": oci.retry.NoneRetryStrategy()}}
    return None


def quick_work_dir(url: str, *, attempts: int | None = 3, outage: Outage | None = None) -> WorkDir:
    """A client-side view of ``url`` that fails in seconds rather than retrying for a minute, unless ``outage``
    (a clock with a limit of its own) says how long to ride out the store's outages."""
    store = WorkDir(url, attempts=attempts, base_delay=0.2, max_delay=1.0, fresh_instance=True,
                    storage_options=quick_options(scheme(url)), deadline=QUICK_DEADLINE_SECONDS,
                    request_timeout=QUICK_DEADLINE_SECONDS, outage=outage)
    if hasattr(store.fs, "retries"):  # s3fs's own retry count is a class attribute, not an option
        store.fs.retries = 1
    return store


def reading_work_dir(url: str) -> WorkDir:
    """The client's view of a run's work dir for the verbs that read and follow it: one request tries for at most
    10 s, and an outage is ridden out, across every work dir this command reads, for ``LAUNCHER_STORE_DEADLINE``."""
    return quick_work_dir(url, attempts=None, outage=_reading_outage())


@functools.lru_cache(maxsize=1)
def _reading_outage() -> Outage:
    """One clock for this command's reads, so that it says once that its work dir is unreachable and gives up once."""
    try:
        limit = deadline_from_env()
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return Outage(limit, say=lambda message: print(f"note: {message}", file=sys.stderr, flush=True), for_good=False)


INSTALL_HINT = {"s3": "pip install 'launcher[s3]'", "oci": "pip install 'launcher[oci]'"}
LOCAL_WORK_DIR_HINT = "to run it on this machine with a local work dir instead, add: --set spec.cluster.spec.workDir=./work_dir"


def check_work_dir(work_dir: str, run_id: str, record: dict) -> WorkDir:
    """Create ``{work_dir}/{run_id}/run.json``; raise with the store's own message when that fails, and
    for a local run on a store, how to run it with none (specs written for a cloud name their bucket)."""
    try:
        return _create_run_record(work_dir, run_id, record)
    except (BackendError, StoreError) as exc:
        if record.get("backend") == "local" and scheme(work_dir) in REMOTE_SCHEMES:
            raise BackendError(f"{exc}\n  {LOCAL_WORK_DIR_HINT}") from None
        raise


def _create_run_record(work_dir: str, run_id: str, record: dict) -> WorkDir:
    kind = scheme(work_dir)
    reason = unusable_reason(work_dir)
    if reason:
        hint = f"; install it with: {INSTALL_HINT[kind]}" if kind in REMOTE_SCHEMES and "package" in reason else ""
        raise BackendError(f"work dir {work_dir} cannot be used from this machine: {reason}{hint}")
    run = quick_work_dir(f"{work_dir.rstrip('/')}/{run_id}")
    started = time.monotonic()
    try:
        if not run.create(RUN_RECORD, json.dumps(record).encode()):
            raise BadInput(f"run id {run_id} was used before in {work_dir}; choose another")
        if RUN_RECORD not in run.list(""):
            raise BackendError(f"work dir {run.url}: wrote {RUN_RECORD} but a listing does not show it; the "
                               "nodes need a store whose listings show what was written")
    except StoreError as exc:
        waited = time.monotonic() - started
        kind_of = "" if exc.permanent else f" (still failing after {waited:.0f}s of retries)"
        raise BackendError(f"cannot use the work dir; nothing was started{kind_of}.\n  {exc}") from None
    return run


def resume_source(previous_url: str) -> str:
    """Check that an earlier run left outputs to resume from; return its URL for the nodes."""
    try:
        found = quick_work_dir(previous_url).list(OUTPUTS_PREFIX)
    except StoreError as exc:
        raise BackendError(f"cannot read the outputs of the run to resume from: {exc}") from None
    if not found:
        raise BadInput(f"nothing to resume from: {previous_url}/{OUTPUTS_PREFIX}/ holds no outputs")
    return previous_url
