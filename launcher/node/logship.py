"""Ship log lines to the work dir in chunks: at most every ``interval`` seconds, and at exit.

Each chunk is a new object ``logs/{node}/{seq:06d}.jsonl`` (append-only, so no read-modify-write),
one JSON object per line: ``{"t": unix time, "s": "out" | "err" | "node", "m": text}``.
"""

from __future__ import annotations

import json
import threading
import time

from launcher.node.store import StoreError, WorkDir

LOGS_PREFIX = "logs"


def chunk_key(node: str, seq: int) -> str:
    return f"{LOGS_PREFIX}/{node}/{seq:06d}.jsonl"


class LogShipper:
    def __init__(self, store: WorkDir, node: str, interval: float = 2.0):
        self.store = store
        self.node = node
        self.interval = interval
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)

    def start(self) -> "LogShipper":
        self._thread.start()
        return self

    def add(self, stream: str, text: str) -> None:
        record = json.dumps({"t": round(time.time(), 6), "s": stream, "m": text}, ensure_ascii=False)
        with self._lock:
            self._pending.append(record)

    def flush(self) -> None:
        with self._flush_lock:  # one writer at a time keeps chunk numbers in order
            with self._lock:
                lines, self._pending = self._pending, []
            if not lines:
                return
            try:
                self.store.put(chunk_key(self.node, self._seq), ("\n".join(lines) + "\n").encode())
                self._seq += 1
            except StoreError:
                with self._lock:  # keep the lines for the next attempt rather than lose them
                    self._pending = lines + self._pending

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()
