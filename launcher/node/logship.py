"""Ship log lines to the work dir in chunks: at most every ``interval`` seconds, at exit, and
whenever ``max_lines`` or ``max_bytes`` are pending, so no chunk (and no reader) has to hold a
burst of millions of lines at once.

Each chunk is a new object ``logs/{node}/{seq:06d}~{last}.jsonl`` (append-only, so no
read-modify-write), where ``last`` is the time of its last line (readers skip old chunks by
name for ``--since``), one JSON object per line: ``{"t": unix time, "s": stream, "m": text, "r": rank}`` where the stream is
``out`` or ``err`` (a training process; ``r`` is its global rank, when known), ``progress`` (the
latest state of a carriage-return progress line), ``node`` (launcher's node program) or
``torchrun`` (torchrun's own messages).
"""

from __future__ import annotations

import json
import threading
import time

from launcher.node.store import StoreError, WorkDir

LOGS_PREFIX = "logs"
_quote = json.encoder.encode_basestring  # JSON string literal, non-ASCII kept as it is
MAX_CHUNK_LINES = 5000
MAX_CHUNK_BYTES = 1 << 20


def chunk_key(node: str, seq: int, last_time: float) -> str:
    return f"{LOGS_PREFIX}/{node}/{seq:06d}~{last_time:.3f}.jsonl"


def parse_chunk_name(name: str) -> tuple[int, float | None]:
    """``000012~1732280000.125.jsonl`` -> (12, 1732280000.125); the time is None when absent."""
    stem = name.removesuffix(".jsonl")
    seq, _, last = stem.partition("~")
    return int(seq), float(last) if last else None


class LogShipper:
    def __init__(self, store: WorkDir, node: str, interval: float = 2.0, *, max_lines: int = MAX_CHUNK_LINES,
                 max_bytes: int = MAX_CHUNK_BYTES):
        self.store = store
        self.node = node
        self.interval = interval
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._full = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)

    def start(self) -> "LogShipper":
        self._thread.start()
        return self

    def add(self, stream: str, text: str) -> None:
        self.add_many([(stream, text, None)])

    def add_many(self, lines: list[tuple[str, str, int | None]]) -> None:
        """Queue ``(stream, text, rank)`` lines, all stamped now; rank None for the node's own lines."""
        head = f'{{"t": {round(time.time(), 6)!r}, "s": '
        # Built by hand around the C string encoder: json.dumps per line costs a burst of
        # 200,000 lines about half a second.
        records = []
        for stream, text, rank in lines:  # streams are fixed identifiers: nothing to escape
            rank_field = "" if rank is None else f'"r": {int(rank)}, '
            records.append(f'{head}"{stream}", {rank_field}"m": {_quote(text)}}}')
        with self._lock:
            self._pending.extend(records)
            self._pending_bytes += sum(len(record) + 1 for record in records)
            if len(self._pending) >= self.max_lines or self._pending_bytes >= self.max_bytes:
                self._full.set()

    def flush(self) -> None:
        with self._flush_lock:  # one writer at a time keeps chunk numbers in order
            while True:
                with self._lock:
                    lines, self._pending = self._pending[:self.max_lines], self._pending[self.max_lines:]
                    self._pending_bytes = sum(len(line) + 1 for line in self._pending)
                    last = json.loads(lines[-1])["t"] if lines else 0.0
                if not lines:
                    return
                try:
                    self.store.put(chunk_key(self.node, self._seq, last), ("\n".join(lines) + "\n").encode())
                    self._seq += 1
                except StoreError:
                    with self._lock:  # keep the lines for the next attempt rather than lose them
                        self._pending = lines + self._pending
                        self._pending_bytes += sum(len(line) + 1 for line in lines)
                    return

    def _run(self) -> None:
        while not self._stop.is_set():
            self._full.wait(self.interval)
            self._full.clear()
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._full.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()
