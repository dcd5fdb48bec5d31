"""One run as the ``ui``'s run page shows it: its nodes, how it ended and why, in the words of ``status`` and
``watch``, read from its work dir and its backend (this one run's)."""

from __future__ import annotations

from typing import Any

from launcher.backends import backend_for
from launcher.runs.state import RunInfo
from launcher.runs.view import closing_line, read_view
from launcher.ui.catalog import run_name

NODE_FIELDS = ("state", "exit_code", "reason", "address", "host", "started_at", "updated_at", "ended_at")


def run_page(info: RunInfo) -> dict[str, Any]:
    """The run's state now: per node its rank, state, exit code and reason; the summary ``watch`` ends with."""
    backend = backend_for(info.backend, "local")
    view = read_view(info, backend=backend)
    nodes = []
    for name in info.nodes:
        shown = view.shown_status(name)
        nodes.append({"name": name, "rank": view.rank_of(name), **{key: shown.get(key) for key in NODE_FIELDS}})
    return {"run_id": info.run_id, "name": run_name(info), "backend": info.backend, "work_dir": info.run_url,
            "spec_file": info.spec_file, "created_at": info.created_at, "result": view.result, "ended": view.ended,
            "exit_status": view.exit_status(), "engine": backend.engine_state(info) or "",
            "summary": closing_line(view) if view.ended else "", "nodes": nodes}
