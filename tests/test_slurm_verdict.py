"""Slurm ending a job itself is never taken for a cancel: attempts ended by their time limit again and again on the
real cluster of tests/slurmcluster.py, the time limit's notice reaching the training processes as SIGTERM before
the limit, a checkpoint written on it resumed at exactly the next step, and the restart counts every reader says.
Then the same verdict whatever order the nodes' records and the controller's state come in."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from clirun import LiveCli, run_id_from, wait_until
from cluster import write_spec
from conftest import run_cli
from slurmcluster import slurm, slurm_cluster  # noqa: F401 - fixtures
from test_slurm import jobs_left, on_slurm

from launcher.node.engines.slurm_limit import node_grace, ranks_grace
from launcher.spec.model import parse_duration

# Each rank trains in steps; on SIGTERM it agrees with the others on the last step all of them finished (one
# all_reduce a step), saves it and exits; the next attempt starts at the step after it.
SAVES_ON_SIGTERM = """\
import os, signal, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, run = dist.get_rank(), os.environ["LAUNCHER_RUN_ID"]
path = os.path.join(os.environ["LAUNCHER_CHECKPOINT_DIR"], f"rank{rank}.pt")
step = torch.load(path)["step"] + 1 if os.path.exists(path) else 0
print(f"rank {rank} starts at step {step} in {run}", flush=True)
told = []
signal.signal(signal.SIGTERM, lambda *_: told.append(time.time()))
while True:
    stop = torch.tensor([float(bool(told))])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item():
        break
    time.sleep(0.1)
    step += 1
scratch = os.path.join(os.path.dirname(path), f".rank{rank}.pt")  # a dot-name is never synced: no torn file
torch.save({"step": step - 1}, scratch)
os.replace(scratch, path)
deadline = time.time() + 30
while not told and time.time() < deadline:  # the others' SIGTERM came first: its own follows
    time.sleep(0.05)
print(f"rank {rank} got SIGTERM at {told[0] if told else 0:.3f} in {run}: saved step {step - 1}", flush=True)
sys.exit(0)
"""
MAX_RESTARTS = 2  # three attempts, each ended by its time limit


def _attempt_job(slurm, name: str) -> str:
    """The id of the job named ``name`` (an attempt's own: launcher:RUN or launcher:RUN.N)."""
    shown = slurm.command("squeue", "-h", f"--name={name}", "-o", "%i").stdout.split()
    assert len(shown) == 1, shown
    return shown[0]


def _bring_limit_near(slurm, job: str) -> None:
    """Set the running job's limit one to two minutes ahead (whole minutes: Slurm's): its notice (120 s) is due at
    once, Slurm sends it at its next check, and the limit itself is not reached first."""
    ran = re.search(r"RunTime=(\S+)", slurm.command("scontrol", "-o", "show", "job", job).stdout).group(1)
    days, _, clock = ran.rpartition("-")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    elapsed = int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    slurm.command("scontrol", "update", f"JobId={job}", f"TimeLimit={elapsed // 60 + 2}")


def _end_time(slurm, job: str) -> float:
    """When the job's time limit comes, as the controller says (its local time, whole seconds)."""
    end = re.search(r"EndTime=(\S+)", slurm.command("scontrol", "-o", "show", "job", job).stdout).group(1)
    return datetime.fromisoformat(end).timestamp()


@pytest.mark.slow
@pytest.mark.xdist_group("slurm")
def test_attempts_ended_by_their_time_limit_again_and_again_are_never_cancelled_and_resume_at_the_next_step(
        tmp_path, launcher_home, slurm):
    """A recovering run whose every attempt is ended by its time limit: its nodes are told ahead (the notice, 120 s
    before the limit, which the test brings near with scontrol update TimeLimit), its ranks get SIGTERM before the limit and save,
    the `run` that follows it retries it, once per attempt, and each attempt starts at the step after the saved
    one; the last fails naming the time limit. Nowhere "cancelled"; `run`, `watch` and `status` say the same."""
    spec = on_slurm(write_spec(tmp_path, SAVES_ON_SIGTERM, nodes=2,
                               extra_cluster={"recovery": {"maxRestarts": MAX_RESTARTS}}), time=10)
    run = LiveCli(["run", "-f", str(spec)], dict(os.environ), cwd=tmp_path)
    run_id = run_id_from(run.wait_for(r"^run \S+: 2 nodes on slurm"))
    limits: dict[str, float] = {}
    for number in range(1, MAX_RESTARTS + 2):
        namespace = run_id if number == 1 else f"{run_id}.{number}"
        run.wait_for(rf"rank 1 starts at step \d+ in {re.escape(namespace)}$", timeout=180)
        job = _attempt_job(slurm, f"launcher:{namespace}")
        _bring_limit_near(slurm, job)
        limits[namespace] = _end_time(slurm, job)
        run.wait_for(rf"rank 1 got SIGTERM at [\d.]+ in {re.escape(namespace)}:", timeout=120)
    code, output = run.finish(timeout=180)

    assert code == 1 and "cancel" not in output.lower(), output
    assert re.search(rf"^run {run_id} failed: node \S+ exited\n  cause: Slurm ends job \d+ at its time limit in 120s "
                     r"\(the time limit notice\)", output, re.M), output
    for namespace, limit in limits.items():  # the notice reached every rank as SIGTERM before the limit
        told = [float(at) for at in re.findall(rf"got SIGTERM at ([\d.]+) in {re.escape(namespace)}:", output)]
        assert len(told) == 2 and all(0 < at < limit for at in told), (namespace, told, limit)
        assert re.search(rf"time limit: Slurm ends job \d+ at its time limit in 120s", output), output
    saved = {(namespace, int(rank)): int(step) for rank, namespace, step in
             re.findall(r"rank (\d) got SIGTERM at [\d.]+ in (\S+): saved step (\d+)", output)}
    starts = {(namespace, int(rank)): int(step) for rank, step, namespace in
              re.findall(r"rank (\d) starts at step (\d+) in (\S+)$", output, re.M)}
    for number in range(2, MAX_RESTARTS + 2):  # exactly the next step: none lost, none done twice
        before = run_id if number == 2 else f"{run_id}.{number - 1}"
        for rank in (0, 1):
            assert starts[(f"{run_id}.{number}", rank)] == saved[(before, rank)] + 1 > 1, (starts, saved)
        # the nodes' count is the run's: "1 restart so far" beside "restart 1 of 2"
        assert re.search(rf"attempt {number} started, restart {number - 1} of {MAX_RESTARTS}", output), output
        assert re.search(rf"in round 0 \({number - 1} restarts? so far\)", output), output
    retried = re.findall(r"attempt (\d): node \S+: Slurm ends job \d+ at its time limit in 120s \(the time limit "
                         rf"notice\); retried as attempt (\d) \(restart (\d) of {MAX_RESTARTS}\)", output)
    assert retried == [("1", "2", "1"), ("2", "3", "2")], output  # each attempt retried exactly once

    closing = output[output.index(f"run {run_id} failed"):]
    watched = run_cli("watch", run_id, "--no-follow")
    assert watched.returncode == 1 and watched.stdout.endswith(closing + "\n"), watched.stdout[-2000:]
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "failed" and "time limit" in status["first_failure"]["reason"], status
    assert [attempt["number"] for attempt in status["attempts"]] == [2, 3, 4], status
    assert "cancel" not in run_cli("status", run_id).stdout.lower()
    assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)


@pytest.mark.slow
@pytest.mark.xdist_group("slurm")
def test_a_one_minute_job_trains_until_its_notice_stands_for_even_when_slurm_signals_early(
        tmp_path, launcher_home, slurm):
    """A 1-minute job with a 10 s notice; Slurm may send the signal up to 60 s early (it did, 26 s into a job). The
    ranks are told at EndTime - 10 s, not when the signal comes: the job trains all but its notice and its start
    (which took up to 7 s in a loaded suite)."""
    spec = on_slurm(write_spec(tmp_path, SAVES_ON_SIGTERM, nodes=2), time=1, timeLimitNotice="10s")
    run = LiveCli(["run", "-f", str(spec)], dict(os.environ), cwd=tmp_path)
    run_id = run_id_from(run.wait_for(r"^run \S+: 2 nodes on slurm"))
    run.wait_for(rf"rank 0 starts at step 0 in {re.escape(run_id)}$", timeout=120)
    began = time.time()  # training began (within the follower's 0.25 s)
    job = _attempt_job(slurm, f"launcher:{run_id}")
    limit = _end_time(slurm, job)
    told_line = run.wait_for(rf"rank 0 got SIGTERM at [\d.]+ in {re.escape(run_id)}:", timeout=120)
    told = float(re.search(r"got SIGTERM at ([\d.]+)", told_line).group(1))
    code, output = run.finish(timeout=120)
    assert limit - 10 - 2 <= told < limit, (told, limit, output[-3000:])  # at the time the notice stands for
    assert told - began >= 40, (told - began, output[-3000:])  # 60 s, less its start and its notice
    assert "cancel" not in output.lower(), output


@pytest.mark.parametrize("limit, notice, asked", [
    ("10", None, "--signal=USR1@120"),  # the default: 120 s
    (1, None, "--signal=USR1@15"),  # a quarter of a one-minute limit, not 120 s: the job is not stopped as it starts
    ("2-00:00:00", "10m", "--signal=USR1@600"),
    ("1:30:00", 3600, "--signal=USR1@1350"),
    ("UNLIMITED", None, None), (0, None, None), (None, None, None),  # no limit: no notice
])
def test_the_time_limit_notice_is_asked_of_slurm_and_told_to_the_nodes(tmp_path, launcher_home, limit, notice, asked):
    infra = {**({"time": limit} if limit is not None else {}), **({"timeLimitNotice": notice} if notice else {})}
    spec = on_slurm(write_spec(tmp_path, "print('x')\n", nodes=2), **infra)
    dry = run_cli("run", "-f", str(spec), "--dry-run", "--output", "json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    body = json.loads(dry.stdout)["requests"][0]["body"]
    assert [token for token in body["argv"] if token.startswith("--signal")] == ([asked] if asked else [])
    seconds = asked.rsplit("@", 1)[1] if asked else None
    exported = re.findall(r"^export LAUNCHER_TIME_LIMIT_NOTICE=(\d+)$", body["script"], re.M)
    assert exported == ([seconds] if seconds else []), body["script"]
    capped = [note for note in json.loads(dry.stdout)["notes"] if note.startswith("timeLimitNotice:")]
    asked_notice = parse_duration(notice if notice is not None else 120)
    assert capped == ([f"timeLimitNotice: the nodes are told {seconds}s before the time limit, not {asked_notice}s: "
                       f"the notice is at most a quarter of the job's time ({limit}), so that it never stops a job as "
                       "it starts"] if seconds and int(seconds) < asked_notice else []), capped


@pytest.mark.parametrize("notice", [10, 15, 20, 120, 601])
def test_the_nodes_wait_for_training_stays_within_the_notice_and_leaves_time_to_sync(notice):
    assert 0 < ranks_grace(notice) < node_grace(notice) <= notice - notice * 0.15, (ranks_grace(notice),
                                                                                     node_grace(notice))


def test_a_time_limit_notice_that_is_not_a_duration_is_refused_where_it_is_written(tmp_path, launcher_home):
    spec = on_slurm(write_spec(tmp_path, "print('x')\n", nodes=2), time=10, timeLimitNotice="soon")
    dry = run_cli("run", "-f", str(spec), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 2 and re.search(r"train.yaml:\d+:\d+: spec.infrastructure.spec.timeLimitNotice: must be "
                                             r"a duration", dry.stderr), dry.stderr


NODES = ["t-main", "t-worker-0"]


def _view(tmp_path: Path, statuses: dict, fates: dict, failures: list | None = None, cancel: dict | None = None):
    from launcher.runs.state import RunInfo
    from launcher.runs.view import RunView

    info = RunInfo("r", "slurm", str(tmp_path / "wd"), list(NODES), "", "", 0.0)
    return RunView(info, statuses, None, failures or [], cancel, fates)


def test_nodes_that_say_cancelled_with_no_cancel_on_record_wait_for_slurm_to_say_why(tmp_path):
    """The nodes' records first (a SIGTERM, no cancel marker), the controller's state after: no verdict until the job
    has ended, and then Slurm's reason (recorded before the fates say the job ended) is the run's cause; a cancel the
    user asked for is a cancel in either order."""
    from launcher.backends.base import NodeFate

    signalled = {name: {"state": "cancelled", "reason": "received SIGTERM", "exit_code": 130} for name in NODES}
    ending = {name: NodeFate(True) for name in NODES}  # the job is COMPLETING: Slurm has not said why yet
    assert not _view(tmp_path, signalled, ending).ended
    ended = {name: NodeFate(False, None, "Slurm: job 7 TIMEOUT on n[1-2]") for name in NODES}
    timeout = {"node": "t-main", "reason": "Slurm ended job 7: its time limit of 1 min ran out (TIMEOUT)",
               "kind": "lost", "at": 1.0, "reported_by": "slurm"}
    view = _view(tmp_path, signalled, ended, [timeout])
    assert view.ended and view.result == "failed" and view.root_failure() == timeout
    user = {"reason": "cancelled by user", "at": 2.0}
    assert _view(tmp_path, signalled, ending, cancel=user).result == "cancelled"
    assert _view(tmp_path, signalled, ended, cancel=user).result == "cancelled"
    told = {**signalled, "t-main": {"state": "failed", "reason": f"stopped: {timeout['reason']}", "exit_code": 1}}
    assert not _view(tmp_path, told, ending, [timeout]).ended  # t-worker-0 still waits for Slurm's word


def test_a_node_signalled_without_a_cancel_asks_slurm_and_records_its_time_limit(tmp_path, monkeypatch):
    """A SIGTERM with no cancel marker behind it on Slurm: the controller's TIMEOUT is the node's end, recorded once
    for every reader; CANCELLED (a scancel) and a controller that cannot answer leave it a cancel."""
    import signal

    from launcher.backends.slurm import engine
    from launcher.errors import BackendError
    from launcher.node import sigterm
    from launcher.protocol import control
    from launcher.protocol.store import WorkDir

    run = WorkDir(str(tmp_path / "run"))
    monkeypatch.setenv(sigterm.SLURM_JOB, "7")
    monkeypatch.setenv("LAUNCHER_NODE_NAME", "t-worker-0")
    answers = {"7": engine.Job("7", "COMPLETING", "TimeLimit", "n[1-2]", None, None, time_limit=60.0)}

    def show_job(job_id):
        if job_id not in answers:
            raise BackendError("scontrol failed (exit 1): Unable to contact slurm controller")
        return answers[job_id]

    monkeypatch.setattr(engine, "show_job", show_job)
    settled = sigterm.settle_signal(run, signal.SIGTERM, "cancelled", "received SIGTERM", 130)
    assert settled == ("failed", "stopped: Slurm ended job 7: its time limit of 1 min ran out (TIMEOUT)", 1)
    record = run.get_record(control.engine_end_key("7"))
    assert record["kind"] == "lost" and record["node"] == "t-worker-0" and "time limit" in record["reason"]

    answers["7"] = engine.Job("7", "CANCELLED", "None", "n[1-2]", None, None)
    assert sigterm.settle_signal(run, signal.SIGTERM, "cancelled", "received SIGTERM", 130)[0] == "cancelled"
    answers.clear()
    assert sigterm.settle_signal(run, signal.SIGTERM, "cancelled", "received SIGTERM", 130)[0] == "cancelled"
    answers["7"] = engine.Job("7", "TIMEOUT", "TimeLimit", "n[1-2]", None, None, time_limit=60.0)
    control.request_cancel(run)  # the user's cancel came first: it stands
    assert sigterm.settle_signal(run, signal.SIGTERM, "cancelled", "received SIGTERM", 130)[0] == "cancelled"
