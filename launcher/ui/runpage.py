"""One run as the ``ui``'s run page shows it: its nodes, how it ended and why, and how it uses its machines, in the
words and figures of ``status``, ``watch`` and ``top``, read from its work dir and its backend (this one run's)."""

from __future__ import annotations

from typing import Any

from launcher.backends import backend_for
from launcher.commands.top import rows as health_rows
from launcher.runs import incidents
from launcher.runs.health import HealthReader
from launcher.runs.state import RunInfo
from launcher.runs.view import closing_line, open_run, read_view
from launcher.ui.catalog import run_name

NODE_FIELDS = ("state", "exit_code", "reason", "address", "host", "started_at", "updated_at", "ended_at")


def run_page(info: RunInfo, health: HealthReader) -> dict[str, Any]:
    """The run's state now: per node its rank, state, exit code and reason; the summary ``watch`` ends with; what
    its failures cost (``status``'s line and each incident's); the table of ``launcher top`` (empty until a node
    recorded figures) and its stragglers."""
    backend = backend_for(info.backend, "local")
    run = open_run(info)
    view = read_view(info, run, backend)
    nodes = []
    for name in info.nodes:
        shown = view.shown_status(name)
        nodes.append({"name": name, "rank": view.rank_of(name), **{key: shown.get(key) for key in NODE_FIELDS}})
    figures = health.read(view, run)
    costs = incidents.read(info, view) if view.decision else None
    trained = costs is not None and costs.start_s is not None
    return {"run_id": info.run_id, "name": run_name(info), "backend": info.backend, "work_dir": info.run_url,
            "spec_file": info.spec_file, "created_at": info.created_at, "result": view.result, "ended": view.ended,
            "exit_status": view.exit_status(), "engine": backend.engine_state(info) or "",
            "summary": closing_line(view) if view.ended else "", "nodes": nodes,
            "costs": costs.line() if trained else "",
            "incidents": [incident.line() for incident in costs.incidents] if trained else [],
            "health": health_rows(figures) if figures.sampled else [],
            "stragglers": [straggler.line() for straggler in figures.stragglers]}
