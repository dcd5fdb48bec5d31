"""Submit a dry-run value, record the run in info.yaml, and (unless detached) follow it to the end."""

from __future__ import annotations

import time
from typing import TextIO

from launcher.backends.base import Backend, DryRun
from launcher.errors import BadInput
from launcher.node.store import WorkDir
from launcher.runs import state


def _refuse_reuse(info: state.RunInfo, state_dir) -> None:
    """A run id names one submission: reusing one would mix two runs' records in the work dir."""
    if state_dir.exists() or WorkDir(info.run_url).list(""):
        raise BadInput(f"run id {info.run_id} was used before (in {state_dir} or {info.run_url}); choose another")


def submit(backend: Backend, request: DryRun, *, detach: bool, verbose: bool, out: TextIO) -> int:
    plan = request.plan
    for note in request.notes:
        out.write(f"note: {note}\n")
    info = state.RunInfo(run_id=plan.run_id, backend=backend.name, work_dir=plan.work_dir,
                         nodes=plan.node_names, spec_file=str(plan.spec.source or ""),
                         spec_digest=plan.spec.digest, created_at=time.time(),
                         processes_per_node=plan.spec.cluster.processes_per_node)
    state_dir = state.runs_dir() / plan.run_id
    _refuse_reuse(info, state_dir)
    info.backend_ids = backend.schedule(request, str(state_dir))
    path = state.save(info)
    out.write(f"run {plan.run_id}: {len(plan.nodes)} nodes on {backend.name}, work dir {info.run_url}\n"
              f"info: {path}\n")
    if detach:
        out.write(f"follow it with: launcher watch {plan.run_id}\n")
        out.flush()
        return 0
    out.flush()
    from launcher.commands.watch import follow

    try:
        return follow(info, backend=backend, verbose=verbose)
    except KeyboardInterrupt:
        out.write(f"\nstopped following; the run goes on. Stop it with: launcher cancel {plan.run_id}\n")
        return 130
