"""Slurm: one batch job per run, one ``srun`` task per node (:mod:`.batch`), followed through Slurm's own
commands (:mod:`.engine`). The nodes run the spec's directory as it is, from a filesystem they share with
this machine; they meet in the work dir as on every backend.

The controller's view sits beside the work dir's: a job that waits shows Slurm's reason, one that ended
without its nodes reporting (TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, CANCELLED from outside, PREEMPTED) gives
its state as the nodes' cause. A job that waits longer than the spec's rendezvousTimeout is cancelled by
whichever command sees it (run following it, watch, status), with Slurm's reason as the run's failure.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

from launcher.backends.base import Backend, DryRun, NodeFate, Request
from launcher.backends.slurm.batch import (batch_script, infra_of, job_name, python_of, sbatch_argv)
from launcher.errors import BackendError, BadInput
from launcher.fileio import atomic_write
from launcher.plan import Plan
from launcher.runs.state import RunInfo, runs_dir
from launcher.spec.model import Spec
from launcher.workdirs import resolve_local, scheme

STOP_POLL_SECONDS = 0.5
JOB_ANSWER_SECONDS = 1.0
GAVE_UP_FILE = "slurm-gave-up.txt"  # in the run's state dir: why launcher cancelled a job that waited too long  # while cancel waits for the nodes to end on their own: the controller has no events


class SlurmBackend(Backend):
    name = "slurm"
    runs_images = False  # the nodes run the spec's directory, on a filesystem they share with this machine

    def __init__(self) -> None:
        self.node_command: tuple[str, ...] = ()
        self._answer: tuple[str, float, Any] | None = None  # (job id, when, job) of the controller's last answer

    def work_dir(self, spec: Spec) -> tuple[str, list[str]]:
        url, notes = super().work_dir(spec)
        if scheme(url) != "file":
            return url, notes
        return resolve_local(url, spec.base_dir), notes + [
            "the work dir is a directory: every node must see it at the same path (a shared filesystem); "
            "a node that does not says so and fails"]

    def plan(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> tuple[Plan, list[str]]:
        self.node_command = (python_of(infra_of(spec)), "-m", "launcher.node.slurm")
        plan, notes = super().plan(spec, run_id=run_id, resume_from=resume_from)
        whose = "the spec's" if infra_of(spec).python else "this launcher's own"
        notes.append(f"the nodes run {spec.base_dir} as it is, from a filesystem every node shares with this "
                     f"machine, with {whose} Python, {self.node_command[0]} (infrastructure.spec.python to change it)")
        return plan, notes

    def requests(self, plan: Plan) -> list[Request]:
        """One ``sbatch``: its command line and the batch script it reads on stdin."""
        state_dir = runs_dir() / plan.run_id
        argv = sbatch_argv(plan, output=str(state_dir / "slurm-%j.out"))
        script = batch_script(plan, node_output=str(state_dir / "nodes" / "slurm-%j.node%n.out"))
        return [Request("sbatch", job_name(plan.run_id), {"argv": argv, "script": script})]

    def check(self, dryrun: DryRun) -> list[str]:
        if shutil.which("sbatch") is None:
            raise BackendError("sbatch is not installed here (or not on PATH): the slurm backend submits with "
                               "Slurm's own commands; run launcher on a login node of the cluster")
        if dryrun.plan.spec.warnings:  # the nodes run the code directory as it is: this would fail on every node
            raise BadInput("\n".join(dryrun.plan.spec.warnings))
        return []

    def schedule(self, dryrun: DryRun, state_dir: str) -> dict[str, Any]:
        from launcher.backends.slurm import engine

        (request,) = dryrun.requests
        os.makedirs(os.path.join(state_dir, "nodes"), exist_ok=True)
        job_id = engine.submit(request.body["argv"], request.body["script"])
        return {"job_id": job_id, "submitted_at": time.time(),
                "pending_limit": dryrun.plan.spec.cluster.rendezvous_timeout}

    def _job(self, info: RunInfo) -> tuple[Any, bool]:
        """(the run's job as the controller describes it, or None when it forgot it; whether it could be asked).
        One answer serves the fates and the engine's line of one look (within JOB_ANSWER_SECONDS)."""
        from launcher.backends.slurm import engine

        job_id = info.backend_ids.get("job_id")
        if not job_id:
            return None, False
        if self._answer and self._answer[0] == job_id and time.monotonic() - self._answer[1] < JOB_ANSWER_SECONDS:
            return self._answer[2], True
        try:
            job = engine.jobs([job_id]).get(job_id)
        except BackendError:
            return None, False  # the controller cannot be asked now: no fate either way
        self._answer = (job_id, time.monotonic(), job)
        return job, True

    def node_fates(self, info: RunInfo) -> dict[str, NodeFate]:
        job, asked = self._job(info)
        if not asked:
            return {}
        job_id = info.backend_ids["job_id"]
        consoles = {name: self._console(info, index) for index, name in enumerate(info.nodes)}
        if job is None:
            return {name: NodeFate(False, None, f"Slurm job {job_id} is gone from the controller, and the node "
                                   "recorded no end", consoles[name]) for name in info.nodes}
        if job.waiting and self._waited_too_long(info, job):
            return {}  # cancelled just now; the next look sees the job's end
        if job.active:
            return {name: NodeFate(True, console_log=consoles[name]) for name in info.nodes}
        gave_up = self._gave_up(info)
        reason = gave_up or f"Slurm: job {job_id} {job.describe()}"
        return {name: NodeFate(False, None if gave_up else job.exit_code, reason, consoles[name], job.end_time)
                for name in info.nodes}

    def _console(self, info: RunInfo, index: int) -> str:
        return str(info.state_dir / "nodes" / f"slurm-{info.backend_ids.get('job_id')}.node{index}.out")

    def _waited_too_long(self, info: RunInfo, job) -> bool:
        """A job that has waited past the run's limit is cancelled, its reason recorded as the run's failure."""
        from launcher.backends.slurm import engine
        from launcher.node.control import record_failure
        from launcher.node.store import WorkDir

        waited = time.time() - float(info.backend_ids.get("submitted_at") or time.time())
        limit = float(info.backend_ids.get("pending_limit") or 0)
        if not limit or waited < limit:
            return False
        reason = (f"Slurm job {job.job_id} waited {waited:.0f}s for its nodes, longer than rendezvousTimeout "
                  f"({limit:g}s): {job.describe()}")
        record_failure(WorkDir(info.run_url), info.nodes[0], None, None, reason)
        atomic_write(info.state_dir / GAVE_UP_FILE, reason.encode())
        engine.cancel([job.job_id])
        return True

    def _gave_up(self, info: RunInfo) -> str | None:
        """Why launcher cancelled the job that waited too long, where it did (the job then reads CANCELLED)."""
        try:
            return (info.state_dir / GAVE_UP_FILE).read_text()
        except OSError:
            return None

    def engine_state(self, info: RunInfo) -> str | None:
        job, asked = self._job(info)
        job_id = info.backend_ids.get("job_id")
        if not asked:
            return None
        return f"Slurm job {job_id}: {job.describe()}" if job else f"Slurm job {job_id}: no longer known to the controller"

    def stop(self, info: RunInfo, grace: float) -> list[str]:
        """The nodes were asked to stop through the work dir (their outputs synced); the job is cancelled once they
        have ended, or after ``grace`` seconds; at once while it still waits for nodes."""
        from launcher.backends.slurm import engine

        job_id = info.backend_ids.get("job_id")
        if not job_id:
            return []
        deadline = time.monotonic() + grace
        while True:
            job = engine.jobs([job_id]).get(job_id)
            if job is None or not job.active:
                return []
            if job.waiting or time.monotonic() >= deadline:
                engine.cancel([job_id])
                return [f"Slurm job {job_id}"]
            time.sleep(STOP_POLL_SECONDS)  # the controller offers nothing to wait on
