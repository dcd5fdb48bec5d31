"""A restore of earlier outputs that says how far it has come and stops when the run does.

A checkpoint of many gigabytes takes minutes to come down. While it does, every PROGRESS_SECONDS the node's
log says how many bytes of how many are here, and the run's control markers are read: a cancel (or a peer's
failure) stops the restore at once instead of after it. A signal to the node stops it through ``stop``.
"""

from __future__ import annotations

import threading
from typing import Callable

from launcher.protocol.control import StopRequest
from launcher.protocol.rendezvous import RendezvousStopped
from launcher.protocol.transfer import Cancelled, Progress
from launcher.wording import size_text

PROGRESS_SECONDS = 5.0


class RestoreStopped(RendezvousStopped):
    """The run was cancelled, or a peer failed, while this node restored outputs."""

    def __init__(self, request: StopRequest):
        self.request = request
        Exception.__init__(self, f"{request.reason} (while restoring outputs)")


def restore_watched(restore: Callable[[Progress], int], *, stop: threading.Event, say: Callable[[str], None],
                    stop_request: Callable[[], StopRequest | None]) -> int:
    """``restore(progress)``, saying its progress now and then and ending it on ``stop`` or on a ``stop_request``
    (raised as RestoreStopped)."""
    progress = Progress(stop=stop)
    finished = threading.Event()
    asked: list[StopRequest] = []

    def watch() -> None:
        while not finished.wait(PROGRESS_SECONDS):
            if progress.total:
                say(f"restoring outputs: {size_text(progress.done)} of {size_text(progress.total)}")
            request = stop_request()
            if request:
                asked.append(request)
                progress.stop.set()
                return

    watcher = threading.Thread(target=watch, name="launcher-restore-watch", daemon=True)
    watcher.start()
    try:
        return restore(progress)
    except Cancelled:
        if asked:
            raise RestoreStopped(asked[0]) from None
        raise
    finally:
        finished.set()
        watcher.join()
