"""What a SIGTERM that no ``launcher cancel`` asked for means to a node: the engine's own stop of it (Slurm's time
limit, a node's failure, preemption), a node lost from outside (a Kubernetes pod deleted), or a cancel."""

from __future__ import annotations

import os
import signal

from launcher.node.engines.slurm_limit import slurm_end
from launcher.protocol.control import cancel_requested, record_engine_end
from launcher.protocol.exits import EXIT_LOST, EXIT_PEER_FAILED
from launcher.protocol.store import StoreError, WorkDir

# Set by an engine's node entry (a Kubernetes pod's): a SIGTERM that no `launcher cancel` asked for (no cancel marker)
# stops the node from outside (`kubectl delete pod`, a drained node); the node is lost, not the run cancelled, and
# exits EXIT_LOST, which the engine counts as a lost node and starts again (the Job's podFailurePolicy)
LOST_ON_SIGTERM = "LAUNCHER_LOST_ON_SIGTERM"
# Set by the Slurm node entry to its job's id: a SIGTERM that no `launcher cancel` asked for is asked about at the
# controller, which says whether Slurm ends the job itself (its time limit, a node's failure, preemption)
SLURM_JOB = "LAUNCHER_SLURM_JOB"


def settle_signal(run: WorkDir, signum: int | None, state: str, reason: str | None,
                  exit_code: int) -> tuple[str, str | None, int]:
    """A node's end as it records it, where a SIGTERM that no cancel marker explains ended it: on Slurm, a job Slurm
    ends itself is that end (recorded for every reader: :func:`launcher.protocol.control.record_engine_end`), exit
    EXIT_PEER_FAILED; where the engine counts lost nodes (:data:`LOST_ON_SIGTERM`) the node is "lost", exit
    EXIT_LOST; any other end is as given (a marker that cannot be read: as given, cancelled)."""
    slurm_job = os.environ.get(SLURM_JOB)
    if state != "cancelled" or signum != signal.SIGTERM or not (slurm_job or os.environ.get(LOST_ON_SIGTERM) == "1"):
        return state, reason, exit_code
    try:
        if cancel_requested(run):
            return state, reason, exit_code
    except StoreError:
        return state, reason, exit_code
    if slurm_job:
        ended = slurm_end(slurm_job)
        if ended is None:  # a scancel from outside, or a controller that cannot say: as given
            return state, reason, exit_code
        try:
            record_engine_end(run, slurm_job, os.environ.get("LAUNCHER_NODE_NAME", "?"), ended[0], lost=ended[1])
        except StoreError:
            pass  # the client records it too, once it sees the job's end
        return "failed", f"stopped: {ended[0]}", EXIT_PEER_FAILED
    return "lost", f"{reason or 'received SIGTERM'} from outside, not from launcher cancel: the node is lost", EXIT_LOST
