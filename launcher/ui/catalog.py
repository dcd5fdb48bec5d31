"""The run list of the ``ui``: every run this machine records, filtered and paged on the server.

It reads recorded states only, the records in LAUNCHER_HOME and the statuses in each run's work dir, and never asks
a backend (a thousand runs would be a thousand questions). What it read is kept, server-wide: a run's record until
its file changes, an ended run's row for good (it cannot change), so a page of the list costs a ``stat`` per run and
the reads of the runs still going on.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import BadInput, LauncherError
from launcher.runs.attempts import current_url
from launcher.runs.preflight import quick_work_dir
from launcher.runs.state import RunInfo, all_runs, load
from launcher.runs.view import RunView, closing_line, read_view

MAX_PER_PAGE = 200
MAX_CONCURRENT_READS = 16  # work dirs read at once for a state filter: one slow store costs one timeout, not many


@dataclass(frozen=True)
class Query:
    """What the list shows: runs whose id, name, backend or spec file holds ``text``, of ``state`` and ``backend``
    when given, page ``page`` (from 1) of ``per_page``."""
    text: str = ""
    state: str = ""
    backend: str = ""
    page: int = 1
    per_page: int = 50

    def __post_init__(self) -> None:
        if self.page < 1 or not 1 <= self.per_page <= MAX_PER_PAGE:
            raise BadInput(f"page {self.page} of {self.per_page} runs: pages count from 1 and hold 1 to "
                           f"{MAX_PER_PAGE} runs")

    def matches(self, info: RunInfo) -> bool:
        if self.backend and info.backend != self.backend:
            return False
        text = self.text.lower()
        return not text or any(text in field.lower() for field in (info.run_id, run_name(info), info.backend,
                                                                   info.spec_file))


def run_name(info: RunInfo) -> str:
    """The spec's ``name`` the run was made from ('' when its record does not say)."""
    spec = info.effective_spec.get("spec")
    name = spec.get("name") if isinstance(spec, dict) else None
    return name if isinstance(name, str) else ""


def result_words(view: RunView) -> str:
    """How an ended run ended, in the words ``watch`` closes with: its first line and the cause of a failure."""
    lines = closing_line(view).splitlines()
    first = lines[0].removeprefix(f"run {view.info.run_id}").lstrip(" :")
    cause = next((line.strip() for line in lines[1:] if line.strip().startswith("cause:")), "")
    return f"{first}; {cause}" if cause else first


def row(info: RunInfo, view: RunView | None, problem: str = "") -> dict[str, Any]:
    """One run of the list; ``view`` None where its work dir could not be read (``problem`` says why)."""
    ends = [status.get("ended_at") for status in view.statuses.values()] if view else []
    ended = view is not None and view.ended
    return {"run_id": info.run_id, "name": run_name(info), "backend": info.backend, "nodes": len(info.nodes),
            "created_at": info.created_at,
            "ended_at": max((end for end in ends if isinstance(end, (int, float))), default=None) if ended else None,
            "state": view.result if view else "unknown", "ended": ended,
            "result": (result_words(view) if ended else "") if view else f"work dir not readable: {problem}"}


class RunCatalog:
    """The recorded runs and their rows, read again only where they may have changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[Path, tuple[tuple[int, int], RunInfo]] = {}
        self._ended: dict[str, dict[str, Any]] = {}  # run id -> the row of an ended run, which never changes

    def runs(self) -> list[RunInfo]:
        """Every recorded run, newest first."""
        return all_runs(self._record)

    def _record(self, path: Path) -> RunInfo:
        """The run's record, parsed again only when its file changed (its time or size)."""
        try:
            found = path.stat()
        except OSError as exc:  # removed since it was listed (``launcher clean``)
            raise BadInput(f"{path}: {exc.strerror or exc}") from None
        stamp = (found.st_mtime_ns, found.st_size)
        with self._lock:
            kept = self._records.get(path)
        if kept and kept[0] == stamp:
            return kept[1]
        info = load(path)
        with self._lock:
            self._records[path] = (stamp, info)
            self._ended.pop(info.run_id, None)
        return info

    def row_of(self, info: RunInfo) -> dict[str, Any]:
        with self._lock:
            kept = self._ended.get(info.run_id)
        if kept is not None:
            return kept
        try:  # the quick bounds: one run's unreachable store must not hold up the page
            view = read_view(info, quick_work_dir(current_url(info)), fates={})
        except (LauncherError, OSError) as exc:
            return row(info, None, str(exc))
        found = row(info, view)
        if found["ended"]:
            with self._lock:
                self._ended[info.run_id] = found
        return found

    def page(self, query: Query) -> dict[str, Any]:
        """The runs the query asks for: one page of rows, with how many runs match in all."""
        chosen: list[Any] = [info for info in self.runs() if query.matches(info)]
        if query.state:  # a state is known only from each run's work dir: read them all (ended ones are kept)
            with ThreadPoolExecutor(max_workers=MAX_CONCURRENT_READS) as pool:
                chosen = [found for found in pool.map(self.row_of, chosen) if found["state"] == query.state]
        pages = max(1, -(-len(chosen) // query.per_page))
        page = min(query.page, pages)  # past the last page (runs were cleaned since the link was made): the last
        start = (page - 1) * query.per_page
        shown = chosen[start:start + query.per_page]
        rows = shown if query.state else [self.row_of(info) for info in shown]
        return {"runs": rows, "total": len(chosen), "page": page, "per_page": query.per_page, "pages": pages}
