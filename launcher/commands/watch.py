"""``launcher watch``: one merged stream of every node's log, from the work dir, until the run ends."""

from __future__ import annotations

import collections
import heapq
import itertools
import json
import re
import sys
import time
from datetime import datetime
from typing import Iterable, Iterator, TextIO

from launcher.backends import backend_for
from launcher.backends.base import Backend
from launcher.errors import EXIT_OK, EXIT_RUN_FAILED, BadInput
from launcher.node.logship import LOGS_PREFIX, parse_chunk_name
from launcher.runs.state import RunInfo, resolve_run
from launcher.runs.view import RunView, closing_line, open_run, read_view, record_lost

POLL_SECONDS = 0.25
COLOURS = (36, 33, 35, 32, 34, 91, 96, 93, 95, 92)


def parse_since(text: str | None, now: float | None = None) -> float | None:
    if not text:
        return None
    now = time.time() if now is None else now
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", text.strip())
    if match:
        scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        return now - float(match.group(1)) * scale
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise BadInput(f"--since {text!r}: use seconds (90), a duration (5m, 2h) or an ISO time") from None


class LogFollower:
    """Reads new log chunks of a run and prints their lines with a node/rank prefix.

    Memory stays bounded whatever the size of the log: each node's chunks are read one at a
    time, in order, and the nodes' streams are merged by time as they are read (a chunk holds
    at most :data:`MAX_CHUNK_LINES` lines), so at most one chunk per node is held at once.
    """

    def __init__(self, info: RunInfo, out: TextIO, *, nodes: list[str] | None = None, since: float | None = None,
                 tail: int | None = None, verbose: bool = False):
        unknown = sorted(set(nodes or ()) - set(info.nodes))
        if unknown:
            raise BadInput(f"no node {', '.join(unknown)} in run {info.run_id}; nodes: {', '.join(info.nodes)}")
        self.info = info
        self.out = out
        self.nodes = nodes or info.nodes
        self.since = since
        self.tail = tail  # applies to what is there at the first poll; later lines all print
        self.run = open_run(info)
        self.read: set[str] = set()
        self.colour = out.isatty()
        self.width = max(len(n) for n in self.nodes)
        self._order = {name: index for index, name in enumerate(info.nodes)}
        self.verbose = verbose  # torchrun's own messages too
        self._progress_open = False  # a progress line is on screen, to be replaced or ended

    def prefix(self, node: str, rank: int | None) -> str:
        label = f"[{node:<{self.width}} r{'?' if rank is None else rank}]"
        if self.colour:
            code = COLOURS[self._order[node] % len(COLOURS)]
            return f"\x1b[{code}m{label}\x1b[0m"
        return label

    def state_changes(self, view: RunView, seen: dict[str, str]) -> None:
        """One line per node state change, e.g. ``[worker-1 r2] -- running``."""
        for node in self.nodes:
            record = view.statuses.get(node, {})
            state = record.get("state", "pending")
            if seen.get(node) != state:
                seen[node] = state
                detail = f" (exit status {record.get('exit_code')})" if state in ("failed", "cancelled") else ""
                self.out.write(f"{self.prefix(node, view.rank_of(node))} -- {state}{detail}\n")
        self.out.flush()

    def _new_chunks(self) -> dict[str, list[str]]:
        """Per node, the keys of chunks not read yet, in the order the node wrote them (one LIST)."""
        chunks: dict[str, list[tuple[int, str]]] = {}
        wanted = set(self.nodes)
        for key in self.run.find(LOGS_PREFIX):
            if key in self.read:
                continue
            node, _, name = key.partition("/")
            if node not in wanted or "/" in name:
                continue
            seq, last = parse_chunk_name(name)
            if self.since is not None and last is not None and last < self.since:
                self.read.add(key)  # wholly older than --since: never fetched
                continue
            chunks.setdefault(node, []).append((seq, key))
        return {node: [key for _, key in sorted(keys)] for node, keys in chunks.items()}

    def _records(self, node: str, keys: list[str]) -> Iterator[tuple[float, int, int, str, dict]]:
        order = self._order[node]
        sequence = itertools.count()  # unique per stream: the merge never compares two records
        for key in keys:
            data = self.run.get(f"{LOGS_PREFIX}/{key}")
            if data is None:  # listed but not readable yet: stop here, keep order, retry next poll
                return
            self.read.add(key)
            for line in data.decode("utf-8", "replace").splitlines():
                try:
                    record = json.loads(line)
                    stamp = float(record["t"])
                except (ValueError, KeyError, TypeError):
                    continue  # a damaged line in the store must not stop the stream
                if self.since is None or stamp >= self.since:
                    yield stamp, order, next(sequence), node, record

    def poll(self, view: RunView | None) -> int:
        """Print lines from chunks not read yet; return how many lines were printed."""
        streams = [self._records(node, keys) for node, keys in self._new_chunks().items()]
        merged: Iterable[tuple[float, int, int, str, dict]] = (
            streams[0] if len(streams) == 1 else heapq.merge(*streams))
        if self.tail is not None:
            merged, self.tail = collections.deque(merged, maxlen=self.tail), None
        prefixes: dict[tuple[str, int | None], str] = {}
        parts: list[str] = []
        count = 0
        for _, _, _, node, record in merged:
            stream = record.get("s")
            if stream == "torchrun" and not self.verbose:
                continue
            rank = record.get("r")
            if not isinstance(rank, int):
                rank = view.rank_of(node) if view else None
            prefix = prefixes.get((node, rank))
            if prefix is None:
                prefix = prefixes[(node, rank)] = self.prefix(node, rank)
            text = str(record.get("m", ""))
            if stream in ("node", "torchrun"):
                text = f"[{'launcher' if stream == 'node' else 'torchrun'}] {text}"
            if stream == "progress" and self.colour:  # a terminal: update the line in place
                parts.append(f"\r{prefix} {text}\x1b[K")
                self._progress_open = True
            else:
                parts.append(f"{chr(10) if self._progress_open else ''}{prefix} {text}\n")
                self._progress_open = False
            count += 1
            if len(parts) >= 4096:
                self.out.write("".join(parts))
                parts.clear()
        if parts:
            self.out.write("".join(parts))
        if count:
            self.out.flush()
        return count


def follow(info: RunInfo, *, backend: Backend | None = None, nodes: list[str] | None = None,
           since: float | None = None, tail: int | None = None, keep_following: bool = True,
           verbose: bool = False, out: TextIO = sys.stdout) -> int:
    backend = backend or backend_for(info.backend, "local")
    follower = LogFollower(info, out, nodes=nodes, since=since, tail=tail, verbose=verbose)
    show_states = out.isatty() or verbose  # state changes are progress: for people, not for pipes
    states: dict[str, str] = {}
    while True:
        view = read_view(info, follower.run, backend)
        record_lost(view, follower.run)
        if show_states:
            follower.state_changes(view, states)
        follower.poll(view)  # after reading the view: a node's last chunk precedes its final status
        if view.ended:
            backend.release(info)
            break
        if not keep_following:
            return EXIT_OK
        time.sleep(POLL_SECONDS)  # the work dir offers no change notification: poll it
    out.write(closing_line(view) + "\n")
    out.flush()
    return EXIT_OK if view.result == "succeeded" else EXIT_RUN_FAILED


def watch(ref: str | None, *, nodes: list[str] | None, since: str | None, tail: int | None, follow_logs: bool,
          verbose: bool = False) -> int:
    if tail is not None and tail < 0:
        raise BadInput(f"--tail {tail}: use a number of lines >= 0")
    info = resolve_run(ref)
    return follow(info, nodes=nodes, since=parse_since(since), tail=tail, keep_following=follow_logs,
                  verbose=verbose)
