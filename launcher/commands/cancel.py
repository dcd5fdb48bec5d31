"""``launcher cancel``: ask every node to stop through the work dir, then force what remains."""

from __future__ import annotations

import time
from typing import Callable

from launcher.backends import backend_for
from launcher.backends.base import Backend
from launcher.errors import EXIT_OK
from launcher.protocol.control import request_cancel
from launcher.runs.state import RunInfo, resolve_run
from launcher.runs.view import open_run, read_view


def cancel(ref: str | None, *, grace: float) -> int:
    info = resolve_run(ref)
    backend = request_stop(info, grace=grace, say=print)
    if backend is not None:
        force_stop(info, backend, grace=grace, say=print)
    return EXIT_OK


def request_stop(info: RunInfo, *, grace: float, say: Callable[[str], None]) -> Backend | None:
    """Ask the run's nodes to stop, through the work dir (they are forced after ``grace`` seconds, by
    :func:`force_stop`); its backend, or None where the run had ended already (what it left is removed then). Each
    step is told to ``say`` (the CLI prints it)."""
    backend = backend_for(info.backend, "local")
    view = read_view(info, backend=backend)
    if view.ended:
        removed = backend.release(info)  # what a supervisor that died could not remove
        say(f"run {info.run_id} already ended: {view.result}; nothing to cancel"
            + (f"; removed what it left: {', '.join(removed)}" if removed else ""))
        return None
    request_cancel(open_run(info))
    say(f"run {info.run_id}: cancel requested; nodes stop within seconds (forced after {grace:g}s)")
    return backend


def force_stop(info: RunInfo, backend: Backend, *, grace: float, say: Callable[[str], None]) -> None:
    """Right after :func:`request_stop`: what has not stopped after ``grace`` seconds is ended by the backend."""
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
