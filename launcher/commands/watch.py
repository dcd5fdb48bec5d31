"""``launcher watch``: one merged stream of every node's log, from the work dir, until the run ends."""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from typing import TextIO

from launcher.backends import backend_for
from launcher.backends.base import Backend
from launcher.errors import EXIT_OK, EXIT_RUN_FAILED, BadInput
from launcher.node.logship import LOGS_PREFIX
from launcher.runs.state import RunInfo, resolve_run
from launcher.runs.view import RunView, closing_line, open_run, read_view

POLL_SECONDS = 0.25
COLOURS = (36, 33, 35, 32, 34, 91, 96, 93, 95, 92)
# After the backend says nothing runs any more, how long to wait for final records to appear.
SETTLE_SECONDS = 5.0


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
    """Reads new log chunks of a run and prints their lines with a node/rank prefix."""

    def __init__(self, info: RunInfo, out: TextIO, *, nodes: list[str] | None = None, since: float | None = None):
        unknown = sorted(set(nodes or ()) - set(info.nodes))
        if unknown:
            raise BadInput(f"no node {', '.join(unknown)} in run {info.run_id}; nodes: {', '.join(info.nodes)}")
        self.info = info
        self.out = out
        self.nodes = nodes or info.nodes
        self.since = since
        self.run = open_run(info)
        self.read: set[str] = set()
        self.colour = out.isatty()
        self.width = max(len(n) for n in self.nodes)

    def prefix(self, node: str, rank: int | None) -> str:
        label = f"[{node:<{self.width}} r{'?' if rank is None else rank}]"
        if self.colour:
            code = COLOURS[self.info.nodes.index(node) % len(COLOURS)]
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

    def poll(self, view: RunView | None) -> int:
        """Print lines from chunks not read yet; return how many lines were printed."""
        records = []
        keys = [k for k in self.run.find(LOGS_PREFIX) if k not in self.read]
        for key in keys:
            node = key.split("/", 1)[0]
            if node not in self.nodes:
                continue
            data = self.run.get(f"{LOGS_PREFIX}/{key}")
            if data is None:
                continue
            self.read.add(key)
            for line in data.decode("utf-8", "replace").splitlines():
                record = json.loads(line)
                if self.since is None or record["t"] >= self.since:
                    records.append((record["t"], key, node, record))
        records.sort(key=lambda item: (item[0], item[1]))
        for _, _, node, record in records:
            rank = view.rank_of(node) if view else None
            text = record["m"] if record["s"] != "node" else f"[launcher] {record['m']}"
            self.out.write(f"{self.prefix(node, rank)} {text}\n")
        if records:
            self.out.flush()
        return len(records)


def follow(info: RunInfo, *, backend: Backend | None = None, nodes: list[str] | None = None,
           since: float | None = None, keep_following: bool = True, verbose: bool = False,
           out: TextIO = sys.stdout) -> int:
    backend = backend or backend_for(info.backend, "local")
    follower = LogFollower(info, out, nodes=nodes, since=since)
    show_states = out.isatty() or verbose  # state changes are progress: for people, not for pipes
    states: dict[str, str] = {}
    gone_since: float | None = None
    while True:
        view = read_view(info, follower.run)
        if show_states:
            follower.state_changes(view, states)
        follower.poll(view)  # after reading the view: a node's last chunk precedes its final status
        if view.ended:
            break
        if not keep_following:
            return EXIT_OK
        if backend.alive(info.backend_ids) is False:
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > SETTLE_SECONDS:
                missing = [n for n in info.nodes if n not in view.statuses]
                out.write(f"run {info.run_id}: no process is left but nodes never reported: "
                          f"{', '.join(missing) or 'final states'}\n")
                return EXIT_RUN_FAILED
        time.sleep(POLL_SECONDS)  # the work dir offers no change notification: poll it
    out.write(closing_line(view) + "\n")
    out.flush()
    return EXIT_OK if view.result == "succeeded" else EXIT_RUN_FAILED


def watch(ref: str | None, *, nodes: list[str] | None, since: str | None, follow_logs: bool,
          verbose: bool = False) -> int:
    info = resolve_run(ref)
    return follow(info, nodes=nodes, since=parse_since(since), keep_following=follow_logs, verbose=verbose)
