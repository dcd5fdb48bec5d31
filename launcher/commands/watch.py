"""``launcher watch``: one merged stream of every node's log, from the work dir, until the run ends."""

from __future__ import annotations

import collections
import heapq
import itertools
import json
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterable, Iterator, TextIO

from launcher.backends import backend_for
from launcher.backends.base import Backend
from launcher.errors import EXIT_OK, BadInput
from launcher.protocol.control import CONTROL_PREFIX
from launcher.protocol.health import SAMPLE_SECONDS
from launcher.protocol.logship import LOGS_PREFIX, chunk_name, next_chunk_name, parse_chunk_name
from launcher.protocol.status import STATUS_PREFIX
from launcher.protocol.store import StoreError
from launcher.runs.attempts import current_url, started_line
from launcher.runs.health import StragglerNotices
from launcher.runs.preflight import reading_work_dir
from launcher.runs.state import RunInfo, reread, resolve_run
from launcher.runs.view import (RunView, closing_line, not_recorded_note, open_run, outputs_dirs_note, read_view,
                                record_lost)

LOCAL_POLL_SECONDS = 0.05  # new chunks of a local work dir: a failed open per node looked at
STORE_POLL_SECONDS = 0.25  # object stores: a GET per node looked at (or, unbounded, one listing of logs/ per poll)
PROBES_PER_SECOND = 640  # `watch` on a local work dir: nodes looked at for a next chunk, at most, whatever their number
STORE_PROBES_PER_SECOND = 20  # the same on object stores, where each look is a GET (billed, ~20 ms each on S3)
IDLE_SECONDS = 2.0  # the longest a node that wrote nothing waits to be looked at again, however many nodes
VIEW_SECONDS = 0.25  # the run's state: statuses, markers, the backend's processes
VIEW_RECORDS_PER_SECOND = 256  # a view reads each node's status: a run of more nodes is viewed less often
HEALTH_RECORDS_PER_SECOND = 64  # straggler notices: each node's health record, read less often in a run of more
VIEW_PREFIXES = (STATUS_PREFIX, CONTROL_PREFIX)  # a local work dir's records that change the view when written
LOOK_BACK_FACTOR = 20  # a filtered start (start_at_newest) reads at most this many times the lines it wants
COLOURS = (36, 33, 35, 32, 34, 91, 96, 93, 95, 92)
TAGS = {"node": "[launcher]", "torchrun": "[torchrun]"}


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


def speaker(record: dict) -> str:
    """Who wrote a log line: the node program or torchrun (their tags), else a training process (its rank)."""
    rank = record.get("r")
    return TAGS.get(record.get("s")) or (str(rank) if isinstance(rank, int) else "?")


@dataclass
class _Cursor:
    """Where a node's log stands for this reader: the next chunk's number, and its name once known."""
    seq: int = 0
    name: str | None = None  # known from the chunk before it: then it is read without a listing
    due: int = 0  # the poll at which its next chunk is looked for by name
    idle: int = 1  # the polls it waits after a look that found nothing: doubled each time, up to a bound


class LogFollower:
    """Reads new log chunks of a run and prints their lines, prefixed ``[node rRANK]`` for a training
    process's lines (its global rank) and ``[node] [launcher]`` for the node program's own.

    Memory stays bounded whatever the size of the log: each node's chunks are read one at a
    time, in order, and the nodes' streams are merged by time as they are read (a chunk holds
    at most :data:`MAX_CHUNK_LINES` lines), so at most one chunk per node is held at once.
    A node's chunks are found by one listing at first; after that, on a local work dir or when
    bounded, by the name each chunk gives its successor (:func:`next_chunk_name`), and otherwise
    on object stores by a listing of logs/ per poll (which grows with every chunk the run wrote:
    fine for one question, as the ui's log page asks, not for following a long or large run). By
    name, each poll looks at every node; or, given ``probes_per_second`` (a follower that polls on,
    as ``watch`` does; on object stores at most :data:`STORE_PROBES_PER_SECOND`), polls look at no
    more nodes than that a second in all (a poll that comes late, after a slow view, may look at
    more, up to a second's worth),
    those due longest first: a node that wrote is due again at the next poll, one that wrote
    nothing waits twice as long each time, up to the time in which the bound allows looking at
    every node (no wait while it allows every node every poll; at most :data:`IDLE_SECONDS`). So
    following costs a failed open per node looked at, a bounded number a second however many
    nodes the run has, and a read per chunk written; a line waits longer only in runs of more
    nodes than the bound allows each poll. The last poll (``final``) lists, and reads what is left.
    """

    def __init__(self, info: RunInfo, out: TextIO, *, nodes: list[str] | None = None, since: float | None = None,
                 tail: int | None = None, verbose: bool = False, url: str | None = None,
                 probes_per_second: int | None = None, clock: Callable[[], float] = time.monotonic):
        unknown = sorted(set(nodes or ()) - set(info.nodes))
        if unknown:
            raise BadInput(f"no node {', '.join(unknown)} in run {info.run_id}; nodes: {', '.join(info.nodes)}")
        self.info = info
        self.out = out
        self.nodes = list(nodes or info.nodes)
        self.since = since
        self.tail = tail  # per node, of what is there at the first poll; later lines all print
        self.run = reading_work_dir(url) if url else open_run(info)  # url: an earlier attempt's namespace
        self.by_name = self.run.is_local or probes_per_second is not None
        self.poll_seconds = LOCAL_POLL_SECONDS if self.run.is_local else STORE_POLL_SECONDS
        if probes_per_second is not None and not self.run.is_local:
            probes_per_second = min(probes_per_second, STORE_PROBES_PER_SECOND)
        self.probes_per_second = probes_per_second
        self.probes = (len(self.nodes) if probes_per_second is None  # looks per poll, polls on time
                       else max(1, round(probes_per_second * self.poll_seconds)))
        self.clock = clock
        self._allowance, self._allowed_at = float(self.probes), clock()  # looks allowed now, and since when
        self._polls = 0  # polls so far: the clock of the nodes' turns
        self._cursors = {node: _Cursor() for node in self.nodes}
        self.colour = out.isatty()
        self.width = max(len(n) for n in self.nodes)
        self._order = {name: index for index, name in enumerate(info.nodes)}
        self.verbose = verbose  # torchrun's own messages too
        self._progress_open = False  # a progress line is on screen, to be replaced or ended

    def add_nodes(self, names: list[str]) -> None:
        """Follow nodes that joined the run since (``launcher scale``), from their first line."""
        for name in names:
            if name not in self._cursors:
                self.nodes.append(name)
                self._cursors[name] = _Cursor()
                self._order[name] = len(self._order)
        self.width = max(len(n) for n in self.nodes)

    def prefix(self, node: str, rank: str | None = None) -> str:
        """``[node rRANK]`` for a training process's line; ``[node]`` for what concerns the node."""
        label = f"[{node:<{self.width}}{'' if rank is None else ' r' + rank}]"
        if self.colour:
            code = COLOURS[self._order[node] % len(COLOURS)]
            return f"\x1b[{code}m{label}\x1b[0m"
        return label

    def state_changes(self, view: RunView, seen: dict[str, str]) -> None:
        """One line per node state change, e.g. ``[worker-1] -- running``."""
        for node in self.nodes:
            record = view.statuses.get(node, {})
            state = record.get("state", "pending")
            if seen.get(node) != state:
                seen[node] = state
                detail = f" (exit status {record.get('exit_code')})" if state in ("failed", "cancelled") else ""
                self.out.write(f"{self.prefix(node)} -- {state}{detail}\n")
        self.out.flush()

    def say(self, line: str) -> None:
        """A line of the follower's own (a straggler, say), after an open progress line."""
        self.out.write(f"{chr(10) if self._progress_open else ''}{line}\n")
        self._progress_open = False
        self.out.flush()

    def _listing(self) -> dict[str, list[tuple[int, str]]]:
        """Per node, the names of its chunks not read yet, in order, less those older than --since (one LIST)."""
        chunks: dict[str, list[tuple[int, float | None, str]]] = {}
        for key in self.run.find(LOGS_PREFIX):
            node, _, name = key.partition("/")
            if node not in self._cursors or "/" in name:
                continue
            seq, after = parse_chunk_name(name)
            if seq >= self._cursors[node].seq:
                chunks.setdefault(node, []).append((seq, after, name))
        return {node: self._since(sorted(found)) for node, found in chunks.items()}

    def _since(self, chunks: list[tuple[int, float | None, str]]) -> list[tuple[int, str]]:
        """Without the chunks wholly older than --since, never fetched: a chunk's lines are no newer
        than the next chunk's ``after``."""
        older = [index for index, (_, after, _) in enumerate(chunks)
                 if self.since is not None and after is not None and after < self.since]
        return [(seq, name) for seq, _, name in chunks[older[-1] if older else 0:]]

    def _chunks(self, node: str, listed: list[tuple[int, str]] | None) -> Iterator[bytes]:
        """The node's chunks not read yet, in order: those ``listed``, or else each by the name its predecessor gave;
        then when it is next due."""
        cursor = self._cursors[node]
        names = iter(listed) if listed is not None else None
        read = False
        while True:
            found = next(names, None) if names is not None else (
                None if cursor.name is None else (cursor.seq, cursor.name))
            data = None if found is None else self.run.get(f"{LOGS_PREFIX}/{node}/{found[1]}")
            if data is None:  # none, not written yet, or listed but not readable yet: keep order, retry later
                longest = min(round(IDLE_SECONDS / self.poll_seconds), -(-len(self.nodes) // self.probes))
                cursor.idle = 1 if read else max(1, min(longest, 2 * cursor.idle))
                cursor.due = self._polls + cursor.idle
                return
            cursor.seq, cursor.name = found[0] + 1, next_chunk_name(found[0], data)
            read = True
            yield data

    def _looked_at(self, by_name: set[str]) -> set[str]:
        """Of the nodes whose next chunk is looked for by name, those due, the longest due first, as many as the
        looks allowed since the last poll (``probes_per_second`` accrue each second, at most a second's worth)."""
        if self.probes_per_second is None:
            return by_name
        now = self.clock()
        self._allowance = min(max(self.probes, self.probes_per_second),
                              self._allowance + (now - self._allowed_at) * self.probes_per_second)
        self._allowed_at = now
        due = ((self._cursors[node].due, self._order[node], node) for node in by_name
               if self._cursors[node].due <= self._polls)
        chosen = [node for *_, node in heapq.nsmallest(int(self._allowance), due)]
        self._allowance -= len(chosen)
        return set(chosen)

    def _records(self, node: str, chunks: Iterable[bytes]) -> Iterator[tuple[float, int, int, str, dict]]:
        """The lines this follower shows (torchrun's own only with -v), as records in time order."""
        order = self._order[node]
        sequence = itertools.count()  # unique per stream: the merge never compares two records
        for data in chunks:
            for line in data.decode("utf-8", "replace").splitlines():
                try:
                    record = json.loads(line)
                    stamp = float(record["t"])
                except (ValueError, KeyError, TypeError):
                    continue  # a damaged line in the store must not stop the stream
                if record.get("s") == "torchrun" and not self.verbose:
                    continue
                if self.since is None or stamp >= self.since:
                    yield stamp, order, next(sequence), node, record

    def _streams(self, final: bool) -> list[Iterable[tuple[float, int, int, str, dict]]]:
        """Per node, its new records; a listing finds the chunks of nodes whose next chunk's name is not known,
        of every node on an object store, and of every node once the run has ended (whatever wrote them)."""
        by_name = self.by_name and not final
        listing = {} if by_name and all(c.name is not None for c in self._cursors.values()) else self._listing()
        for node, cursor in self._cursors.items():
            if cursor.seq == 0 and node not in listing:  # nothing written yet: its first chunk's name is known
                cursor.name = chunk_name(0, 0.0)
        self._polls += 1
        named = {node for node in self.nodes if by_name and self._cursors[node].name is not None}
        looked_at = self._looked_at(named)
        streams = []
        for node in self.nodes:
            if node in looked_at:
                streams.append(self._records(node, self._chunks(node, None)))
            elif node not in named:
                streams.append(self._records(node, self._chunks(node, listing.get(node, []))))
        if self.tail is not None:
            streams, self.tail = [collections.deque(stream, maxlen=self.tail) for stream in streams], None
        return streams

    def positions(self) -> dict[str, tuple[int, str | None]]:
        """Where each node's log stands for this reader: its next chunk's number and name (when known)."""
        return {node: (cursor.seq, cursor.name) for node, cursor in self._cursors.items()}

    def resume(self, positions: dict[str, tuple[int, str | None]]) -> None:
        """Go on from where another reader of this run stood (its :meth:`positions`)."""
        for node, (seq, name) in positions.items():
            if node in self._cursors:
                self._cursors[node] = _Cursor(seq, name)

    def start_at_newest(self, lines: int, keep: Callable[[dict], bool], look_back: int = LOOK_BACK_FACTOR) -> None:
        """Start each node's log at the chunk from which its newest ``lines`` lines that ``keep`` wants are read,
        reading its chunks from the last back (or from its first), and no further back than ``look_back`` times
        ``lines`` lines of any kind: the newest lines of a log of millions cost a few chunks, not the whole log,
        also where ``keep`` wants few of them (a rank filter on a node that has none of that rank's lines)."""
        for node in self.nodes:
            names = sorted((name for name in self.run.list(f"{LOGS_PREFIX}/{node}") if name.endswith(".jsonl")),
                           key=lambda name: parse_chunk_name(name)[0])
            found = read = 0
            for name in reversed(names):
                data = self.run.get(f"{LOGS_PREFIX}/{node}/{name}") or b""
                records = [record for *_, record in self._records(node, [data])]
                found += sum(1 for record in records if keep(record))
                read += len(records)
                if found >= lines or read >= look_back * lines:
                    self._cursors[node] = _Cursor(parse_chunk_name(name)[0], name)
                    break

    def records(self, *, final: bool = False) -> Iterator[tuple[str, dict]]:
        """Each line of the chunks not read yet, as its node and its record, merged in time order."""
        streams = self._streams(final)
        merged: Iterable[tuple[float, int, int, str, dict]] = (
            streams[0] if len(streams) == 1 else heapq.merge(*streams))
        return ((node, record) for _, _, _, node, record in merged)

    def poll(self, *, final: bool = False) -> int:
        """Print lines from chunks not read yet; return how many lines were printed."""
        prefixes: dict[tuple[str, str], str] = {}
        parts: list[str] = []
        count = 0
        for node, record in self.records(final=final):
            stream = record.get("s")
            who = speaker(record)
            prefix = prefixes.get((node, who))
            if prefix is None:
                prefix = prefixes[(node, who)] = (f"{self.prefix(node)} {who}" if stream in TAGS
                                                  else self.prefix(node, who))
            text = str(record.get("m", ""))
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
    """Show the run's logs and states until it ends (or at once, unless ``keep_following``), then how it ended. Given
    up on the work dir, it says where the nodes keep the outputs the work dir may lack, as the run was last seen."""
    seen: list[RunView] = []
    try:
        return _follow(info, seen, backend=backend, nodes=nodes, since=since, tail=tail,
                       keep_following=keep_following, verbose=verbose, out=out)
    except StoreError:
        note = outputs_dirs_note(seen[0]) if seen else ""
        if note:
            sys.stderr.write(note + "\n")
        raise


def _follow(info: RunInfo, seen: list[RunView], *, backend: Backend | None, nodes: list[str] | None,
            since: float | None, tail: int | None, keep_following: bool, verbose: bool, out: TextIO) -> int:
    backend = backend or backend_for(info.backend, "local")
    _earlier_attempts(info, out, nodes=nodes, since=since, tail=tail, verbose=verbose)
    follower = LogFollower(info, out, nodes=nodes, since=since, tail=tail, verbose=verbose,
                           probes_per_second=PROBES_PER_SECOND)
    show_states = out.isatty() or verbose  # state changes are progress: for people, not for pipes
    states: dict[str, str] = {}
    engine_said: str | None = None
    stragglers = StragglerNotices(every=max(SAMPLE_SECONDS, len(info.nodes) / HEALTH_RECORDS_PER_SECOND))
    unwritable = False  # the work dir refused the lost nodes' records once: they are derived, not tried again
    next_view = viewed = 0.0
    stamp = None
    confirmed = False  # an ended view read again with a fresh answer of the engine (engine_answer_seconds)
    while True:
        now_stamp = follower.run.local_stamp(VIEW_PREFIXES)
        view_gap = len(info.nodes) / VIEW_RECORDS_PER_SECOND  # the least time between views, for its reads
        if now_stamp != stamp:  # a node's status or a marker was written: the run's end is seen at once, or as
            stamp, next_view = now_stamp, viewed + view_gap  # soon after the last view as the bound allows
        if time.monotonic() >= next_view:
            viewed = time.monotonic()
            recorded = reread(info)  # `launcher scale` may have added nodes since
            if len(recorded.nodes) > len(info.nodes):
                info = recorded
                if nodes is None:
                    follower.add_nodes(info.nodes)
            view = read_view(info, follower.run, backend)
            seen[:] = [view]
            engine = backend.engine_state(info)
            if engine and engine != engine_said:  # a batch job's wait and why, its nodes, how it ended
                out.write(f"{engine}\n")
                engine_said = engine
            if current_url(info) != follower.run.url:  # the run was started again, as a new attempt
                follower.poll(final=True)  # the last lines of the attempt that ended
                out.write(started_line(info) + "\n")
                follower, states = LogFollower(info, out, nodes=nodes, verbose=verbose,
                                               probes_per_second=PROBES_PER_SECOND), {}
            refused = None if unwritable or not view.lost else record_lost(view, follower.run)
            if refused:
                unwritable = True
                sys.stderr.write(not_recorded_note(refused) + "\n")
            for straggler in stragglers.new(view, follower.run):
                follower.say(straggler.line())
            if show_states:
                follower.state_changes(view, states)
            next_view = time.monotonic() + max(VIEW_SECONDS, view_gap)
        follower.poll(final=view.ended)  # after reading the view: a node's last chunk precedes its final status
        if view.ended and not confirmed and backend.engine_answer_seconds:
            confirmed = True  # the engine's answer may predate what ended the nodes: once more with a fresh one
            time.sleep(backend.engine_answer_seconds)
            next_view = 0.0
            continue
        if view.ended:
            backend.release(info)
            break
        if not keep_following:
            return EXIT_OK
        time.sleep(follower.poll_seconds)  # the work dir offers no change notification: poll it
    out.write(closing_line(view) + "\n")
    out.flush()
    return view.exit_status()


def _earlier_attempts(info: RunInfo, out: TextIO, *, nodes: list[str] | None, since: float | None,
                      tail: int | None, verbose: bool) -> None:
    """A run retried whole: the logs of each attempt before the one it is in, each followed by how it ended."""
    from launcher.runs import attempts

    if not info.backend_ids.get(attempts.CURRENT):
        return
    records = attempts.read(reading_work_dir(info.run_url))
    current = attempts.current_url(info)
    for attempt, said in zip(records, attempts.history(info, records)):
        earlier = attempts.namespace(info.run_url, info.run_id, attempt.number - 1)
        if earlier == current:
            break
        LogFollower(info, out, nodes=nodes, since=since, tail=tail, verbose=verbose, url=earlier).poll(final=True)
        out.write(f"run {info.run_id}: {said}\n")


def watch(ref: str | None, *, nodes: list[str] | None, since: str | None, tail: int | None, follow_logs: bool,
          verbose: bool = False) -> int:
    if tail is not None and tail < 0:
        raise BadInput(f"--tail {tail}: use a number of lines >= 0")
    info = resolve_run(ref)
    return follow(info, nodes=nodes, since=parse_since(since), tail=tail, keep_following=follow_logs,
                  verbose=verbose)
