"""How long a work dir has been unreachable, across operations, and when a process gives up on it.

One clock per store client, shared by every operation and thread that uses it: an outage begins
with the first request that fails for a reason retrying may fix and ends with the next request
that succeeds, whichever operations make them. A process gives up once the outage has lasted
``LAUNCHER_STORE_DEADLINE`` seconds. Counted per operation instead, a node writing its logs, its
status and its outputs one after another waited that long for each of them (minutes in all).

A request that is still waiting is heard too: one that has had no word from the store (an answer, or a chunk
of a transfer) for ``STALL_SECONDS`` begins an outage from its last word, so that a store that accepts
requests and never answers them is said to be unreachable long before a request times out, and a transfer
that moves no byte for the limit ends it. A slow transfer that keeps moving bytes is no outage, however long.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

DEADLINE_ENV = "LAUNCHER_STORE_DEADLINE"
DEFAULT_DEADLINE_SECONDS = 120.0
# A request silent this long (or half the limit, if less) begins an outage: a store answers a small request within
# a second, and s3fs's own read timeout (15 s) let an outage of 10 s pass unsaid.
STALL_SECONDS = 5.0
WATCH_PERIOD_SECONDS = 1.0  # how often waiting requests are looked at, while there are any


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
        self.stall_after = min(STALL_SECONDS, limit / 2)
        self._waiting: set[Request] = set()
        self._watcher: threading.Thread | None = None

    def track(self, url: str, what: str) -> Request:
        """A request about to be sent; ``untrack`` it once it has ended, however it ended."""
        request = Request(self, url, what)
        with self._lock:
            self._waiting.add(request)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="launcher-store-watch", daemon=True)
                self._watcher.start()
        return request

    def untrack(self, request: Request) -> None:
        with self._lock:
            self._waiting.discard(request)

    def _watch(self) -> None:
        """While requests wait: one silent for ``stall_after`` begins an outage from its last word."""
        while True:
            time.sleep(WATCH_PERIOD_SECONDS)  # a clock to look at, not an event to wait for
            with self._lock:
                if not self._waiting:
                    self._watcher = None
                    return
                silent = min(self._waiting, key=lambda request: request.heard)
                under_way = self._began is not None  # its error stays the store's words for the last failure
            quiet = time.monotonic() - silent.heard
            if quiet >= self.stall_after and not under_way:
                self.failed(silent.heard, f"no answer to {silent.what} for {quiet:.0f}s", silent.url)

    def failed(self, last_heard: float, error: str, url: str) -> None:
        """A request whose last word from the store came at ``last_heard`` (monotonic: its start, or its transfer's
        latest chunk) failed with a transient ``error``, or is still waiting."""
        with self._lock:
            self.error = error
            if self._began is not None:
                return
            self._began = last_heard
            self._began_wall = time.time() - (time.monotonic() - last_heard)
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


class Request:
    """One request in flight, as its clock sees it: when the store last gave a sign of life for it."""

    def __init__(self, outage: Outage, url: str, what: str):
        self.outage = outage
        self.url = url
        self.what = what
        self.heard = time.monotonic()

    def moved(self) -> None:
        """Bytes of a transfer came or went: the store answers, whatever the outage clock said."""
        self.heard = time.monotonic()
        if self.outage.elapsed():
            self.outage.answered(self.url)

    def check(self) -> None:
        """Raise once the outage this request waits through has lasted the limit: a transfer stops then."""
        if self.outage.exhausted():
            raise TimeoutError(f"no word from the store for {self.outage.elapsed():.0f}s")
