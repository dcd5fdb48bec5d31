"""Ctrl-C held back while something that must not be cut in half happens (a submission and its record)."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


@contextlib.contextmanager
def held_interrupts() -> Iterator[list[int]]:
    """Hold SIGINT/SIGTERM back for the duration; yields the list of signals that arrived. Off the main thread,
    where Python delivers no signal, nothing is held and the list stays empty."""
    arrived: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield arrived
        return
    previous = {sig: signal.signal(sig, lambda signum, _frame: arrived.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield arrived
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
