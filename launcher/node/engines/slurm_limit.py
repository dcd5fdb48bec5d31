"""A Slurm node's view of why it is being stopped: the time limit's notice, and Slurm's own end of the job.

Slurm signals every process of a job's step. With ``sbatch --signal=USR1@SECONDS`` (set from the spec's
timeLimitNotice, :mod:`launcher.backends.slurm.batch`) the notice comes that long before the time limit: the
node's entry blocks SIGUSR1 (:func:`hold`) before it starts the bootstrap, so that torchrun and the training
processes, which inherit the mask, are not ended by its default action; the bootstrap alone takes it
(:func:`watch`) and stops training with SIGTERM, saying "time limit". Slurm sends the signal "up to 60 seconds
earlier than specified" (sbatch(1)), which cost a one-minute job a quarter of its training: the node asks the
controller for the job's EndTime and stops training at EndTime minus the notice, or when the signal comes if that
is later (:func:`stop_at`). A SIGTERM with no cancel marker behind it
is asked about at the controller (:func:`slurm_end`): Slurm's time limit, a node's failure or preemption is
the node's end, not a cancel.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

NOTICE_VARIABLE = "LAUNCHER_TIME_LIMIT_NOTICE"  # the notice's seconds, exported by the batch script
NOTICE_SIGNAL = signal.SIGUSR1
RANKS_SHARE = 0.75  # of the notice, the training processes' time to save; the rest is the node's, to sync outputs
TORCHRUN_SHARE = 0.1  # of the notice, torchrun's own time to end once its training processes did


def ranks_grace(notice: int) -> int:
    """How long the training processes may take to stop once the notice came: most of it (torchrun is told the
    same, TORCH_ELASTIC_SHUTDOWN_TIMEOUT, or it ends them after its default of 30 s)."""
    return max(1, int(notice * RANKS_SHARE))


def node_grace(notice: int) -> int:
    """How long the node waits for torchrun to stop once the notice came: the training processes' time and
    torchrun's own, within the notice (the rest of it is for syncing the outputs)."""
    return min(notice, ranks_grace(notice) + max(1, int(notice * TORCHRUN_SHARE)))


def notice_seconds(env: dict[str, str] | os._Environ) -> int | None:
    """The notice this job asked Slurm for, in seconds (None: none)."""
    given = env.get(NOTICE_VARIABLE, "")
    return int(given) if given.isdigit() and int(given) > 0 else None


def hold() -> None:
    """Block the notice signal in this process and everything it starts from now on (a mask is inherited across
    fork and exec; a handler is not), so that only a process that waits for it (:func:`watch`) takes it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {NOTICE_SIGNAL})


RECHECK_SECONDS = 10.0  # while waiting for the promised stop, how often the job's EndTime is asked again


def watch(on_notice: Callable[[], None], stop_time: Callable[[], float | None] = lambda: None,
          say: Callable[[str], None] = lambda _: None) -> None:
    """Call ``on_notice`` (on a thread of its own) when the notice signal comes, or, where it came early, at
    ``stop_time()`` (asked again while waiting: a job's limit may be changed); the signal must be held (:func:`hold`,
    in this process's parent) in every thread, or a thread that does not hold it takes it."""
    def wait() -> None:
        signal.sigwait({NOTICE_SIGNAL})
        said = False
        while (at := stop_time()) is not None and (left := at - time.time()) > 0:
            if not said:
                say(f"time limit: Slurm's notice came {left:.0f}s before the time it stands for; training goes on "
                    f"until then")
                said = True
            time.sleep(min(left, RECHECK_SECONDS))  # a time to reach, not an event: nothing else says it came
        on_notice()

    threading.Thread(target=wait, name="time-limit-notice", daemon=True).start()


def stop_at(job_id: str, notice: int) -> float | None:
    """When the notice stands for: job ``job_id``'s EndTime less ``notice`` seconds (None: the controller cannot say)."""
    from launcher.backends.slurm.engine import show_job
    from launcher.errors import BackendError

    try:
        job = show_job(job_id)
    except BackendError:
        return None
    return job.ends_at - notice if job is not None and job.ends_at is not None else None


def notice_reason(job_id: str, seconds: int) -> str:
    return f"Slurm ends job {job_id} at its time limit in {seconds}s (the time limit notice)"


def slurm_end(job_id: str) -> tuple[str, bool] | None:
    """Why Slurm ends job ``job_id`` itself, in its words (its state is set before it signals the tasks), and whether
    it took the machines (a time limit, a node's failure: a retry may well succeed); None when it does not (a
    scancel from outside) or the controller cannot say."""
    from launcher.backends.slurm.engine import show_job
    from launcher.errors import BackendError

    try:
        job = show_job(job_id)
    except BackendError:
        return None
    if job is None or not job.ended_by_slurm:
        return None
    return f"Slurm ended job {job_id}: {job.why_ended()}", job.took_machines
