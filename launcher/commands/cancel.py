"""``launcher cancel``: ask every node to stop through the work dir, then force what remains."""

from __future__ import annotations

import time
from typing import Callable

from launcher.backends import backend_for
from launcher.errors import EXIT_OK
from launcher.protocol.control import request_cancel
from launcher.runs.state import RunInfo, resolve_run
from launcher.runs.view import open_run, read_view


def cancel(ref: str | None, *, grace: float) -> int:
    cancel_run(resolve_run(ref), grace=grace, say=print)
    return EXIT_OK


def cancel_run(info: RunInfo, *, grace: float, say: Callable[[str], None]) -> None:
    """Stop the run: ask its nodes through the work dir, force what has not stopped after ``grace`` seconds; each
    step is told to ``say`` (the CLI prints it; the ``ui`` keeps it in its server log)."""
    backend = backend_for(info.backend, "local")
    view = read_view(info, backend=backend)
    if view.ended:
        removed = backend.release(info)  # what a supervisor that died could not remove
        say(f"run {info.run_id} already ended: {view.result}; nothing to cancel"
            + (f"; removed what it left: {', '.join(removed)}" if removed else ""))
        return
    request_cancel(open_run(info))
    say(f"run {info.run_id}: cancel requested; nodes stop within seconds (forced after {grace:g}s)")
    asked = time.monotonic()
    forced = backend.stop(info, grace)
    if forced:
        say(_forced_line(forced, grace, waited=time.monotonic() - asked))
    say(f"run {info.run_id}: {read_view(info).result}")


def _forced_line(forced: list[str], grace: float, *, waited: float) -> str:
    """What the backend ended itself: after the grace period, or at once where nothing could stop on its own (a
    Slurm job that still waited for nodes)."""
    if waited < grace:
        return f"ended at once: {', '.join(forced)}"
    return f"forced: {', '.join(forced)} did not stop in {grace:g}s and {'was' if len(forced) == 1 else 'were'} killed"
