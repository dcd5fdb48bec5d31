"""Slurm: one batch job per run, one ``srun`` task per node (:mod:`.batch`), followed through Slurm's own
commands (:mod:`.engine`). The nodes run the spec's directory as it is, from a filesystem they share with
this machine; they meet in the work dir as on every backend.

The controller's view sits beside the work dir's: a job that waits shows Slurm's reason, one that ended
without its nodes reporting (TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, CANCELLED from outside, PREEMPTED) gives
its state as the nodes' cause. A job that can never start (a final pending reason, such as more nodes than its
partition has) or that waits longer than the spec's rendezvousTimeout is cancelled by whichever command sees it
(run following it, watch, status), with Slurm's reason as the run's failure, before any node started.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from typing import Any, Sequence

from launcher.backends.base import Backend, DryRun, NodeFate, Request
from launcher.backends.slurm.attempts import Scope
from launcher.backends.slurm.batch import (asked_partition, attempt_argv, batch_script, gpus_per_node, infra_of,
                                           job_name, notice_capped, one_node_argv, own_option_clashes, python_of,
                                           sbatch_argv)
from launcher.backends.slurm.engine import Job
from launcher.errors import BackendError, BadInput
from launcher.fileio import atomic_write
from launcher.protocol.status import status_key
from launcher.protocol.store import WorkDir
from launcher.plan import Plan
from launcher.runs.incarnations import Incarnation
from launcher.runs.state import RunInfo, runs_dir
from launcher.spec.model import Spec
from launcher.workdirs import resolve_local, scheme

STOP_POLL_SECONDS = 0.5  # while cancel waits for the nodes to end on their own: the controller has no events
JOB_ANSWER_SECONDS = 1.0  # how long one answer of the controller serves (the fates and the engine's line of a look)
INCARNATIONS = "slurm/incarnations"  # lost nodes and the one-node jobs that started them again (runs.incarnations)
GAVE_UP_FILE = "slurm-{job}.gave-up.txt"  # in the run's state dir: why launcher cancelled a job that waited
BATCH_SCRIPT_FILE = "slurm-batch.sh"  # in the run's state dir: the batch script as submitted (mode 0600)


class SlurmBackend(Backend):
    name = "slurm"
    runs_images = False  # the nodes run the spec's directory, on a filesystem they share with this machine

    def __init__(self) -> None:
        self.node_command: tuple[str, ...] = ()
        self._answer: tuple[set[str], float, dict[str, Job]] | None = None  # (jobs asked, when, answer)

    def work_dir(self, spec: Spec) -> tuple[str, list[str]]:
        url, notes = super().work_dir(spec)
        if scheme(url) != "file":
            return url, notes
        return resolve_local(url, spec.base_dir), notes + [
            "the work dir is a directory: every node must see it at the same path (a shared filesystem); "
            "a node that does not says so and fails"]

    def plan(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> tuple[Plan, list[str]]:
        self.node_command = (python_of(infra_of(spec)), "-m", "launcher.node.engines.slurm")
        plan, notes = super().plan(spec, run_id=run_id, resume_from=resume_from)
        whose = "the spec's" if infra_of(spec).python else "this launcher's own"
        notes.append(f"the nodes run {spec.base_dir} as it is, from a filesystem every node shares with this "
                     f"machine, with {whose} Python, {self.node_command[0]} (infrastructure.spec.python to change it)")
        return plan, notes

    def dryrun(self, spec: Spec, *, run_id: str | None = None, resume_from: str | None = None) -> DryRun:
        clashes = own_option_clashes(spec)
        if clashes:
            raise BadInput(f"spec.infrastructure.spec.sbatchOptions: {', '.join(clashes)} would change what launcher "
                           "sets itself (the node count, the job's name, output and environment); use the spec's own "
                           "fields (the cluster's replicas, ...) instead")
        request = super().dryrun(spec, run_id=run_id, resume_from=resume_from)
        notes = [notice_capped(infra_of(spec))]
        gpus = gpus_per_node(spec)
        if gpus and infra_of(spec).gpus_per_node is None:
            notes.append(f"processesPerNode: {gpus} asks Slurm for {gpus} GPUs per node (--gpus-per-node={gpus}) "
                         "where the partition has GPUs; on one without, the job asks for none and the processes run "
                         "on CPU")
        return replace(request, notes=request.notes + tuple(note for note in notes if note))

    def requests(self, plan: Plan) -> list[Request]:
        """One ``sbatch``: its command line and the batch script it reads on stdin."""
        state_dir = runs_dir() / plan.run_id
        argv = sbatch_argv(plan, output=str(state_dir / "slurm-%j.out"))
        script = batch_script(plan, node_output=str(state_dir / "nodes" / "slurm-%j.node%n.out"))
        return [Request("sbatch", job_name(plan.run_id), {"argv": argv, "script": script})]

    def check(self, dryrun: DryRun) -> list[str]:
        from launcher.backends.slurm import engine

        engine.require("sbatch")
        if dryrun.plan.spec.warnings:  # the nodes run the code directory as it is: this would fail on every node
            raise BadInput("\n".join(dryrun.plan.spec.warnings))
        return []

    def schedule(self, dryrun: DryRun, state_dir: str) -> dict[str, Any]:
        from launcher.backends.slurm import engine

        (request,) = dryrun.requests
        os.makedirs(os.path.join(state_dir, "nodes"), exist_ok=True)
        # The script holds the run's env, secrets too: readable by its owner alone. A whole-run retry submits it
        # again after the controller has forgotten the job.
        script_path = os.path.join(state_dir, BATCH_SCRIPT_FILE)
        atomic_write(script_path, request.body["script"].encode(), mode=0o600)
        argv = self._gpus_the_partition_has(dryrun.plan.spec, request.body["argv"])
        job_id, overcome = engine.submitted(argv, request.body["script"])
        if overcome:
            print(f"note: {overcome}", file=sys.stderr)
        recovery = dryrun.plan.nodes[0].env.get("LAUNCHER_RECOVERY")
        return {"job_id": job_id, "submitted_at": time.time(), "sbatch": argv,
                "groups": dryrun.plan.spec.cluster.group_sizes,
                "pending_limit": dryrun.plan.spec.cluster.rendezvous_timeout,
                **({"recovery": json.loads(recovery)} if recovery else {})}

    @staticmethod
    def _gpus_the_partition_has(spec: Spec, argv: list[str]) -> list[str]:
        """``argv`` without the GPUs a number in processesPerNode asked for, where the partition has none: the
        spec did not ask for GPUs itself (gpusPerNode), so its processes run on CPU there instead of the job being
        refused. Where the controller cannot say, sbatch decides."""
        from launcher.backends.slurm import engine

        gpus = gpus_per_node(spec)
        if not gpus or infra_of(spec).gpus_per_node is not None:
            return argv
        partition = asked_partition(argv)
        try:
            if engine.most_gpus(partition) != 0:
                return argv
        except BackendError:
            return argv
        where = f"partition {partition}" if partition else "the default partition"
        print(f"note: {where} has no GPUs: the job asks for none, and each node runs its {gpus} training processes "
              f"on CPU (processesPerNode: {gpus}; infrastructure.spec.gpusPerNode asks for GPUs regardless)",
              file=sys.stderr)
        own = argv.index(f"--gpus-per-node={gpus}")  # launcher's, before any of sbatchOptions
        return argv[:own] + argv[own + 1:]

    def scope(self, info: RunInfo, units: dict[str, str] | None = None, store: WorkDir | None = None,
              started_at: float | None = None) -> Scope:
        """An attempt of the run (``units``: its nodes' jobs; ``store``: its namespace); by default the one the run
        is in now, as this command last saw it."""
        from launcher.runs import attempts

        first = self._first_jobs(info)
        now = info.backend_ids.get(attempts.CURRENT)
        if units is None and now is not None:
            units, started_at = now.get("units") or {}, now.get("at")
        if store is None and info.backend_ids.get("recovery"):
            store = WorkDir(attempts.current_url(info))
        # a node `launcher scale` added in this attempt has a job of its own outside the attempt's record
        jobs = {name: (units or {}).get(name, first[name]) for name in info.nodes}
        return Scope(jobs, store, float(started_at or info.backend_ids.get("submitted_at") or 0.0))

    def _current_jobs(self, scope: Scope) -> tuple[dict[str, str], dict[str, list[Incarnation]]]:
        """node -> the job its newest incarnation in the attempt runs in, and the incarnations the attempt records."""
        from launcher.runs import incarnations

        records = incarnations.read(scope.store, INCARNATIONS) if scope.store is not None else {}
        return incarnations.current(scope.jobs, records), records

    @staticmethod
    def _first_jobs(info: RunInfo) -> dict[str, str]:
        """node -> the job it first ran in: the run's own, or the one-node job of a node `launcher scale` added."""
        added = info.backend_ids.get("added") or {}
        return {name: added.get(name, info.backend_ids["job_id"]) for name in info.nodes}

    def _jobs(self, job_ids: set[str]) -> dict[str, Job] | None:
        """The controller's description of each job it still knows (None: it cannot be asked now). One answer
        serves the fates and the engine's line of one look (within JOB_ANSWER_SECONDS)."""
        from launcher.backends.slurm import engine

        if self._answer and self._answer[0] == job_ids and time.monotonic() - self._answer[1] < JOB_ANSWER_SECONDS:
            return self._answer[2]
        try:
            jobs = engine.jobs(sorted(job_ids))
        except BackendError:
            return None
        self._answer = (job_ids, time.monotonic(), jobs)
        return jobs

    def node_fates(self, info: RunInfo) -> dict[str, NodeFate]:
        if not info.backend_ids.get("job_id"):
            return {}
        if info.backend_ids.get("recovery"):  # moved on, as a whole, from an attempt that cannot go on
            from launcher.backends.slurm.attempts import SlurmJobs
            from launcher.runs import retries

            return retries.fates(SlurmJobs(self), info)
        return self.attempt_fates(info, self.scope(info)) or {}

    def attempt_fates(self, info: RunInfo, scope: Scope) -> dict[str, NodeFate] | None:
        """Each node's fate in one attempt of the run (None: the controller cannot be asked now); in a recovering
        run, a lost node is started again as a one-node job of the attempt (:mod:`launcher.runs.incarnations`)."""
        from launcher.runs import incarnations

        units, records = self._current_jobs(scope)
        jobs = self._jobs(set(units.values()))
        if jobs is None:
            return None
        batch = jobs.get(scope.batch)
        if batch is not None and batch.waiting and self._gave_up_waiting(info, scope, batch):
            return {}  # cancelled just now; the next look sees the job's end
        if batch is not None and batch.ended_by_slurm:
            self._record_engine_end(info, scope, batch)
        elif batch is not None and batch.state == "CANCELLED" and not self._gave_up(info, batch.job_id):
            self._record_outside_cancel(info, scope, batch)
        fates = {name: self._fate(info, scope, name, units[name], jobs.get(units[name]),
                                  incarnations.number_of(name, records)) for name in info.nodes}
        if batch is not None and batch.active and not batch.waiting:
            fates.update(self._removed(info, batch, fates, units))
        if scope.store is None or (batch is not None and batch.ended_by_slurm):
            return fates  # Slurm ends the attempt's job: none of its nodes is started in it again
        return incarnations.recover(scope.store, INCARNATIONS, info.backend_ids["recovery"], units, fates, records,
                                    engine="Slurm", unit="Slurm job", start=self._starter(info))

    def _fate(self, info: RunInfo, scope: Scope, name: str, job_id: str, job: Job | None,
              incarnation: int) -> NodeFate:
        """The node as its job shows it; in a recovering run, lost once the parent of its bootstrap said so
        (``incarnation``: the node's start that runs in ``job_id``)."""
        batch = job_id == scope.batch
        console = str(info.state_dir / "nodes" / f"slurm-{job_id}.node{info.nodes.index(name) if batch else 0}.out")
        run = scope.store
        if job is None:
            return NodeFate(False, None, f"Slurm job {job_id} is gone from the controller, and the node recorded "
                            "no end", console)
        if job.active:
            status = run.get_record(status_key(name)) if run is not None and not job.waiting else {}
            # lost in this job, not a predecessor's "lost", which a replacement keeps until it reports (the
            # times cannot tell them apart: Slurm's start time has whole seconds, the loss and the start
            # often fall within one)
            if status.get("state") == "lost" and int(status.get("incarnation") or 0) == incarnation:
                return NodeFate(False, status.get("exit_code"), status.get("reason"), console, status.get("ended_at"))
            return NodeFate(True, console_log=console)
        gave_up = self._gave_up(info, job_id) if batch else None
        if gave_up or not job.nodes:  # cancelled while it waited: no node ran (the run's failure or cancel says why)
            return NodeFate(False, None, gave_up or f"Slurm: job {job_id} {job.describe()}", console,
                            never_started=True)
        return NodeFate(False, job.exit_code, f"Slurm: job {job_id} {job.describe()}", console, job.end_time)

    def _removed(self, info: RunInfo, job: Job, fates: dict[str, NodeFate],
                 units: dict[str, str]) -> dict[str, NodeFate]:
        """Nodes of the run's job whose machine Slurm took out of it while it runs (down, failed: with --no-kill the
        job goes on without it), their task gone with it: lost. The job's machines as first seen running, in
        SLURM_NODEID order, are kept in the state dir to compare with."""
        from launcher.backends.slurm import engine

        path = info.state_dir / f"slurm-{job.job_id}.nodes.json"
        try:
            first = json.loads(path.read_text())
        except (OSError, ValueError):
            first = None
        try:
            if first is None:
                first = {"nodes": job.nodes, "hosts": engine.hostnames(job.nodes)}
                if info.recorded:
                    atomic_write(path, json.dumps(first))
            if job.nodes == first["nodes"]:
                return {}
            now = set(engine.hostnames(job.nodes))
        except BackendError:
            return {}
        added = info.backend_ids.get("added") or {}
        own = [name for name in info.nodes if name not in added]  # the job's tasks, in SLURM_NODEID order
        return {name: NodeFate(False, None,
                               f"Slurm took {host} out of job {job.job_id} ({job.stated_reason or 'down'})",
                               fates[name].console_log)
                for name, host in zip(own, first["hosts"])
                if host not in now and units[name] == job.job_id and fates[name].running}

    def _starter(self, info: RunInfo) -> Any:
        """How a lost node is started again: a one-node job of the run's batch script, in the run's attempt."""
        def start(claim: Incarnation) -> tuple[str | None, str | None]:
            try:
                return self.one_node_job(info, claim.node, f"{claim.node}.{claim.number}",
                                         {"name": claim.node, "incarnation": claim.number}), None
            except BackendError as exc:
                return None, str(exc)

        return start

    def one_node_job(self, info: RunInfo, name: str, label: str, node: dict[str, Any],
                     attempt: tuple[int, int] | None = None) -> str:
        """Submit the run's batch script as a one-node job for node ``node``, in ``attempt`` (number, restarts used)
        or the one the run is in now."""
        from launcher.backends.slurm import engine
        from launcher.node.engines.slurm import ATTEMPT, ONE_NODE
        from launcher.runs.attempts import CURRENT

        now = info.backend_ids.get(CURRENT)
        attempt = attempt or ((now["number"], now["restarts"]) if now else None)
        env = {ONE_NODE: json.dumps(node), **({ATTEMPT: json.dumps(attempt)} if attempt else {})}
        job_id, overcome = engine.submitted(one_node_argv(attempt_argv(info, attempt), label),
                                            self.batch_script_of(info), env=env)
        if overcome:
            print(f"note: {overcome}", file=sys.stderr)
        return job_id

    @staticmethod
    def batch_script_of(info: RunInfo) -> str:
        """The run's batch script: as submitted from this machine, else as the controller still holds it."""
        from launcher.backends.slurm import engine

        try:
            return (info.state_dir / BATCH_SCRIPT_FILE).read_text()
        except OSError:
            return engine.batch_script(info.backend_ids["job_id"])

    def scale_problem(self, info: RunInfo) -> str | None:
        from launcher.backends.slurm import engine

        if not info.backend_ids.get("job_id"):
            return "the run has no Slurm job to add nodes beside"
        batch = self.scope(info).batch
        job = engine.jobs([batch]).get(batch)
        if job is None or not job.active or job.waiting:
            return f"the run's Slurm job {batch} is not running ({job.describe() if job else 'gone'})"
        return None

    def scale(self, info: RunInfo, add: Sequence[str]) -> list[str]:
        """Each added node runs in a one-node job of the run's batch script, told its name and the groups grown to
        hold it; recorded in the run's record for status, watch, cancel and clean."""
        from launcher import node_names

        if (problem := self.scale_problem(info)) is not None:
            raise BackendError(problem)
        added = info.backend_ids.setdefault("added", {})
        for name in add:
            groups = node_names.including([tuple(group) for group in info.backend_ids["groups"]], name)
            added[name] = self.one_node_job(info, name, name, {"name": name, "groups": groups})
        return list(add)

    def _gave_up_waiting(self, info: RunInfo, scope: Scope, job: Job) -> bool:
        """A job that can never start (Slurm's reason for its wait is final), or that has waited past the run's limit,
        is cancelled, its reason recorded as the run's failure: one no node caused, since none ran."""
        from launcher.backends.slurm import engine
        from launcher.protocol.control import record_failure
        from launcher.protocol.recovery import LOST, NEVER_STARTS

        waited = time.time() - (scope.started_at or time.time())
        limit = float(info.backend_ids.get("pending_limit") or 0)
        details: dict[str, Any] = {"before_start": True}
        if job.never_starts:
            reason = (f"Slurm job {job.job_id} can never start as submitted: {job.describe()}; launcher cancelled it "
                      f"after {waited:.0f}s")
            details["kind"] = NEVER_STARTS  # a whole-run retry would submit the same job again
        elif limit and waited >= limit:
            reason = (f"Slurm job {job.job_id} waited {waited:.0f}s for its nodes, longer than rendezvousTimeout "
                      f"({limit:g}s): {job.describe()}")
            details["kind"] = LOST  # the machines did not come in time, as if taken: retried under retryOn: [lost]
        else:
            return False
        record_failure(scope.store or WorkDir(info.run_url), info.nodes[0], None, None, reason, details)
        atomic_write(info.state_dir / GAVE_UP_FILE.format(job=job.job_id), reason.encode())
        engine.cancel([job.job_id])
        return True

    @staticmethod
    def _record_engine_end(info: RunInfo, scope: Scope, job: Job) -> None:
        """Slurm ended the job itself (its time limit, a node's failure, preemption): the nodes saw a SIGTERM, or
        a peer vanish, and said so; the run's cause is Slurm's reason, recorded once in the work dir for every
        reader (unless a node told first recorded it), dated when Slurm ended the job so that it comes before what
        followed from it."""
        from launcher.protocol.control import cancel_requested, engine_end_key, record_engine_end

        run = scope.store or WorkDir(info.run_url)
        if cancel_requested(run) or run.get_record(engine_end_key(job.job_id)):
            return
        if any(run.get_record(status_key(name)).get("state") == "succeeded" for name in info.nodes):
            return  # the run got to its end (a recovering run, without the node Slurm lost): that result stands
        ended = [at for at in (job.start_time + job.time_limit if job.past_time_limit and job.time_limit else None,
                               job.end_time) if at]
        # the machines were taken, not the training failed: a whole-run retry resumes it
        record_engine_end(run, job.job_id, info.nodes[0], f"Slurm ended job {job.job_id}: {job.why_ended()}",
                          lost=job.took_machines, at=min(ended) if ended else None)

    @staticmethod
    def _record_outside_cancel(info: RunInfo, scope: Scope, job: Job) -> None:
        """The run's job was cancelled from outside launcher (scancel): the user's cancel, recorded as launcher
        cancel records its own, so that every reader says cancelled, and a recovering run is not retried."""
        from launcher.protocol.control import cancel_requested, request_cancel

        run = scope.store or WorkDir(info.run_url)
        if not cancel_requested(run):
            request_cancel(run, f"Slurm job {job.job_id} was cancelled from outside launcher (scancel)")

    @staticmethod
    def _gave_up(info: RunInfo, job_id: str) -> str | None:
        """Why launcher cancelled the job while it waited, where it did (the job then reads CANCELLED)."""
        try:
            return (info.state_dir / GAVE_UP_FILE.format(job=job_id)).read_text()
        except OSError:
            return None

    engine_answer_seconds = JOB_ANSWER_SECONDS

    def engine_state(self, info: RunInfo) -> str | None:
        from launcher.runs.attempts import CURRENT

        if not info.backend_ids.get("job_id"):
            return None
        now = info.backend_ids.get(CURRENT)
        if now is not None and not now.get("units"):  # not the attempt before's line: that job has no say now
            return f"attempt {now['number']}: its Slurm job is submitted once every job of the attempt before has ended"
        scope = self.scope(info)
        units, records = self._current_jobs(scope)
        jobs = self._jobs(set(units.values()))
        if jobs is None:
            return None
        lost_in: dict[str, list[str]] = {}  # job -> the nodes lost in it, each started again in a job of its own
        for item in (item for items in records.values() for item in items if item.lost):
            lost_in.setdefault(item.lost, []).append(item.node)
        first = scope.batch
        lines = [self._job_line(first, jobs.get(first), lost_in.get(first, ()))]
        added = info.backend_ids.get("added") or {}
        for name, job_id in units.items():
            if job_id != first:
                why = "added" if added.get(name) == job_id else "started again"
                lines.append(self._job_line(job_id, jobs.get(job_id), lost_in.get(job_id, ())) + f" ({name}, {why})")
        return "; ".join(dict.fromkeys(lines))

    @staticmethod
    def _job_line(job_id: str, job: Job | None, lost: Sequence[str] = ()) -> str:
        """``Slurm job 11: FAILED on n[1-3] (NonZeroExitCode)``; a job that failed because a node's task ended in it
        says that node was lost there: the run went on without that task, so the job's state is not the run's."""
        if job is None:
            return f"Slurm job {job_id}: no longer known to the controller"
        line = f"Slurm job {job_id}: {job.describe()}"
        if lost and job.state in ("FAILED", "NODE_FAIL"):
            line += f", where {', '.join(lost)} {'was' if len(lost) == 1 else 'were'} lost and the run went on"
        return line

    def _every_job(self, info: RunInfo) -> list[str]:
        """Every job of the run: of each attempt, its own and those that started its lost nodes again."""
        from launcher.runs import attempts, incarnations

        recovering = bool(info.backend_ids.get("recovery"))
        scopes = [self.scope(info, self._first_jobs(info), WorkDir(info.run_url) if recovering else None)]
        if recovering:
            scopes += [self.scope(info, attempt.units, WorkDir(attempt.url))
                       for attempt in attempts.read(WorkDir(info.run_url)) if attempt.units]
        found: list[str] = []
        for scope in scopes:
            _, records = self._current_jobs(scope)
            found += incarnations.every_unit(scope.jobs, records)
        return list(dict.fromkeys(found))

    def release(self, info: RunInfo, *, discard: bool = False) -> list[str]:
        """The run has ended: a job still waiting for nodes (a replacement that came too late) has nothing left
        to join, and is cancelled; those running end on their own (a late node finds the run over)."""
        from launcher.backends.slurm import engine

        if not info.backend_ids.get("job_id"):
            return []
        try:
            active = [job.job_id for job in engine.jobs(self._every_job(info)).values() if job.waiting]
            engine.cancel(active)
        except BackendError:
            return []  # the controller cannot be asked now; the next command that sees the run ended tries again
        return [f"Slurm job {job_id}" for job_id in active]

    def stop(self, info: RunInfo, grace: float) -> list[str]:
        """The nodes were asked to stop through the work dir (their outputs synced); the run's jobs are cancelled
        once they have ended, or after ``grace`` seconds; at once while they still wait for nodes."""
        from launcher.backends.slurm import engine

        if not info.backend_ids.get("job_id"):
            return []
        job_ids = self._every_job(info)
        deadline = time.monotonic() + grace
        while True:
            active = [job for job in engine.jobs(job_ids).values() if job.active]
            if not active:
                return []
            if all(job.waiting for job in active) or time.monotonic() >= deadline:
                engine.cancel([job.job_id for job in active])
                return [f"Slurm job {job.job_id}" + (" (it still waited for nodes)" if job.waiting else "")
                        for job in active]
            time.sleep(STOP_POLL_SECONDS)  # the controller offers nothing to wait on
