"""Submit a dry-run value, record the run, and (unless detached) follow it to the end.

Order matters for never losing a run: check the work dir, record the run in ``info.yaml``,
then start it, with Ctrl-C held back until the run's processes are recorded. An interrupt
during submission then stops everything that was started, and the run stays visible to
``list`` and ``status`` as cancelled.
"""

from __future__ import annotations

import time
from typing import TextIO

from launcher.backends.base import Backend, DryRun
from launcher.errors import BadInput
from launcher.interrupts import held_interrupts
from launcher.plan import Plan
from launcher.runs import state
from launcher.runs.preflight import check_work_dir
from launcher.secrets_mask import mask
from launcher.wording import plural

INTERRUPT_GRACE_SECONDS = 10.0


def new_run_info(backend: Backend, plan: Plan) -> state.RunInfo:
    """The client's record of a run about to start (or, for compose, about to be written)."""
    return state.RunInfo(run_id=plan.run_id, backend=backend.name, work_dir=backend.client_work_dir(plan),
                         nodes=plan.node_names, spec_file=str(plan.spec.source or ""),
                         spec_digest=plan.spec.digest, created_at=time.time(),
                         processes_per_node=plan.spec.cluster.processes_per_node or "auto",
                         overrides=list(plan.spec.overrides), effective_spec=mask(plan.spec.data))


def submit(backend: Backend, request: DryRun, *, detach: bool, verbose: bool, out: TextIO) -> int:
    plan = request.plan
    info = new_run_info(backend, plan)
    work_dir = info.work_dir
    state_dir = state.runs_dir() / plan.run_id
    if state_dir.exists():
        raise BadInput(f"run id {plan.run_id} was used before (in {state_dir}); choose another")
    warnings = backend.check(request)  # what the backend refuses is said once, as the error, without notes first
    for note in request.notes:
        out.write(f"note: {note}\n")
    for warning in warnings:
        out.write(f"warning: {warning}\n")
    with held_interrupts() as interrupted:
        run = check_work_dir(work_dir, plan.run_id, {"run_id": plan.run_id, "backend": backend.name,
                                                          "nodes": len(plan.nodes), "created_at": info.created_at})
        if interrupted:
            out.write(f"\ninterrupted before run {plan.run_id} started; nothing was started\n")
            return 130
        info.submission = "submitting"
        path = state.save(info)
        try:
            info.backend_ids = backend.schedule(request, str(state_dir))
            info.submission = "submitted"
        except Exception as exc:  # kept for status: the run shows why it never started, not nodes pending
            info.submission_error = str(exc)
            raise
        finally:
            if info.submission != "submitted":
                info.submission = "failed"
            state.save(info)
    if interrupted:
        from launcher.protocol.control import request_cancel

        out.write(f"\ninterrupted while starting run {plan.run_id}: stopping what was started\n")
        request_cancel(run, "interrupted during submission")
        backend.stop(info, INTERRUPT_GRACE_SECONDS)
        out.write(f"run {plan.run_id} cancelled; its record: {path}\n")
        return 130
    try:  # from here on the run is started and recorded: Ctrl-C only stops following it
        out.write(f"run {plan.run_id}: {plural(len(plan.nodes), 'node')} on "
                  f"{backend.name}, work dir {info.run_url}\ninfo: {path}\n")
        if detach:
            out.write(f"follow it with: launcher watch {plan.run_id}\n")
            out.flush()
            return 0
        out.flush()
        from launcher.commands.watch import follow

        return follow(info, backend=backend, verbose=verbose)
    except KeyboardInterrupt:
        out.write(f"\nstopped following; the run goes on. Stop it with: launcher cancel {plan.run_id}\n")
        return 130
