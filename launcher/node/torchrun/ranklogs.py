"""Read what each training process writes, as it writes it, attributed to its global rank, and ship it.

torchrun (through :mod:`launcher.node.torchrun.shim`) gives each training process one named pipe,
``DIR/{id}/attempt_{n}/{local rank}/output-of-rank-{global rank}``, for both its stdout and its
stderr: lines come out in the order they were written, whichever stream they were written to,
and the name carries the global rank torchrun gave the process. One thread waits on
every pipe at once and reads a block the moment it arrives; it must never stop, as a process
blocks on a full pipe that nobody reads. Lines are shipped in batches; a
carriage return (progress bars) makes the text after it a ``progress`` record, at most one per
rank per second, the line's final state kept as a normal line when its newline comes.
Everything is also written to the node's console.
"""

from __future__ import annotations

import collections
import os
import selectors
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from launcher.protocol.logship import LogShipper

PIPE_PREFIX = "output-of-rank-"
READING_PREFIX = "node-reads-rank-"
DISCOVER_SECONDS = 0.1  # how often to look for the pipes of processes torchrun (re)started
PROGRESS_EVERY_SECONDS = 1.0
TAIL_LINES = 200  # per rank, for the cause of a failure: a deep traceback keeps its user frames
READ_BYTES = 1 << 20


def output_pipe(rank_dir: str, rank: int | str) -> str:
    """The pipe a training process writes its stdout and stderr to; ``rank_dir`` is torchrun's per-process dir."""
    return os.path.join(rank_dir, f"{PIPE_PREFIX}{rank}")


def reading_marker(pipe_path: str) -> str:
    """Made by the node once it has the pipe open: what is in a pipe nobody holds open any more is gone, so
    torchrun, which holds it until then, must not end before this exists (:func:`launcher.node.torchrun.rankpipes.await_readers`)."""
    directory, name = os.path.split(pipe_path)
    return os.path.join(directory, READING_PREFIX + name.removeprefix(PIPE_PREFIX))


@dataclass
class _Pipe:
    fd: int
    local_rank: int
    rank: int
    pending: bytes = b""


class RankLogs:
    def __init__(self, log_dir: str, shipper: LogShipper, console: IO[bytes],
                 first_line: Callable[[int, float], None] | None = None,
                 exited: Callable[[int, float], None] | None = None):
        """Called on the reading thread: ``first_line(rank, time)`` when a global rank's first output arrives,
        ``exited(rank, time)`` when its pipe ends (every writer closed it: the process and its children ended)."""
        self.log_dir = Path(log_dir)
        self.first_line = first_line
        self.exited = exited
        self.shipper = shipper
        self.console = console
        # Per local rank, its last lines, stdout and stderr as they were interleaved.
        self.tails: dict[int, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=TAIL_LINES))
        self.last_output: dict[int, float] = {}  # local rank -> monotonic time of its last output
        self.last_line_at: dict[int, float] = {}  # global rank -> Unix time of its last output (for the timeline)
        self.ended: set[int] = set()  # local ranks whose pipe ended: the process (and its children) are gone
        self._ranks: dict[int, int] = {}  # local rank -> global rank, of the latest attempt
        self._opened: set[Path] = set()
        self._selector = selectors.DefaultSelector()
        self._progress_at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-logs", daemon=True)

    def start(self) -> "RankLogs":
        self._thread.start()
        return self

    def global_rank(self, local_rank: int) -> int | None:
        """The global rank torchrun gave this local rank; None before its process started."""
        return self._ranks.get(local_rank)

    def close(self) -> None:
        """Read every pipe to its end (training has exited) and ship what is left."""
        self._stop.set()
        self._thread.join()
        self._discover()
        for key in list(self._selector.get_map().values()):
            while self._read(key.data):
                pass
            if key.fd in self._selector.get_map():  # a child of the process still holds the pipe open
                self._end(key.data)
        self._selector.close()

    def _run(self) -> None:
        next_discovery = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_discovery:
                self._discover()
                next_discovery = time.monotonic() + DISCOVER_SECONDS
            for key, _ in self._selector.select(DISCOVER_SECONDS):
                self._read(key.data)

    def _discover(self) -> None:
        for path in sorted(self.log_dir.glob(f"*/attempt_*/*/{PIPE_PREFIX}*")):
            if path in self._opened or not path.parent.name.isdigit():
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:  # removed meanwhile with its attempt's directory: nothing to read
                continue
            self._opened.add(path)
            try:
                open(reading_marker(str(path)), "x").close()
            except OSError:  # its attempt's directory is gone: torchrun has moved on
                pass
            pipe = _Pipe(fd, int(path.parent.name), int(path.name.removeprefix(PIPE_PREFIX)))
            self._ranks[pipe.local_rank] = pipe.rank
            self._selector.register(pipe.fd, selectors.EVENT_READ, pipe)

    def _read(self, pipe: _Pipe) -> bool:
        """Read and ship one block; True when there may be more to read now."""
        try:
            block = os.read(pipe.fd, READ_BYTES)
        except BlockingIOError:
            return False
        if not block:  # every writer has closed it
            self.ended.add(pipe.local_rank)
            self._end(pipe)
            if self.exited is not None:
                self.exited(pipe.rank, time.time())
            return False
        self._echo(block)
        lines = (pipe.pending + block).split(b"\n")
        pipe.pending = lines.pop()
        self.last_output[pipe.local_rank] = time.monotonic()
        now = time.time()
        if pipe.rank not in self.last_line_at and self.first_line is not None:
            self.first_line(pipe.rank, now)
        self.last_line_at[pipe.rank] = now
        if lines:
            self._ship(pipe, lines)
        if b"\r" in pipe.pending:
            self._progress(pipe)
        return True

    def _echo(self, block: bytes) -> None:
        """To the node's console. A console that fails must not stop the reading: a pipe nobody reads
        blocks its training process once full, and the work dir still gets every line."""
        try:
            self.console.write(block)
            self.console.flush()
        except (OSError, ValueError):
            pass

    def _end(self, pipe: _Pipe) -> None:
        """Stop reading a pipe; a last line without a newline is shipped as it is."""
        self._selector.unregister(pipe.fd)
        os.close(pipe.fd)
        if pipe.pending:
            self._ship(pipe, [pipe.pending])
            pipe.pending = b""

    def _ship(self, pipe: _Pipe, raw_lines: list[bytes]) -> None:
        texts = [(line.rstrip(b"\r").rsplit(b"\r", 1)[-1] if b"\r" in line else line).decode("utf-8", "replace")
                 for line in raw_lines]
        self.tails[pipe.local_rank].extend(texts[-TAIL_LINES:])
        self.shipper.add_many([("out", text, pipe.rank) for text in texts])

    def _progress(self, pipe: _Pipe) -> None:
        head, _, tail = pipe.pending.rpartition(b"\r")
        latest = head.rsplit(b"\r", 1)[-1] if not tail else tail
        pipe.pending = tail
        now = time.monotonic()
        if latest.strip() and now - self._progress_at.get(pipe.local_rank, 0.0) >= PROGRESS_EVERY_SECONDS:
            self._progress_at[pipe.local_rank] = now
            self.shipper.add_many([("progress", latest.decode("utf-8", "replace"), pipe.rank)])
