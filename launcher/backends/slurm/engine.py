"""Slurm through its own commands: ``sbatch --parsable``, ``squeue --json`` (else ``scontrol -o show job``),
``scancel``. Machine formats only, never human output; every failure is a BackendError naming the command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from datetime import datetime
from dataclasses import dataclass
from typing import Mapping, Sequence

from launcher.errors import BackendError

COMMAND_TIMEOUT = 60  # seconds; a controller that does not answer in this time is reported, not waited for
# Slurm's job states in which the job holds or waits for nodes; every other state is an end
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
# states whose exit code is the batch script's own (the others end it with a signal, or never start it)
EXIT_CODE_STATES = {"COMPLETED", "FAILED", "OUT_OF_MEMORY"}
ENDED_BY_SLURM = {"TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE", "BOOT_FAIL"}
# why a COMPLETING job is being ended by Slurm; JobLaunchFailure: its batch script's node failed (Slurm 22.05 then
# ends it FAILED, not NODE_FAIL)
ENDING_REASONS = {"TimeLimit", "NodeDown", "OutOfMemory", "DeadLine", "JobLaunchFailure"}
TAKEN_STATES = {"TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL"}  # Slurm took the machines; the training did no wrong
TAKEN_REASONS = {"TimeLimit", "NodeDown", "JobLaunchFailure"}
WAITING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
# Pending reasons that cannot clear while the job waits as it was submitted (man squeue, JOB REASON CODES): it asks
# one job's worth of more than its partition has or allows (nodes, time, a configuration such as memory or GPUs),
# more than a per-job limit of its QOS or association allows, or names an account, QOS, constraint or dependency that
# can never be met. Slurm keeps such a job pending until someone changes the cluster's configuration for it; waiting
# helps nothing. Reasons that clear on their own as jobs end, nodes come back or limits free up are not here:
# Resources, Priority, ReqNodeNotAvail (a node down or drained may return), PartitionDown/Inactive, the group limits
# (AssocGrp*, QOSGrp*, *PerUser*), holds, BeginTime, Dependency.
NEVER_STARTS_REASONS = {
    "PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints", "InvalidAccount", "InvalidQOS",
    "DependencyNeverSatisfied", "QOSMaxNodePerJobLimit", "QOSMaxCpuPerJobLimit", "QOSMaxMemoryPerJob",
    "QOSMaxGRESPerJob", "QOSMaxWallDurationPerJobLimit", "AssocMaxNodesPerJobLimit", "AssocMaxCpuPerJobLimit",
    "AssocMaxMemPerJob", "AssocMaxGRESPerJob", "AssocMaxWallDurationPerJobLimit"}


@dataclass(frozen=True)
class Job:
    """A job as the controller describes it."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, ...
    reason: str  # why it is pending, or how it ended (None when there is nothing to say)
    nodes: str  # the nodes Slurm gave it, in its own notation (n[1-3])
    exit_code: int | None  # the batch script's exit status, where the job has ended
    end_time: float | None
    start_time: float = 0.0  # when it started running (0: not yet, or not stated)
    time_limit: float | None = None  # seconds (None: unlimited, or not stated)
    ends_at: float | None = None  # a running job's: when the controller ends it at its time limit (None: not said)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES

    @property
    def never_starts(self) -> bool:
        """Pending for a reason that cannot clear on its own (:data:`NEVER_STARTS_REASONS`)."""
        return self.waiting and self.reason in NEVER_STARTS_REASONS

    @property
    def past_time_limit(self) -> bool:
        """Past its time limit and being ended: Slurm acts on its own clock, never launcher's (a job still RUNNING
        a moment after the limit by this machine's clock is still Slurm's to end, or to let a cancel win)."""
        return bool(self.time_limit and self.start_time and time.time() >= self.start_time + self.time_limit) \
            and self.state not in ("RUNNING", "COMPLETED")

    @property
    def ended_by_slurm(self) -> bool:
        """Slurm ends (or has ended) the job itself: its time limit, a node's failure, preemption, memory. Its
        state may say so a moment after the nodes got their SIGTERM: a job past its time limit is one already."""
        return self.state in ENDED_BY_SLURM or (self.state in ("COMPLETING", "FAILED") and
                                                self.reason in ENDING_REASONS) or self.past_time_limit

    @property
    def took_machines(self) -> bool:
        """Slurm ended the job for its own reasons (time limit, a node's failure, preemption), not for the job's
        use of them (memory, a deadline): starting it again may well succeed."""
        return self.state in TAKEN_STATES or self.reason in TAKEN_REASONS or \
            (self.past_time_limit and self.state != "OUT_OF_MEMORY")

    def why_ended(self) -> str:
        if (self.past_time_limit or self.state == "TIMEOUT" or self.reason == "TimeLimit") and self.time_limit:
            return f"its time limit of {self.time_limit / 60:g} min ran out (TIMEOUT)"
        return self.describe()

    @property
    def stated_reason(self) -> str:
        """The controller's reason, empty where it has none (it says "None")."""
        return "" if self.reason in (None, "None") else self.reason

    def describe(self) -> str:
        """One line: ``PENDING (Resources)``, ``RUNNING on n[1-3]``, ``TIMEOUT on n[1-3]``."""
        reason = f" ({self.stated_reason})" if self.stated_reason else ""
        where = f" on {self.nodes}" if self.nodes and not self.waiting else ""
        return f"{self.state}{where}{reason}"


def require(command: str) -> None:
    """A Slurm command this machine lacks is a clear error, before anything is recorded."""
    if shutil.which(command) is None:
        raise BackendError(f"{command} is not installed here (or not on PATH): the slurm backend submits and "
                           "follows jobs with Slurm's own commands; run launcher on a login node of the cluster")


def _command(argv: Sequence[str], *, stdin: str | None = None,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm command in a session of its own: a Ctrl-C at the terminal reaches launcher, which holds it
    back while it submits, and never cuts a command off between the controller's answer and ours."""
    require(argv[0])
    try:
        return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                              env=None if env is None else {**os.environ, **env}, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise BackendError(f"{argv[0]} did not answer in {COMMAND_TIMEOUT}s: is the Slurm controller "
                           "reachable (scontrol ping)?") from None


def _failed(argv: Sequence[str], result: subprocess.CompletedProcess) -> BackendError:
    said = (result.stderr or result.stdout).strip()
    hint = ""
    if "Invalid generic resource (gres) specification" in said and any("--gpus" in token for token in argv):
        hint = ("\n  the job asks for GPUs this cluster does not have; on CPU nodes set "
                "infrastructure.spec.gpusPerNode: 0 (gpusPerNode asks for GPUs regardless; a number in processesPerNode "
                "asks only where sinfo shows the partition has GPUs, or cannot say)")
    return BackendError(f"{argv[0]} failed (exit {result.returncode}): {said or 'no message'}{hint}")


def submit(argv: Sequence[str], script: str, env: Mapping[str, str] | None = None) -> str:
    """Submit the batch script (on stdin) with ``argv`` (``sbatch --parsable ...``) and ``env`` added to sbatch's
    environment (which --export=ALL hands to the job); the new job's id."""
    result = _command(argv, stdin=script, env=env)
    if result.returncode != 0:
        raise _failed(argv, result)
    job_id = result.stdout.strip().split(";")[0]  # --parsable: "ID" or "ID;CLUSTER"
    if not job_id.isdigit():
        raise BackendError(f"sbatch answered {result.stdout.strip()!r}, not a job id")
    return job_id


def submitted(argv: Sequence[str], script: str, env: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """:func:`submit`, where a failure whose answer may have been lost (a timeout, a controller that dropped the
    connection after it took the job) is checked against the queue: the job with the same unique name is
    adopted. The job's id, and what was said about the failure that was overcome (None: there was none)."""
    try:
        return submit(argv, script, env), None
    except BackendError as failed:
        name = next((token.split("=", 1)[1] for token in argv if token.startswith("--job-name=")), None)
        try:
            found = named(name) if name else []
        except BackendError:
            raise failed from None
        if len(found) != 1:
            raise
        return found[0], f"{failed}; the controller had taken the job all the same: job {found[0]} ({name})"


def named(name: str) -> list[str]:
    """The ids of the jobs the controller knows by this name (a fixed --format: one id per line)."""
    argv = ["squeue", "--noheader", f"--name={name}", "--format=%i"]
    result = _command(argv)
    if result.returncode != 0:
        raise _failed(argv, result)
    return result.stdout.split()


def jobs(job_ids: Sequence[str]) -> dict[str, Job]:
    """The jobs the controller still knows of, by id (it forgets ended jobs after its MinJobAge)."""
    wanted = {str(job_id) for job_id in job_ids}
    if not wanted:
        return {}
    argv = ["squeue", "--json"]
    result = _command(argv)
    if result.returncode == 0 and result.stdout.lstrip().startswith("{"):
        # Slurm 22.05's --json ignores every filter option: the whole queue comes, and is filtered here
        return {job.job_id: job for job in map(_from_json, json.loads(result.stdout).get("jobs", []))
                if job.job_id in wanted}
    if "json" not in result.stderr:  # any failure but a Slurm too old for --json
        raise _failed(argv, result)
    return {job.job_id: job for job_id in sorted(wanted) if (job := show_job(job_id)) is not None}


def _from_json(data: dict) -> Job:
    end = data.get("end_time")
    state = data.get("job_state") or "UNKNOWN"
    state = state if isinstance(state, str) else state[0]
    return Job(str(data["job_id"]), state, data.get("state_reason") or "", data.get("nodes") or "",
               _exit_status(data.get("exit_code")) if state in EXIT_CODE_STATES else None,
               # whole seconds: the end is taken as late as it can be, so that a cancel asked for in that
               # second is not taken for a failure that came before it
               float(end) + 0.999 if end and state not in ACTIVE_STATES else None,
               float(data.get("start_time") or 0) if state not in WAITING_STATES else 0.0,
               _minutes(data.get("time_limit")))


def _minutes(value: object) -> float | None:
    """squeue --json's time_limit: minutes (later versions: {"set": bool, "number": N}); None when unlimited."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set") and not value.get("infinite") else None
    return value * 60.0 if isinstance(value, int) and value > 0 else None


def _exit_status(value: object) -> int | None:
    """squeue --json gives the batch script's wait status (exit code << 8, or the signal)."""
    if isinstance(value, dict):  # later versions: {"return_code": N, "signal": {...}}
        value = value.get("return_code")
    if not isinstance(value, int):
        return None
    return value >> 8 if value > 255 else value


def time_limit_seconds(limit: str | None) -> int | None:
    """Slurm's time format (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds; None: no limit."""
    if limit is None or limit.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if days:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:  # MM, MM:SS, HH:MM:SS
        hours, minutes, seconds = ([0] * (3 - len(parts)) + parts) if len(parts) == 3 else (0, *(parts + [0])[:2])
    total = int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    return total or None  # 0: none


def show_job(job_id: str) -> Job | None:
    """``scontrol -o show job ID``: one line of KEY=VALUE pairs (Slurm versions without squeue --json; a node that
    asks about its own job, without the whole queue)."""
    argv = ["scontrol", "-o", "show", "job", job_id]
    result = _command(argv)
    if result.returncode != 0:
        if "Invalid job id" in result.stderr:
            return None
        raise _failed(argv, result)
    fields = dict(token.split("=", 1) for token in result.stdout.split() if "=" in token)
    state = fields.get("JobState", "UNKNOWN")
    code = fields.get("ExitCode", "")
    limit = fields.get("TimeLimit", "")
    return Job(job_id, state, fields.get("Reason", ""), "" if fields.get("NodeList") == "(null)" else
               fields.get("NodeList", ""),
               int(code.split(":")[0]) if code[:1].isdigit() and state in EXIT_CODE_STATES else None, None,
               time_limit=time_limit_seconds(limit) if limit[:1].isdigit() else None,
               ends_at=_clock_time(fields.get("EndTime")) if state == "RUNNING" and limit[:1].isdigit() else None)


def _clock_time(value: str | None) -> float | None:
    """scontrol's ``2026-12-02T02:10:00`` (the controller's local time, which a node of its cluster shares) as Unix
    time; None for ``Unknown`` or ``None``."""
    try:
        return datetime.fromisoformat(value).timestamp() if value else None
    except ValueError:
        return None


def most_gpus(partition: str | None) -> int | None:
    """The most GPUs (gres ``gpu``) one node of ``partition`` (None: the cluster's default partition) has; None
    where the controller knows no such partition."""
    argv = ["sinfo", "--noheader", "--Node", "--format=%P %G"]  # a fixed format: partition (default: NAME*), gres
    result = _command(argv)
    if result.returncode != 0:
        raise _failed(argv, result)
    counts = [sum(int(count) for count in re.findall(r"gpu(?::[^:,()]+)?:(\d+)", gres))
              for name, _, gres in (line.partition(" ") for line in result.stdout.splitlines())
              if name.rstrip("*") == partition or (partition is None and name.endswith("*"))]
    return max(counts) if counts else None


def hostnames(nodes: str) -> list[str]:
    """Slurm's node list notation (``n[1-3],gpu7``) as names, in Slurm's order (that of SLURM_NODEID)."""
    argv = ["scontrol", "show", "hostnames", nodes]
    result = _command(argv)
    if result.returncode != 0:
        raise _failed(argv, result)
    return result.stdout.split()


def batch_script(job_id: str) -> str:
    """The batch script the controller holds for a job (``scontrol write batch_script ID -``)."""
    argv = ["scontrol", "write", "batch_script", job_id, "-"]
    result = _command(argv)
    if result.returncode != 0:
        raise _failed(argv, result)
    return result.stdout


def cancel(job_ids: Sequence[str], *, signal: str | None = None) -> None:
    """``scancel`` (with ``--signal``, only that signal); a job that has ended already is no error."""
    if not job_ids:
        return
    argv = ["scancel", *([f"--signal={signal}", "--full"] if signal else []), *job_ids]
    result = _command(argv)
    if result.returncode != 0 and "already completing or completed" not in result.stderr \
            and "Invalid job id" not in result.stderr:
        raise _failed(argv, result)
