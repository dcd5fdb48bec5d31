"""Ship log lines to the work dir in chunks: as soon as lines arrive, at most one chunk per
``interval`` (0.1 s on a local work dir, 2 s on object stores, which bill and throttle requests),
at once whenever ``max_lines`` or ``max_bytes`` are pending (so no chunk, and no reader, has to
hold a burst of millions of lines), and at exit.

Each chunk is a new object ``logs/{node}/{seq:06d}~{after}.jsonl`` (append-only, so no
read-modify-write), one JSON object per line: ``{"t": unix time, "s": stream, "m": text, "r": rank}``
where the stream is ``out`` (a training process's stdout and stderr, in the order written; ``r`` is
its global rank), ``progress`` (the latest state of a carriage-return progress line), ``node``
(launcher's node program) or ``torchrun`` (torchrun's own messages). ``after`` is the time of the
previous chunk's last line (0 for the first chunk): no line of the chunk is older, so readers skip
old chunks by name for ``--since``, and a reader that has read chunk N knows the exact name of
chunk N+1 without listing (:func:`next_chunk_key`). A chunk that could not be written is retried
unchanged, so every reader sees the same lines under a name.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from launcher.protocol.store import StoreError, WorkDir

LOGS_PREFIX = "logs"
_quote = json.encoder.encode_basestring  # JSON string literal, non-ASCII kept as it is
MAX_CHUNK_LINES = 5000
MAX_CHUNK_BYTES = 1 << 20
LOCAL_INTERVAL = 0.1
STORE_INTERVAL = 2.0


def chunk_key(node: str, seq: int, after: float) -> str:
    return f"{LOGS_PREFIX}/{node}/{chunk_name(seq, after)}"


def chunk_name(seq: int, after: float) -> str:
    return f"{seq:06d}~{after:.6f}.jsonl"


def next_chunk_name(seq: int, chunk: bytes) -> str | None:
    """The name of the chunk after chunk ``seq``, whose content is ``chunk``; None if its last line is damaged."""
    last = last_time(chunk)
    return None if last is None else chunk_name(seq + 1, last)


def last_time(chunk: bytes) -> float | None:
    """The time of a chunk's last line; None if that line is damaged."""
    try:
        return float(json.loads(chunk.rstrip(b"\n").rpartition(b"\n")[2])["t"])
    except (ValueError, KeyError, TypeError):
        return None


def parse_chunk_name(name: str) -> tuple[int, float | None]:
    """``000012~1732280000.125000.jsonl`` -> (12, 1732280000.125); the time is None when absent."""
    stem = name.removesuffix(".jsonl")
    seq, _, after = stem.partition("~")
    return int(seq), float(after) if after else None


@dataclass(frozen=True)
class _Chunk:
    key: str
    body: bytes
    last: float  # the time of its last line: the next chunk's ``after``


def _continuation(store: WorkDir, node: str) -> tuple[int, float]:
    """Where an earlier process of ``node`` left its log: the number and ``after`` of the chunk that follows its
    last one, so that readers who read that one find the next by name."""
    names = sorted(name for name in store.list(f"{LOGS_PREFIX}/{node}") if name.endswith(".jsonl"))
    if not names:
        return 0, 0.0
    seq, after = parse_chunk_name(names[-1])
    last = last_time(store.get(f"{LOGS_PREFIX}/{node}/{names[-1]}") or b"")
    return seq + 1, (after or 0.0) if last is None else last  # a damaged chunk: readers list to find the next


class LogShipper:
    def __init__(self, store: WorkDir, node: str, interval: float | None = None, *, max_lines: int = MAX_CHUNK_LINES,
                 max_bytes: int = MAX_CHUNK_BYTES, continues: bool = False):
        """``continues``: this node replaces an earlier process of the same name; its chunks follow that one's."""
        self.store = store
        self.node = node
        self.interval = interval if interval is not None else LOCAL_INTERVAL if store.is_local else STORE_INTERVAL
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._seq, self._after = _continuation(store, node) if continues else (0, 0.0)
        self._unsent: _Chunk | None = None
        self._stop = threading.Event()
        self._arrived = threading.Event()  # lines are pending
        self._full = threading.Event()  # a whole chunk is pending: no need to wait for the interval
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
        self._arrived.set()

    def flush(self) -> None:
        """Write every pending line; on a store error, what is left waits for the next flush."""
        with self._flush_lock:  # one writer at a time keeps chunk numbers in order
            while True:
                chunk = self._unsent or self._next_chunk()
                if chunk is None:
                    return
                try:
                    self.store.put(chunk.key, chunk.body)
                except StoreError:
                    self._unsent = chunk  # retried as it is: a reader may have seen it written after all
                    self._arrived.set()
                    return
                self._unsent = None
                self._seq += 1
                self._after = chunk.last

    def _next_chunk(self) -> _Chunk | None:
        with self._lock:
            lines, self._pending = self._pending[:self.max_lines], self._pending[self.max_lines:]
            self._pending_bytes -= sum(len(line) + 1 for line in lines)
        if not lines:
            return None
        return _Chunk(chunk_key(self.node, self._seq, self._after), ("\n".join(lines) + "\n").encode(),
                      json.loads(lines[-1])["t"])

    def _run(self) -> None:
        while not self._stop.is_set():
            self._arrived.wait()
            self._arrived.clear()
            self.flush()
            self._full.wait(self.interval)  # at most one chunk per interval, unless a whole one is pending
            self._full.clear()

    def close(self) -> None:
        self._stop.set()
        self._arrived.set()
        self._full.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()
