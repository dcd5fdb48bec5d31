"""Follow what each training process writes, attributed to its rank, and ship it.

torchrun runs with ``--redirects 3 --log-dir DIR``: each local rank's stdout and stderr go to
``DIR/{id}/attempt_{n}/{local rank}/{stdout,stderr}.log`` (raw bytes, carriage returns kept),
and torchrun's own messages stay on its pipes. This module tails those files, as torchrun's
``--tee`` would, but keeps each line's rank and stream: blocks are read whole, lines are
shipped in batches, and a carriage return (progress bars) makes the text after it a
``progress`` record, at most one per rank per second, the line's final state kept as a normal
line when its newline comes. Everything is also written to the node's console.
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import IO, Callable

from launcher.node.logship import LogShipper

POLL_SECONDS = 0.1
PROGRESS_EVERY_SECONDS = 1.0
TAIL_LINES = 200  # per rank, for the cause of a failure: a deep traceback keeps its user frames
READ_BYTES = 1 << 20


class _File:
    def __init__(self, path: Path, local_rank: int, stream: str):
        self.path = path
        self.local_rank = local_rank
        self.stream = stream
        self.offset = 0
        self.pending = b""


class RankLogs:
    def __init__(self, log_dir: str, shipper: LogShipper, console: IO[bytes], *,
                 global_rank: Callable[[int], int | None]):
        self.log_dir = Path(log_dir)
        self.shipper = shipper
        self.console = console
        self.global_rank = global_rank
        self.stderr_tails: dict[int, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=TAIL_LINES))
        self.last_output: dict[int, float] = {}  # local rank -> monotonic time of its last output
        self._files: dict[Path, _File] = {}
        self._progress_at: dict[tuple[int, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-logs", daemon=True)

    def start(self) -> "RankLogs":
        self._thread.start()
        return self

    def close(self) -> None:
        """Read every file to its end (training has exited) and ship what is left."""
        self._stop.set()
        self._thread.join()
        self._poll(final=True)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._poll(final=False)

    def _poll(self, *, final: bool) -> None:
        for path in sorted(self.log_dir.glob("*/attempt_*/*/std*.log")):
            if path not in self._files and path.parent.name.isdigit():
                self._files[path] = _File(path, int(path.parent.name), "out" if path.stem == "stdout" else "err")
        for entry in self._files.values():
            while self._read(entry, final=final):
                pass

    def _read(self, entry: _File, *, final: bool) -> bool:
        """Read and ship one block; True when there may be more to read now."""
        try:
            with open(entry.path, "rb") as handle:
                handle.seek(entry.offset)
                block = handle.read(READ_BYTES)
        except FileNotFoundError:
            return False
        if not block:
            if final and entry.pending:
                self._ship(entry, [entry.pending])
                entry.pending = b""
            return False
        entry.offset += len(block)
        self.console.write(block)
        self.console.flush()
        lines = (entry.pending + block).split(b"\n")
        entry.pending = lines.pop()
        self.last_output[entry.local_rank] = time.monotonic()
        if lines:
            self._ship(entry, lines)
        if b"\r" in entry.pending:
            self._progress(entry)
        return len(block) == READ_BYTES

    def _ship(self, entry: _File, raw_lines: list[bytes]) -> None:
        texts = [(line.rstrip(b"\r").rsplit(b"\r", 1)[-1] if b"\r" in line else line).decode("utf-8", "replace")
                 for line in raw_lines]
        if entry.stream == "err":
            self.stderr_tails[entry.local_rank].extend(texts[-TAIL_LINES:])
        rank = self.global_rank(entry.local_rank)
        self.shipper.add_many([(entry.stream, text, rank) for text in texts])

    def _progress(self, entry: _File) -> None:
        head, _, tail = entry.pending.rpartition(b"\r")
        latest = head.rsplit(b"\r", 1)[-1] if not tail else tail
        entry.pending = tail
        key = (entry.local_rank, entry.stream)
        now = time.monotonic()
        if latest.strip() and now - self._progress_at.get(key, 0.0) >= PROGRESS_EVERY_SECONDS:
            self._progress_at[key] = now
            self.shipper.add_many([("progress", latest.decode("utf-8", "replace"),
                                    self.global_rank(entry.local_rank))])
