"""``launcher cancel``: ask every node to stop through the work dir, then force what remains."""

from __future__ import annotations

from launcher.backends import backend_for
from launcher.errors import EXIT_OK
from launcher.node.control import request_cancel
from launcher.runs.state import resolve_run
from launcher.runs.view import open_run, read_view


def cancel(ref: str | None, *, grace: float) -> int:
    info = resolve_run(ref)
    backend = backend_for(info.backend, "local")
    view = read_view(info, backend=backend)
    if view.ended:
        removed = backend.release(info)  # what a supervisor that died could not remove
        print(f"run {info.run_id} already ended: {view.result}; nothing to cancel"
              + (f"; removed what it left: {', '.join(removed)}" if removed else ""))
        return EXIT_OK
    request_cancel(open_run(info))
    print(f"run {info.run_id}: cancel requested; nodes stop within seconds (forced after {grace:g}s)")
    forced = backend.stop(info, grace)
    if forced:
        print(f"forced: {', '.join(forced)} did not stop in {grace:g}s and were killed")
    print(f"run {info.run_id}: {read_view(info).result}")
    return EXIT_OK
