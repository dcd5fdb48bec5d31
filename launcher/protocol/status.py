"""The node's status record, ``status/{node}.json``, rewritten whole at every change and as a heartbeat."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

from launcher.protocol.store import StoreError, WorkDir

STATUS_PREFIX = "status"
# lost: a member of a recovering run that died (the run went on without it, or with its replacement)
# left: a node of an elastic run that left on request (`launcher scale`); the run went on without it
FINAL_STATES = ("succeeded", "failed", "cancelled", "lost", "left")
HEARTBEAT_SECONDS = 10.0  # a node that trains writes its status at least this often


def status_key(node: str) -> str:
    return f"{STATUS_PREFIX}/{node}.json"


class StatusRecord:
    def __init__(self, store: WorkDir, node: str, run_id: str, incarnation: int = 0):
        self.store = store
        self._lock = threading.Lock()
        now = time.time()
        self.record: dict[str, Any] = {
            # incarnation: which start of the node wrote it (a replacement's record replaces its predecessor's)
            "node": node, "run_id": run_id, "incarnation": incarnation, "state": "registering", "rank": None,
            "main": None, "address": None, "host": socket.gethostname(), "pid": os.getpid(), "exit_code": None,
            "reason": None, "started_at": now, "updated_at": now, "ended_at": None,
        }

    def update(self, **changes: Any) -> StoreError | None:
        """Write the record with ``changes``; a store error is returned (the next update or heartbeat writes the
        whole record again), for the one write that has no next: the final state."""
        with self._lock:
            self.record.update(changes)
            now = time.time()
            self.record["updated_at"] = now
            if self.record["state"] in FINAL_STATES and self.record["ended_at"] is None:
                self.record["ended_at"] = now
            data = json.dumps(self.record).encode()
        try:
            self.store.put(status_key(self.record["node"]), data)
        except StoreError as exc:
            return exc
        return None

    def note(self, **changes: Any) -> None:
        """Change the record without writing it: the next update or heartbeat carries the change (a health sample,
        which must not cost a write of its own on object stores)."""
        with self._lock:
            self.record.update(changes)

    def heartbeat(self) -> None:
        self.update()
