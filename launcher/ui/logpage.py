"""A run's merged log for the ``ui``, a bounded piece at a time after a cursor the page holds.

The server keeps nothing per reader: the cursor (where each node's log stands, as :class:`LogFollower` tracks it)
goes to the page with each answer and comes back with the next question. Each answer holds at most ``limit`` lines,
the newest: a page that opens gets the newest lines without the older chunks being read at all; after a cursor,
the follower streams the new chunks one per node at a time and only the last ``limit`` lines are kept. So a log of
millions of lines costs the server the same memory as a short one; the answer says whether older lines were left
out (``older``) and how many of those it read (``skipped``).
"""

from __future__ import annotations

import collections
import io
import json
import re
from typing import Any

from launcher.commands.watch import LogFollower, speaker
from launcher.errors import BadInput
from launcher.runs.state import RunInfo

MAX_LINES = 5000  # the most lines one answer holds (the page keeps at most this many too)
CURSOR_CHARS_PER_NODE = 200  # a node's position is ~70 characters: a longer cursor is none this module gave out
CHUNK_NAME = re.compile(r"(\d+)~\d+\.\d+\.jsonl")  # logship.chunk_name's form: nothing else is read by name


def read_log(info: RunInfo, *, after: str | None, rank: str | None, limit: int, final: bool) -> dict[str, Any]:
    """The newest ``limit`` lines after the cursor ``after`` (None: of the whole log), of ``rank`` only when given (a
    global rank, or ``[launcher]`` for the node program's own lines), and the cursor after them; ``final``: the run
    has ended, so every chunk is listed."""
    if not 1 <= limit <= MAX_LINES:
        raise BadInput(f"limit {limit}: ask for 1 to {MAX_LINES} lines")

    def wanted(record: dict) -> bool:
        return not rank or speaker(record) == rank

    follower = LogFollower(info, io.StringIO())
    unread = False  # chunks before those read
    if after:
        follower.resume(parse_cursor(after, info))
    else:  # a page that opens: the newest lines, without reading older chunks at all
        follower.start_at_newest(limit, wanted)
        unread = any(seq > 0 for seq, _ in follower.positions().values())
    kept: collections.deque[dict[str, Any]] = collections.deque(maxlen=limit)
    count = 0
    for node, record in follower.records(final=final):
        if wanted(record):
            count += 1
            kept.append({"t": record.get("t"), "node": node, "who": speaker(record), "text": str(record.get("m", ""))})
    return {"lines": list(kept), "skipped": count - len(kept), "older": unread or count > len(kept),
            "after": json.dumps({node: list(position) for node, position in follower.positions().items()})}


def parse_cursor(text: str, info: RunInfo) -> dict[str, tuple[int, str | None]]:
    """A cursor this module gave out, checked: only this run's nodes, and chunk names of the log's own form."""
    try:
        data = json.loads(text) if len(text) <= CURSOR_CHARS_PER_NODE * (len(info.nodes) + 1) else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise BadInput("after: not a log cursor (a JSON object of node: [chunk number, chunk name])")
    positions = {}
    for node, position in data.items():
        if node not in info.nodes:
            raise BadInput(f"after: no node {node!r} in run {info.run_id}")
        seq, name = position if isinstance(position, list) and len(position) == 2 else (None, None)
        named = CHUNK_NAME.fullmatch(name) if isinstance(name, str) else None
        if not isinstance(seq, int) or seq < 0 or (name is not None and (named is None or int(named[1]) != seq)):
            raise BadInput(f"after: node {node}: {position!r} is not a chunk number and name of its log")
        positions[node] = (seq, name)
    return positions
