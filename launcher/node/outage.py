"""How long a work dir has been unreachable, across operations, and when a process gives up on it.

One clock per store client, shared by every operation and thread that uses it: an outage begins
with the first request that fails for a reason retrying may fix and ends with the next request
that succeeds, whichever operations make them. A process gives up once the outage has lasted
``LAUNCHER_STORE_DEADLINE`` seconds. Counted per operation instead, a node writing its logs, its
status and its outputs one after another waited that long for each of them (minutes in all).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

DEADLINE_ENV = "LAUNCHER_STORE_DEADLINE"
DEFAULT_DEADLINE_SECONDS = 120.0


def deadline_from_env() -> float:
    """``LAUNCHER_STORE_DEADLINE`` in seconds (default 120); a bad value is named, not ignored."""
    text = os.environ.get(DEADLINE_ENV)
    if not text:
        return DEFAULT_DEADLINE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{DEADLINE_ENV}={text!r}: use a number of seconds greater than 0")
    return value


class Outage:
    """The current outage of one store, if any; ``say`` (optional) hears once when one begins and when it ends.

    ``for_good``: once the limit is reached the store counts as gone for the rest of the process (a node, a
    supervisor: they end then, and must not wait again); otherwise (a command's reads, which end with the error
    anyway) the next request starts afresh, so that a program that reads many runs is never stuck on one outage.
    """

    def __init__(self, limit: float, say: Callable[[str], None] | None = None, *, for_good: bool = True,
                 source: str = DEADLINE_ENV):
        self.limit = limit
        self.source = source  # where the limit comes from, for messages: the variable that sets it, or a fixed bound
        self.say = say
        self.for_good = for_good
        self._lock = threading.Lock()
        self._began: float | None = None  # time.monotonic() of the first failed request's start
        self._began_wall = 0.0
        self.error = ""  # the store's words for the latest failure

    def failed(self, request_started: float, error: str, url: str) -> None:
        """A request that began at ``request_started`` (monotonic) failed with a transient ``error``."""
        with self._lock:
            self.error = error
            if self._began is not None:
                return
            self._began = request_started
            self._began_wall = time.time() - (time.monotonic() - request_started)
        if self.say:
            self.say(f"work dir {url} is unreachable since {self.since()} ({error}); retrying until it answers, "
                     f"for at most {self.limit:g}s ({self.source})")

    def answered(self, url: str) -> None:
        """A request succeeded: the outage, if there was one, is over."""
        with self._lock:
            if self._began is None:
                return
            lasted = time.monotonic() - self._began
            self._began = None
        if self.say:
            self.say(f"work dir {url} answers again, after {lasted:.0f}s unreachable")

    def elapsed(self) -> float:
        """Seconds since the outage began; 0 when the store answers."""
        began = self._began
        return 0.0 if began is None else time.monotonic() - began

    def exhausted(self) -> bool:
        """The outage has lasted the limit: this process has given up on the store."""
        return self._began is not None and self.elapsed() >= self.limit

    def gave_up(self) -> None:
        """The caller was told that the store is gone; a clock that is not ``for_good`` starts afresh."""
        if not self.for_good:
            with self._lock:
                self._began = None

    def remaining(self) -> float:
        return self.limit - self.elapsed()

    def since(self) -> str:
        """When the outage began, as ``10:02:03 UTC``."""
        return time.strftime("%H:%M:%S UTC", time.gmtime(self._began_wall))

    def describe(self) -> str:
        """``unreachable for 120s (since 10:02:03 UTC): FSTimeoutError``."""
        return f"unreachable for {self.elapsed():.0f}s (since {self.since()}; limit {self.limit:g}s, " \
               f"{self.source}): {self.error or 'no answer'}"
