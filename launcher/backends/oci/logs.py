"""What OCI Logging holds of a job run's output: searched as the service allows, for a while after the run ends.

The service's limits, as Oracle ADS meets them (``ads/common/oci_logging.py``, ``OCILog.search`` and
``_search_logs``): one search spans at most 14 days, returns at most 1,000 results per page, and
answers 400 "search result is too large" when its window holds too much (ADS then splits the
window in halves, down to a millisecond, the precision of the times it takes). Lines reach
Logging late: ADS keeps reading 90 s after a run ends (``dsc_job.py``,
``WAIT_SECONDS_AFTER_FINISHED``). Where the log is the service's own (only ``logGroupId`` set),
its OCID is in the job run's ``logDetails``.
"""

from __future__ import annotations

import datetime
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

LAG_SECONDS = 90.0
POLL_SECONDS = 3.0  # between reads while waiting, as ADS's watch (dsc_job.py SLEEP_INTERVAL)
MAX_WINDOW = datetime.timedelta(days=14)
PAGE_LIMIT = 1000
FINEST_SPLIT = datetime.timedelta(milliseconds=1)
TOO_LARGE = "search result is too large"


@dataclass(frozen=True)
class Output:
    """A job run's last lines as Logging holds them, or why there are none."""

    lines: tuple[str, ...] = ()
    note: str | None = None  # set when there are no lines: Logging not set up, empty, or failing


def run_output(client: Any, compartment: str, run: Any, *, now: Callable[[], datetime.datetime],
               sleep: Callable[[float], None] = time.sleep) -> Output:
    """The run's lines, oldest first. A run that ended less than LAG_SECONDS ago is searched again every
    POLL_SECONDS until its lines stop growing (or that time has passed): its last lines may still be on their way."""
    details = getattr(run, "log_details", None)
    if details is None or not details.log_id or not details.log_group_id:
        return Output(note="OCI Logging was not set up for this job (set logGroupId to keep the nodes' output)")
    stream = f"{compartment}/{details.log_group_id}/{details.log_id}"
    # A run that never started wrote nothing to wait for (ADS streams a run's logs only once it started).
    finished = getattr(run, "time_finished", None) if getattr(run, "time_started", None) else None
    try:
        lines = search(client, stream, run.id, run.time_accepted, now())
        waited = False
        while finished and now() < finished + datetime.timedelta(seconds=LAG_SECONDS):
            if not waited:
                print(f"waiting up to {LAG_SECONDS:g}s after job run {run.id} ended for its last lines in OCI "
                      "Logging (they reach it late)", file=sys.stderr, flush=True)
                waited = True
            sleep(POLL_SECONDS)
            again = search(client, stream, run.id, run.time_accepted, now())
            if again and len(again) == len(lines):
                break
            lines = again
    except Exception as exc:  # noqa: BLE001 - logs help to explain a failure; their absence must be said
        from launcher.backends.oci.service import service_message

        return Output(note=f"OCI Logging could not be searched: {service_message(exc)}")
    if not lines:
        return Output(note=f"OCI Logging returned no lines for job run {run.id} (log {details.log_id})")
    return Output(tuple(lines))


def search(client: Any, stream: str, job_run: str, start: datetime.datetime, end: datetime.datetime) -> list[str]:
    """Every line of ``job_run`` in log ``stream`` between ``start`` and ``end``, oldest first."""
    query = f'search "{stream}" | where source = \'*{job_run}\' | sort by datetime asc'
    lines: list[str] = []
    for window_start, window_end in windows(start, end):
        lines.extend(_search_window(client, query, window_start, window_end))
    return lines


def windows(start: datetime.datetime, end: datetime.datetime) -> list[tuple[datetime.datetime, datetime.datetime]]:
    """``start``..``end`` cut into spans of at most MAX_WINDOW, oldest first."""
    spans = []
    while start < end:
        spans.append((start, min(end, start + MAX_WINDOW)))
        start += MAX_WINDOW
    return spans


def _search_window(client: Any, query: str, start: datetime.datetime, end: datetime.datetime) -> list[str]:
    """One window, page by page; a window the service finds too large is searched as two halves."""
    import oci

    details = oci.loggingsearch.models.SearchLogsDetails(time_start=start, time_end=end, search_query=query,
                                                         is_return_field_info=False)
    lines: list[str] = []
    page = None
    try:
        while True:
            response = client.search_logs(details, limit=PAGE_LIMIT, **({"page": page} if page else {}))
            lines.extend(_message(result) for result in response.data.results or [])
            page = response.headers.get("opc-next-page")
            if not page:
                return lines
    except oci.exceptions.ServiceError as exc:
        middle = start + (end - start) / 2
        if exc.status != 400 or TOO_LARGE not in str(exc.message) or middle - start < FINEST_SPLIT:
            raise
        return _search_window(client, query, start, middle) + _search_window(client, query, middle, end)


def _message(result: Any) -> str:
    content = (result.data or {}).get("logContent", {})
    return str((content.get("data") or {}).get("message", ""))
