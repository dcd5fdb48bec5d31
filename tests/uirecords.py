"""Runs for the ``ui``'s tests and benchmark, written by the real writers: the client's run record (state.save),
each node's status record, failure markers and log chunks as nodes write them."""

from __future__ import annotations

import time
from pathlib import Path

from launcher.protocol.control import record_failure
from launcher.protocol.logship import LogShipper
from launcher.protocol.status import StatusRecord
from launcher.protocol.store import WorkDir
from launcher.runs import state

NODES = ("t-main", "t-worker-0")
STATES = ("succeeded", "failed", "cancelled", "running")  # the run i is in STATES[i % 4]


def write_run(work_dir: Path, run_id: str, end: str, *, created_at: float, backend: str = "local") -> WorkDir:
    """A recorded two-node run whose nodes are in ``end``'s state (a failed run: its worker failed first)."""
    info = state.RunInfo(run_id=run_id, backend=backend, work_dir=str(work_dir), nodes=list(NODES),
                         spec_file=f"/projects/{run_id}/train.yaml", spec_digest="0" * 12, created_at=created_at,
                         effective_spec={"kind": "distributed", "spec": {"name": f"name-{run_id}"}})
    state.save(info)
    store = WorkDir(f"{work_dir}/{run_id}")
    for rank, node in enumerate(NODES):
        status = StatusRecord(store, node, run_id)
        if end == "failed":
            code = 1 if rank else 143
            reason = "rank 1: ValueError: bad batch" if rank else "stopped because t-worker-0 failed"
            if rank:
                record_failure(store, node, rank, code, reason)
            status.update(state="failed", exit_code=code, rank=rank, reason=reason)
        else:
            status.update(state=end, rank=rank, exit_code={"succeeded": 0, "cancelled": 143}.get(end))
    return store


def write_runs(home: Path, count: int) -> dict[str, str]:
    """``count`` recorded runs, a minute apart (run 0 the newest); their ids and states."""
    now = time.time()
    made = {}
    for index in range(count):
        run_id = f"r{index:05d}"
        write_run(home / "wd", run_id, STATES[index % len(STATES)], created_at=now - 60 * index,
                  backend="slurm" if index % 10 == 0 else "local")
        made[run_id] = STATES[index % len(STATES)]
    return made


def ship(store: WorkDir, node: str, lines: list[tuple[str, str, int | None]], *, max_lines: int = 5000) -> None:
    """Log lines as a node ships them, after those it shipped before (``(stream, text, rank)``)."""
    shipper = LogShipper(store, node, max_lines=max_lines, continues=True)
    shipper.add_many(lines)
    shipper.close()
