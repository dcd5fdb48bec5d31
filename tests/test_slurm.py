"""The slurm backend on a real Slurm cluster (Debian's slurmctld, three ``slurmd -N`` and munged on loopback,
started by tests/slurmcluster.py): the example trains, the dry-run is what the job ran, Slurm's own view (a
waiting job and why, a refusal, a cancel from outside) reaches the user, and an elastic run goes on without
a node whose processes were killed."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import yaml

from clirun import Watcher, init_project, is_node_bootstrap, processes_started_with, run_id_from, wait_until
from cluster import write_spec
from conftest import run_cli
from slurmcluster import slurm, slurm_cluster  # noqa: F401 - fixtures
from test_gpus import REPORT, fake_gpus  # noqa: F401 - a fixture

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def on_slurm(spec: Path, **infra) -> Path:
    """The spec, on infrastructure type slurm (with ``infra`` as its spec)."""
    data = yaml.safe_load(spec.read_text())
    data["spec"]["infrastructure"] = {"kind": "infrastructure", "type": "slurm", **({"spec": infra} if infra else {})}
    spec.write_text(yaml.safe_dump(data))
    return spec


def jobs_left(slurm) -> list[str]:
    return slurm.command("squeue", "-h", "-o", "%i %T").stdout.split("\n")[:-1]


def job_of(launcher_home: Path, run_id: str) -> str:
    info = yaml.safe_load((launcher_home / "runs" / run_id / "info.yaml").read_text())
    return info["backend_ids"]["job_id"]


def test_the_example_trains_on_three_slurm_nodes(tmp_path, launcher_home, slurm):
    spec = on_slurm(init_project(tmp_path, workers=2, epochs=2), setup=["echo setup ran on $SLURMD_NODENAME"])
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    job = job_of(launcher_home, run_id)
    digests = re.findall(r"r(\d)\] rank (\d): final parameters (\w+)", done.stdout)
    assert sorted(int(rank) for _, rank, _ in digests) == [0, 1, 2]
    assert len({digest for _, _, digest in digests}) == 1  # DDP across three Slurm nodes
    assert f"Slurm job {job}: RUNNING on n[1-3]" in done.stdout or f"Slurm job {job}: RUNNING on n1,n2,n3" in \
        done.stdout or re.search(rf"Slurm job {job}: (PENDING|RUNNING)", done.stdout), done.stdout

    status = json.loads(run_cli("status", job, "--json").stdout)  # RUN may be the Slurm job id
    assert status["run_id"] == run_id and status["result"] == "succeeded"
    names = ["pytorch-ddp-main", "pytorch-ddp-worker-0", "pytorch-ddp-worker-1"]
    assert [status["nodes"][name]["rank"] for name in names] == [0, 1, 2]  # the spec's order: SLURM_NODEID
    watch = run_cli("watch", run_id)
    assert watch.returncode == 0
    for rank, name in enumerate(names):
        assert re.search(rf"^\[{re.escape(name)}\s+r{rank}\] rank {rank}: epoch 2/2", watch.stdout, re.M), name
    outputs = tmp_path / "work_dir" / run_id / "outputs" / "pytorch-ddp-main"
    assert (outputs / "model.pt").is_file() and (outputs / "checkpoints" / "epoch-0002.pt").is_file()
    consoles = sorted((launcher_home / "runs" / run_id / "nodes").glob(f"slurm-{job}.node*.out"))
    assert [c.name for c in consoles] == [f"slurm-{job}.node{i}.out" for i in range(3)]
    assert "setup ran on n2" in consoles[1].read_text()  # the spec's setup ran in each node's task
    assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)
    shown = run_cli("status", run_id).stdout
    assert f"Slurm job {job}: COMPLETED on n[1-3]" in shown, shown


def test_the_dry_run_is_exactly_what_the_job_ran(tmp_path, launcher_home, slurm):
    spec = on_slurm(write_spec(tmp_path, "print('hello from the job')\n", nodes=2),
                    time="5:00", sbatchOptions=["--wckey=research"])
    dry = run_cli("run", "-f", str(spec), "--dry-run", "--run-id", "exact-1", "--output", "json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    (printed,) = json.loads(dry.stdout)["requests"]
    assert printed["operation"] == "sbatch" and printed["body"]["argv"][0] == "sbatch"
    assert "--time=5:00" in printed["body"]["argv"] and printed["body"]["argv"][-1] == "--wckey=research"
    done = run_cli("run", "-f", str(spec), "--run-id", "exact-1", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    job = job_of(launcher_home, "exact-1")
    ran = slurm.command("scontrol", "write", "batch_script", job, "-").stdout
    assert ran == printed["body"]["script"]
    shown = slurm.command("scontrol", "-o", "show", "job", job).stdout
    assert "JobName=launcher:exact-1 " in shown and "TimeLimit=00:05:00" in shown and "NumNodes=2" in shown


def test_a_job_that_waits_shows_why_and_fails_with_it_after_the_rendezvous_timeout(tmp_path, launcher_home, slurm):
    """Under recovery, a job that waited too long is retried whole (the queue may have cleared); its nodes, which
    never ran, are not lost."""
    spec = on_slurm(write_spec(tmp_path, "print('never')\n", nodes=2,
                               extra_cluster={"rendezvousTimeout": 15, "recovery": {"maxRestarts": 1}}),
                    sbatchOptions=["--hold"])
    watcher_env = dict(os.environ)
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    job = job_of(launcher_home, run_id)
    shown = run_cli("status", run_id).stdout
    assert f"Slurm job {job}: PENDING (JobHeldUser)" in shown, shown
    watcher = Watcher(run_id, watcher_env)
    code, output = watcher.finish(timeout=120)
    assert code == 3, output  # the backend gave the run no nodes: no node failed
    second = slurm.command("squeue", "-h", "--states=all", f"--name=launcher:{run_id}.2", "-o", "%i").stdout.strip()
    assert second, output
    assert f"run {run_id} failed before any node started\n  cause: Slurm job {second} waited" in output, output
    assert re.search(rf"Slurm job {job} waited \d+s for its nodes, longer than rendezvousTimeout \(15s\): "
                     r"PENDING \(JobHeldUser\); retried as attempt 2 \(restart 1 of 1\)", output), output
    assert " exited" not in output, output
    assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)
    shown = run_cli("status", run_id)
    assert shown.returncode == 3 and re.search(r"^t-worker-0\s+-\s+not started", shown.stdout, re.M), shown.stdout


def test_cancel_while_the_job_waits_leaves_nothing(tmp_path, launcher_home, slurm):
    spec = on_slurm(write_spec(tmp_path, "print('never')\n", nodes=2), sbatchOptions=["--hold"])
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    run_id = run_id_from(started.stdout)
    job = job_of(launcher_home, run_id)
    cancelled = run_cli("cancel", run_id, timeout=60)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"ended at once: Slurm job {job} (it still waited for nodes)" in cancelled.stdout, cancelled.stdout
    assert "did not stop" not in cancelled.stdout  # nothing was given the grace period: nothing ran
    assert not jobs_left(slurm)
    assert json.loads(run_cli("status", run_id, "--json").stdout)["result"] == "cancelled"
    shown = run_cli("status", run_id)  # no node ran: none was lost
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert re.search(r"^t-main\s+-\s+not started\s+-\s+-\s+-\s+-\s*$", shown.stdout, re.M), shown.stdout
    assert " lost " not in shown.stdout and "CANCELLED (" not in shown.stdout.split("NODE")[1], shown.stdout


def test_sbatch_refusing_the_job_is_a_clear_error_and_nothing_runs(tmp_path, launcher_home, slurm):
    spec = on_slurm(write_spec(tmp_path, "print('never')\n", nodes=2), partition="nosuchpartition")
    done = run_cli("run", "-f", str(spec), cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "sbatch failed (exit 1): sbatch: error: invalid partition specified: nosuchpartition" in done.stderr
    assert "Batch job submission failed: Invalid partition name specified" in done.stderr, done.stderr
    (info,) = (launcher_home / "runs").glob("*/info.yaml")
    assert yaml.safe_load(info.read_text())["submission"] == "failed"
    assert not jobs_left(slurm)
    shown = run_cli("status", info.parent.name)  # Slurm's words kept, not two nodes pending with no reason
    assert re.search(r"^run \S+ failed to start: sbatch failed \(exit 1\): sbatch: error: invalid partition "
                     r"specified: nosuchpartition", shown.stdout, re.M), shown.stdout
    assert re.search(r"^t-main\s+-\s+not started", shown.stdout, re.M) and "pending" not in shown.stdout, shown.stdout
    assert shown.returncode == 3, shown.stdout  # the same exit status as run's, and watch's
    said = json.loads(run_cli("status", info.parent.name, "--json").stdout)
    assert said["result"] == "failed to start" and "invalid partition" in said["submission_error"], said
    watched = run_cli("watch", info.parent.name)
    assert watched.returncode == 3 and "failed to start: sbatch failed" in watched.stdout, watched.stdout


@pytest.mark.parametrize("recovery", [None, {"maxRestarts": 2}])
def test_a_job_that_can_never_start_is_refused_in_seconds_with_slurms_reason(tmp_path, launcher_home, slurm, recovery):
    """Cancelled at once, never retried (the same job would never start either), every command exiting 3 with the
    job's reason once, and its nodes not started, not lost."""
    partition = slurm.command("scontrol", "-o", "show", "partition", "debug").stdout
    too_many = int(re.search(r"TotalNodes=(\d+)", partition)[1]) + 1
    spec = on_slurm(write_spec(tmp_path, "print('never')\n", nodes=2,
                               extra_cluster={"recovery": recovery} if recovery else None))
    started = time.monotonic()
    done = run_cli("run", "-f", str(spec), "--nodes", str(too_many), cwd=tmp_path, timeout=120)
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    run_id = run_id_from(done.stdout)
    job = job_of(launcher_home, run_id)
    # Slurm 22.05 says PartitionConfig for more nodes than the partition has, PartitionNodeLimit past its MaxNodes
    assert re.search(rf"run {run_id} failed before any node started\n  cause: Slurm job {job} can never start as "
                     r"submitted: PENDING \(Partition(Config|NodeLimit)\)", output), output
    assert " exited" not in output, output  # no node is blamed: none ran
    assert took < 30, took  # the spec's rendezvousTimeout is 600 s: not waited for
    assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)
    shown = run_cli("status", run_id)
    assert shown.returncode == 3, shown.stdout + shown.stderr
    assert f"Slurm job {job}: CANCELLED" in shown.stdout
    assert shown.stdout.count(f"Slurm job {job} can never start") == 1, shown.stdout  # the run's cause, once
    for name in ["t-main"] + [f"t-worker-{index}" for index in range(too_many - 1)]:
        assert re.search(rf"^{name}\s+-\s+not started\s+-\s+-\s+-\s+-\s*$", shown.stdout, re.M), shown.stdout
    watched = run_cli("watch", run_id)
    assert watched.returncode == 3 and "failed before any node started" in watched.stdout, watched.stdout
    assert "death seen" not in run_cli("timeline", run_id).stdout  # no node ran, so none died
    said = json.loads(run_cli("status", run_id, "--json").stdout)
    assert said["lost"] == {} and said["failures"][0]["kind"] == "never starts"
    if recovery:  # one job, and no second: the same submission would wait as the first did
        assert "not retried: the same submission can never start" in output, output
        assert "attempt 2" not in output and "node t-main" not in output, output
        assert [(attempt["number"], attempt["started"]) for attempt in said["attempts"]] == [(2, False)], said
        ever = slurm.command("squeue", "-h", "--states=all", "-o", "%j").stdout.split()
        assert f"launcher:{run_id}.2" not in ever, ever


@pytest.mark.parametrize("infra, said", [
    ({"memory": "4096G"}, "sbatch failed (exit 1)"),  # no node of the partition has that much
    ({"gpusPerNode": 1}, "the job asks for GPUs this cluster does not have"),  # asked for explicitly: refused
])
def test_memory_or_gpus_the_partition_lacks_are_refused(tmp_path, launcher_home, slurm, infra, said):
    spec = on_slurm(write_spec(tmp_path, "print('never')\n", nodes=2), **infra)
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert said in done.stderr, done.stderr
    assert not jobs_left(slurm)


@pytest.mark.parametrize("infra, where", [({}, "the default partition"), ({"partition": "debug"}, "partition debug")])
def test_processes_per_node_runs_on_cpu_where_the_partition_has_no_gpus(tmp_path, launcher_home, slurm, infra, where):
    spec = on_slurm(write_spec(tmp_path, REPORT, nodes=2, extra_cluster={"processesPerNode": 2}), **infra)
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"note: {where} has no GPUs: the job asks for none, and each node runs its 2 training processes on " \
           "CPU" in done.stderr, done.stderr
    assert sorted(re.findall(r"rank (\d) of 4 local", done.stdout)) == ["0", "1", "2", "3"], done.stdout
    submitted = yaml.safe_load((launcher_home / "runs" / run_id_from(done.stdout) / "info.yaml").read_text())
    assert not [token for token in submitted["backend_ids"]["sbatch"] if token.startswith("--gpus")], submitted


@pytest.mark.parametrize("infra", [{"partition": "nosuchpartition"}, {}])
def test_where_sinfo_cannot_say_the_gpus_processes_per_node_asks_for_are_left_to_sbatch(tmp_path, launcher_home,
                                                                                        slurm, infra):
    """An unknown partition, or an sinfo that fails: the job asks for its GPUs, and sbatch says what it thinks."""
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    if not infra:
        (fake / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\nexit 1\n")
        (fake / "sinfo").chmod(0o755)
    spec = on_slurm(write_spec(tmp_path, "print('never')\n", nodes=2, extra_cluster={"processesPerNode": 2}), **infra)
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert done.returncode == 3, done.stdout + done.stderr
    assert "has no GPUs" not in done.stderr
    # the GPUs were asked for (sbatch checks them before the partition)
    assert "sbatch failed (exit 1): sbatch: error: Invalid generic resource (gres) specification" in done.stderr, \
        done.stderr
    assert not jobs_left(slurm)


def sbatch_in_front(tmp_path: Path, after_submitting: str) -> dict[str, str]:
    """An env whose ``sbatch`` submits with the real one, then runs ``after_submitting`` (shell) instead of
    answering: the controller took the job, launcher never hears of it."""
    import shutil

    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f"#!/bin/sh\n{shutil.which('sbatch')} \"$@\" > {tmp_path}/sbatch.out\n"
                                 f"touch {tmp_path}/submitted\n{after_submitting}\n")
    (fake / "sbatch").chmod(0o755)
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}


def test_a_job_whose_sbatch_answer_was_lost_is_found_by_its_name_and_followed(tmp_path, launcher_home, slurm):
    spec = on_slurm(write_spec(tmp_path, "print('the job ran', flush=True)\n", nodes=2))
    env = sbatch_in_front(tmp_path, "echo 'sbatch: error: Batch job submission failed: Socket timed out on "
                                    "send/recv operation' >&2; exit 1")
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, env=env, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    job = (tmp_path / "sbatch.out").read_text().strip()
    assert job_of(launcher_home, run_id_from(done.stdout)) == job
    assert f"the controller had taken the job all the same: job {job}" in done.stderr, done.stderr
    assert "Socket timed out" in done.stderr and "the job ran" in done.stdout


def test_ctrl_c_while_sbatch_submits_cancels_the_job_it_submitted(tmp_path, launcher_home, slurm):
    import subprocess
    import sys

    spec = on_slurm(write_spec(tmp_path, FOREVER, nodes=2))
    release = tmp_path / "release"
    env = sbatch_in_front(tmp_path, f"while [ ! -e {release} ]; do sleep 0.05; done; cat {tmp_path}/sbatch.out")
    # as a terminal's Ctrl-C does: SIGINT to launcher's whole process group, sbatch's (before this fix) included
    run = subprocess.Popen([sys.executable, "-m", "launcher", "run", "-f", str(spec)], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert wait_until(lambda: (tmp_path / "submitted").exists() or run.poll() is not None, 60)
    os.killpg(run.pid, signal.SIGINT)
    release.touch()
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 130, output
    job = (tmp_path / "sbatch.out").read_text().strip()
    assert re.search(r"interrupted while starting run \S+: stopping what was started", output), output
    assert wait_until(lambda: not jobs_left(slurm), 30), (job, jobs_left(slurm))
    (info,) = (launcher_home / "runs").glob("*/info.yaml")
    recorded = yaml.safe_load(info.read_text())
    assert recorded["backend_ids"]["job_id"] == job, recorded
    assert json.loads(run_cli("status", recorded["run_id"], "--json").stdout)["result"] == "cancelled"


def test_without_sbatch_the_error_names_it(tmp_path, launcher_home, slurm):
    spec = on_slurm(write_spec(tmp_path, "print('never')\n", nodes=2))
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, env={**os.environ, "PATH": "/nonexistent"})
    assert done.returncode == 3
    assert "sbatch is not installed here (or not on PATH)" in done.stderr, done.stderr


FOREVER = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} training", flush=True)
for step in range(100000):
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.05)
"""


SAVES_ON_SIGTERM = """\
import os, signal, sys, time, torch, torch.distributed as dist
def save(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # Slurm's SIGTERM, then torchrun's: one snapshot
    time.sleep(0.5)  # a snapshot takes a while to write
    with open(os.path.join(os.environ["LAUNCHER_OUTPUTS_DIR"], f"snapshot-{dist.get_rank()}.txt"), "w") as out:
        out.write("saved")
    print(f"rank {dist.get_rank()} saved its snapshot", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
""" + FOREVER


def test_scancel_from_outside_ends_the_run_and_names_slurm(tmp_path, launcher_home, slurm):
    spec = on_slurm(write_spec(tmp_path, SAVES_ON_SIGTERM, nodes=2))
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, dict(os.environ))
    watcher.wait_for(r"rank 1 of 2 training")
    job = job_of(launcher_home, run_id)
    slurm.command("scancel", job)
    code, output = watcher.finish(timeout=90)
    assert code == 1, output
    assert re.search(r"\[t-main    \] \[launcher\] cancelled: received SIGTERM", output), output
    assert f"run {run_id} cancelled" in output
    assert wait_until(lambda: not jobs_left(slurm), 30)
    shown = run_cli("status", run_id).stdout
    assert f"Slurm job {job}: CANCELLED on n[1-2]" in shown, shown
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "cancelled", status
    assert {name: node["state"] for name, node in status["nodes"].items()} == \
        {"t-main": "cancelled", "t-worker-0": "cancelled"}, status  # each node recorded its own end
    outputs = tmp_path / "wd" / run_id / "outputs"
    for node, rank in (("t-main", 0), ("t-worker-0", 1)):  # what each saved on SIGTERM reached the work dir
        assert (outputs / node / f"snapshot-{rank}.txt").read_text() == "saved", output


ELASTIC_JOB = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank} of {world} round {os.environ['LAUNCHER_ROUND']}", flush=True)
steps = 60 if world == 3 else 20
for step in range(steps):
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.2)
print(f"rank {rank} of {world} done", flush=True)
dist.destroy_process_group()
"""


def start_elastic(tmp_path: Path) -> str:
    """ELASTIC_JOB on 3 Slurm nodes (min 2, 2 restarts), detached; its run id."""
    spec = on_slurm(write_spec(tmp_path, ELASTIC_JOB, nodes=3,
                               extra_cluster={"elastic": {"minNodes": 2, "maxNodes": 3, "maxRestarts": 2}}))
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    return run_id_from(started.stdout)


def _task_pids(run_id: str, node_id: int, bootstrap_only: bool = False) -> list[int]:
    """The processes of one Slurm task of the run (the node's bootstrap and what it started), by the environment
    they started with; or only its bootstrap (``python -m launcher.node``)."""
    processes = processes_started_with(LAUNCHER_RUN_ID=run_id, SLURM_NODEID=str(node_id))
    return [pid for pid, argv in processes.items() if not bootstrap_only or is_node_bootstrap(argv)]


def test_an_elastic_run_goes_on_without_a_node_whose_processes_were_killed(tmp_path, launcher_home, slurm):
    run_id = start_elastic(tmp_path)
    watcher = Watcher(run_id, dict(os.environ))
    watcher.wait_for(r"rank 2 of 3 round 0")
    pids = _task_pids(run_id, 2)  # t-worker-1: the third node in the spec's order
    assert len(pids) >= 3, pids  # its bootstrap, torchrun and its training process
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    watcher.wait_for(r"rank 1 of 2 round [1-9]", timeout=120)  # the survivors train on in a new round
    code, output = watcher.finish(timeout=120)
    assert code == 0, output
    assert re.search(r"rank 0 of 2 done", output)
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "succeeded", status
    assert wait_until(lambda: not jobs_left(slurm), 30)


def test_a_lost_node_is_started_again_as_a_one_node_job_that_joins_the_run(tmp_path, launcher_home, slurm):
    run_id = start_elastic(tmp_path)
    job = job_of(launcher_home, run_id)
    watcher = Watcher(run_id, dict(os.environ))  # the command that follows the run starts the replacement
    watcher.wait_for(r"rank 2 of 3 round 0")
    (bootstrap,) = _task_pids(run_id, 2, bootstrap_only=True)  # t-worker-1's node process, not its task's parent
    os.kill(bootstrap, signal.SIGKILL)
    mark = watcher.mark()
    # its task's parent recorded it lost at once: the others go on in the next round, with its replacement if that
    # registered in time, else without it until the round after
    watcher.wait_for(r"\[t-main    \] \[launcher\] round 1 after round 0: node t-worker-1: node process killed by "
                     r"SIGKILL: continuing with [23] nodes", since=mark)
    replacement = watcher.wait_for(r"Slurm job (\d+): \w+.* \(t-worker-1, started again\)", since=mark)
    watcher.wait_for(r"\[t-worker-1 r\d\] rank \d of 3 round [1-9]", timeout=120, since=mark)  # it trains again
    code, output = watcher.finish(timeout=120)
    assert code == 0, output
    record = json.loads((tmp_path / "wd" / run_id / "slurm" / "incarnations" / "t-worker-1.1.json").read_text())
    assert record["replaced"] and record["lost"] == job and record["started"] != job
    assert f"Slurm job {record['started']}" in replacement
    shown = slurm.command("scontrol", "-o", "show", "job", record["started"]).stdout
    assert f"JobName=launcher:{run_id}:t-worker-1.1 " in shown and re.search(r"NumNodes=1(-1)? ", shown), shown
    assert json.loads(run_cli("status", run_id, "--json").stdout)["result"] == "succeeded"
    assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)


UNTIL_DONE = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank} of {world} round {os.environ['LAUNCHER_ROUND']}", flush=True)
while True:  # every rank stops at the same step: the one where any of them saw the file
    seen = torch.tensor([1.0 if os.path.exists(os.environ["DONE"]) else 0.0])
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    if seen.item():
        break
    time.sleep(0.1)
print(f"rank {rank} of {world} done", flush=True)
dist.destroy_process_group()  # a group left to exit's destructors can abort the process (seen once in CI)
"""


def test_scale_adds_a_node_as_a_one_node_job_and_removes_it_through_the_work_dir(tmp_path, launcher_home, slurm):
    done = tmp_path / "done"
    spec = on_slurm(write_spec(tmp_path, UNTIL_DONE, nodes=2, env=[{"name": "DONE", "value": str(done)}],
                               extra_cluster={"elastic": {"minNodes": 2, "maxNodes": 3, "maxRestarts": 2}}))
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, dict(os.environ))
    watcher.wait_for(r"rank 1 of 2 round 0")
    grown = run_cli("scale", run_id, "--nodes", "3")
    assert grown.returncode == 0, grown.stdout + grown.stderr
    assert "started t-worker-1" in grown.stdout
    added = yaml.safe_load((launcher_home / "runs" / run_id / "info.yaml").read_text())["backend_ids"]["added"]
    shown = slurm.command("scontrol", "-o", "show", "job", added["t-worker-1"]).stdout
    assert f"JobName=launcher:{run_id}:t-worker-1 " in shown and re.search(r"NumNodes=1(-1)? ", shown), shown
    watcher.wait_for(r"\[t-worker-1 r2\] rank 2 of 3 round [1-9]", timeout=120)  # watch follows the added node
    assert re.search(rf"Slurm job {added['t-worker-1']}: \w+.* \(t-worker-1, added\)", run_cli("status", run_id).stdout)
    mark = watcher.mark()
    shrunk = run_cli("scale", run_id, "--nodes", "2")
    assert shrunk.returncode == 0, shrunk.stdout + shrunk.stderr
    watcher.wait_for(r"rank 1 of 2 round [2-9]", timeout=120, since=mark)
    done.touch()
    code, output = watcher.finish(timeout=120)
    assert code == 0, output
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "succeeded" and status["nodes"]["t-worker-1"]["state"] == "left"
    assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)


def test_a_node_marked_down_while_training_is_replaced_and_the_run_goes_on(tmp_path, launcher_home, slurm):
    run_id = start_elastic(tmp_path)
    watcher = Watcher(run_id, dict(os.environ))
    watcher.wait_for(r"rank 2 of 3 round 0")
    node = slurm.command("squeue", "-h", "-j", job_of(launcher_home, run_id), "-o", "%N").stdout.strip()
    down = "n3" if node in ("n[1-3]", "n1,n2,n3") else node.split(",")[-1]
    slurm.command("scontrol", "update", f"nodename={down}", "state=down", "reason=launcher-test")
    try:
        # with sbatch --no-kill the job keeps its other nodes: they meet without t-worker-1 and go on
        watcher.wait_for(r"continuing with [23] nodes \(min 2, max 3\)", timeout=120)
        # the follower saw the machine leave the job and started the node again while the run went on
        record = tmp_path / "wd" / run_id / "slurm" / "incarnations" / "t-worker-1.1.json"
        assert wait_until(record.exists, 60)
        assert json.loads(record.read_text())["replaced"]
        code, output = watcher.finish(timeout=180)
        assert code == 0, output
        assert re.search(rf"Slurm took {down} out of job \d+", output) or "round 1 after round 0: node t-worker-1" \
            in output, output
        status = json.loads(run_cli("status", run_id, "--json").stdout)
        assert status["result"] == "succeeded", status
        assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)
        run_cli("status", run_id)  # reading an ended run starts nothing
        assert not jobs_left(slurm) and not record.with_name("t-worker-1.2.json").exists()
    finally:
        slurm.resume(down)


RESUMING_JOB = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
path = os.path.join(os.environ["LAUNCHER_CHECKPOINT_DIR"], "step.pt")
start = torch.load(path)["step"] + 1 if os.path.exists(path) else 0
retried = os.environ["LAUNCHER_RUN_ID"].endswith(".2")
print(f"rank {dist.get_rank()} starts at step {start} in {os.environ['LAUNCHER_RUN_ID']}", flush=True)
for step in range(start, start + 10 if retried else 10**6):  # the first attempt trains until its time runs out
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 0 and step % 5 == 0:
        torch.save({"step": step}, path)
        print(f"saved step {step}", flush=True)
    time.sleep(0.2)
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
"""


def start_past_its_time_limit(directory: Path, script: str, **cluster) -> str:
    """``script`` on 2 Slurm nodes with a time limit of three minutes, whose notice (45 s before it, a quarter, and
    up to 30 s earlier: Slurm acts at its checks of limits) stops the attempt once it has trained, detached; its
    run id."""
    directory.mkdir()
    spec = on_slurm(write_spec(directory, script, nodes=2, extra_cluster=cluster), time=3)
    started = run_cli("run", "-f", str(spec), "--detach", cwd=directory)
    assert started.returncode == 0, started.stdout + started.stderr
    return run_id_from(started.stdout)


def test_a_job_past_its_time_limit_ends_with_timeout_named_or_is_retried_whole_and_resumes(
        tmp_path, launcher_home, slurm):
    """Two runs at once, since each waits a minute or more for Slurm. One without a time limit of its own is given
    one minute once it trains (no notice: Slurm ends it with SIGTERM at the limit, TIMEOUT): it fails naming the
    limit, and its nodes say so, not "cancelled". One with a restart and a time limit is told before it (the
    notice) and retried whole as a new job that resumes from its checkpoint."""
    (tmp_path / "ends").mkdir()
    spec = on_slurm(write_spec(tmp_path / "ends", FOREVER, nodes=2))
    ends = run_id_from(run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path / "ends").stdout)
    retried = start_past_its_time_limit(tmp_path / "retried", RESUMING_JOB, recovery={"maxRestarts": 1})
    first = job_of(launcher_home, retried)
    retried_watcher = Watcher(retried, dict(os.environ))
    watcher = Watcher(ends, dict(os.environ))
    watcher.wait_for(r"rank 1 of 2 training")
    slurm.command("scontrol", "update", f"JobId={job_of(launcher_home, ends)}", "TimeLimit=1")
    code, output = watcher.finish(timeout=240)
    assert code == 1, output
    assert f"run {ends} failed" in output and "cancelled" not in output, output
    ended = (rf"Slurm ended job {job_of(launcher_home, ends)}: "
             r"(TIMEOUT on \S+|its time limit of 1 min ran out \(TIMEOUT\))")
    assert re.search(rf"cause: {ended}", output), output
    assert re.search(rf"\[t-main +\] \[launcher\] failed: stopped: {ended}", output), output  # the node's own word
    status = json.loads(run_cli("status", ends, "--json").stdout)
    assert status["result"] == "failed" and "time limit" in status["first_failure"]["reason"], status

    retried_watcher.wait_for(rf"attempt 1 ended \(node \S+: Slurm ends job {first} at its time limit in 45s \(the "
                             r"time limit notice\)\); attempt 2 started, restart 1 of 1", timeout=240)
    code, output = retried_watcher.finish(timeout=180)
    assert code == 0, output
    assert "exit code None" not in output and "cancelled" not in output  # Slurm's time limit, not a node's failure
    saved = max(int(step) for step in re.findall(rf"saved step (\d+)", output))
    resumed = re.findall(rf"rank (\d) starts at step (\d+) in {retried}\.2", output)
    assert sorted(rank for rank, _ in resumed) == ["0", "1"] and all(int(step) > 0 for _, step in resumed), output
    status = json.loads(run_cli("status", retried, "--json").stdout)
    assert status["result"] == "succeeded" and [attempt["number"] for attempt in status["attempts"]] == [2], status
    record = json.loads((tmp_path / "retried" / "wd" / retried / "attempts" / "2.json").read_text())
    (second,) = set(record["units"].values())
    assert second != first and record["cause"]["kind"] == "lost" and saved >= 10
    shown = slurm.command("scontrol", "-o", "show", "job", second).stdout
    assert f"JobName=launcher:{retried}.2 " in shown and "NumNodes=2" in shown and "JobState=COMPLETED" in shown, shown
    assert json.loads(run_cli("status", second, "--json").stdout)["run_id"] == retried  # RUN: any job of the run
    watched = run_cli("watch", retried, "--no-follow").stdout  # every attempt's lines, each attempt's end between
    first_lines, said, second_lines = re.split(rf"^run {retried}: (attempt 1: .*retried as attempt 2.*)$", watched,
                                               flags=re.M)
    assert f"starts at step 0 in {retried}\n" in first_lines and f"in {retried}.2" in second_lines, watched
    assert f"Slurm ends job {first} at its time limit" in said
    assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)


@pytest.mark.parametrize("cluster, infra, requested", [
    ({"processesPerNode": "auto"}, {}, None),  # each node counts what it sees
    ({}, {}, None),  # no processesPerNode: one CPU process, no GPUs asked for
    ({"processesPerNode": 4}, {}, "--gpus-per-node=4"),  # one GPU per training process
    ({"processesPerNode": 4}, {"gpusPerNode": 0}, None),  # a CPU cluster: none
    ({"processesPerNode": "auto"}, {"gpusPerNode": 8}, "--gpus-per-node=8"),
])
def test_the_gpus_asked_for_follow_the_spec(tmp_path, launcher_home, cluster, infra, requested):
    spec = on_slurm(write_spec(tmp_path, REPORT, nodes=2, extra_cluster=cluster), **infra)
    dry = run_cli("run", "-f", str(spec), "--dry-run", "--output", "json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    argv = json.loads(dry.stdout)["requests"][0]["body"]["argv"]
    assert [token for token in argv if token.startswith("--gpus-per-node")] == ([requested] if requested else [])


@pytest.mark.parametrize("limit, accepted", [(0, True), ("UNLIMITED", True), ("infinite", True), ("2-12:30", True),
                                             ("forever", False), (-1, False)])
def test_the_time_limit_takes_what_sbatch_takes(tmp_path, launcher_home, limit, accepted):
    spec = on_slurm(write_spec(tmp_path, "print('x')\n", nodes=2), time=limit)
    dry = run_cli("run", "-f", str(spec), "--dry-run", "--output", "json", cwd=tmp_path)
    if accepted:
        assert f"--time={limit}" in json.loads(dry.stdout)["requests"][0]["body"]["argv"], dry.stderr
    else:
        assert dry.returncode == 2 and "must be a Slurm time limit" in dry.stderr, dry.stderr


def test_auto_counts_the_gpus_each_slurm_node_sees(tmp_path, launcher_home, slurm, fake_gpus):
    fake_gpus(2)  # the fake nvidia-smi on PATH reaches the nodes through sbatch --export=ALL
    spec = on_slurm(write_spec(tmp_path, REPORT, nodes=2, extra_cluster={"processesPerNode": "auto"}))
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = re.findall(r"rank (\d) of (\d) local (\d) of (\d) ", done.stdout)
    assert sorted(ranks) == [("0", "4", "0", "2"), ("1", "4", "1", "2"), ("2", "4", "0", "2"), ("3", "4", "1", "2")]
    assert done.stdout.count("(2 training processes, 2 GPUs; ") == 2, done.stdout  # one per GPU, on each node


def test_a_killed_node_of_a_static_run_fails_it_fast_naming_the_node(tmp_path, launcher_home, slurm):
    spec = on_slurm(write_spec(tmp_path, FOREVER, nodes=2))
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, dict(os.environ))
    watcher.wait_for(r"rank 1 of 2 training")
    (bootstrap,) = _task_pids(run_id, 1, bootstrap_only=True)
    os.kill(bootstrap, signal.SIGKILL)
    code, output = watcher.finish(timeout=60)  # its task's parent records it at once; the main stops
    assert code == 1, output
    assert re.search(rf"run {run_id} failed: node t-worker-0 (\(rank 1\) )?exited with status 137", output), output
    assert "node process killed by SIGKILL" in output
    assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)


def test_the_dry_run_masks_secrets_in_the_batch_script_and_refuses_options_launcher_sets(tmp_path, launcher_home):
    spec = on_slurm(write_spec(tmp_path, "print('x')\n", nodes=2, env=[{"name": "HF_TOKEN", "value": "hf_SECRET1"}]),
                    setup=["export WANDB_API_KEY=wandb_SECRET2"])
    dry = run_cli("run", "-f", str(spec), "--dry-run", "--env", "MY_PASSWORD=it's SECRET3", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "export HF_TOKEN=********" in dry.stdout and "SECRET" not in dry.stdout, dry.stdout
    clash = on_slurm(write_spec(tmp_path, "print('x')\n", nodes=2), sbatchOptions=["--nodes=4"])
    refused = run_cli("run", "-f", str(clash), "--dry-run", cwd=tmp_path)
    assert refused.returncode == 2
    assert "sbatchOptions: --nodes=4 would change what launcher sets itself" in refused.stderr, refused.stderr
    spaced = on_slurm(write_spec(tmp_path, "print('x')\n", nodes=2), sbatchOptions=["--mail-type END"])
    invalid = run_cli("validate", "-f", str(spaced), cwd=tmp_path)
    assert invalid.returncode == 2 and "one token per item" in invalid.stdout + invalid.stderr


def test_a_failing_setup_line_stops_the_node_saying_so(tmp_path, launcher_home, slurm):
    spec = on_slurm(write_spec(tmp_path, "print('never')\n", nodes=2, extra_cluster={"rendezvousTimeout": 8}),
                    setup=["echo preparing", "module load cuda/12.4", "echo never reached"])
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    job = job_of(launcher_home, run_id)
    console = (launcher_home / "runs" / run_id / "nodes" / f"slurm-{job}.node0.out").read_text()
    assert "launcher: the spec's setup failed on" in console and "(exit 127): module load cuda/12.4" in console
    assert "never reached" not in console
    assert wait_until(lambda: not jobs_left(slurm), 30), jobs_left(slurm)


def test_the_training_processes_start_warm_on_slurm_nodes_with_their_share_of_threads(tmp_path, launcher_home, slurm):
    """The node points gloo at its Slurm interface after its spare started: that must not cost the warm start."""
    from test_warm_start import PROBE, facts_of

    spec = on_slurm(write_spec(tmp_path, PROBE, nodes=2))  # processesPerNode auto: 1 on CPU nodes
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    facts = facts_of(tmp_path / "wd" / run_id)
    assert sorted(facts) == [0, 1] and all(said["warm"] for said in facts.values()), facts
    watched = run_cli("watch", run_id, "-v", "--no-follow").stdout
    assert "GLOO_SOCKET_IFNAME set to" in watched and "afresh" not in watched, watched
    # one node per machine: its process gets every core the node may use, as its start line says
    shares = [int(threads) for threads in re.findall(r"(\d+) threads? per process \(\d+ cores? / 1 process\)", watched)]
    assert len(shares) == 2, watched
    assert sorted(said["threads"] for said in facts.values()) == sorted(shares) == \
        sorted(int(said["omp"]) for said in facts.values())
