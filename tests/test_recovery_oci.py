"""Recovery on OCI, through the real CLI and the real `oci` SDK against tests/ocisim.py, which really runs the nodes.

Per-node mode: a node whose job run fails is given a new job run for it alone (same name, the next
incarnation), by whichever command observes the failure, once however many observe it at once.
Native mode: a replica cannot be replaced alone; a job run that fails is followed by the run's next
attempt, a new job run whose nodes restore the outputs of the attempts before (launcher.runs.attempts).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clirun import Watcher, info_of, wait_until
from conftest import run_cli
import test_oci

pytestmark = pytest.mark.slow
sim, project = test_oci.sim, test_oci.project  # its fixtures: the simulation, the seed 004 project
PER_NODE = ("--set", "spec.infrastructure.spec.launchMode=perNode")
RECOVERY = ("--set", "spec.cluster.spec.recovery={maxRestarts: 2}")
VICTIM = "PyTorch-Distributed-worker-1"


def env_of(run) -> dict[str, str]:
    return run.body["jobConfigurationOverrideDetails"]["environmentVariables"]


def test_a_lost_node_gets_a_new_job_run_for_it_alone_once_however_many_observe_it(project, sim):
    spec, env = project
    sim.dying[VICTIM] = "dies_once"  # killed at its first epoch; its replacement lives
    started = run_cli("run", "-f", str(spec), "--run-id", "rec-1", *PER_NODE, *RECOVERY, "--detach",
                      "--", "--epochs", "2", env=env, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    originals = dict(sim.runs)
    assert wait_until(lambda: [run.state for run in originals.values()].count("FAILED") == 1, 120)
    # Nobody followed the run: three commands observe the failure at once, and one replacement is created.
    observers = [subprocess.Popen([sys.executable, "-m", "launcher", "status", "rec-1", "--json"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for observer in observers:
        out, err = observer.communicate(timeout=60)
        assert observer.returncode == 0 and json.loads(out)["result"] in ("running", "pending"), out + err
    done = run_cli("watch", "rec-1", env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run rec-1 succeeded" in done.stdout

    [lost] = [run for run in originals.values() if run.state == "FAILED"]
    replacements = [run for run in sim.runs.values() if run.id not in originals]
    assert env_of(lost)["LAUNCHER_NODE_NAME"] == VICTIM and "LAUNCHER_NODE_INCARNATION" not in env_of(lost)
    [replacement] = replacements  # one, for the lost node alone, as its first replacement
    assert env_of(replacement) == {**env_of(lost), "LAUNCHER_NODE_INCARNATION": "1"}
    assert replacement.state == "SUCCEEDED" and replacement.job is lost.job
    # The other nodes' job runs were never touched: created once, never cancelled, and they succeeded.
    assert {run.state for run in originals.values() if run is not lost} == {"SUCCEEDED"}
    assert not [path for method, path, _ in sim.requests if "cancelJobRun" in path]
    creates = [path for method, path, _ in sim.requests if method == "POST" and path == "/20190101/jobRuns"]
    assert len(creates) == 4

    status = json.loads(run_cli("status", "rec-1", "--json", env=env).stdout)
    assert status["result"] == "succeeded" and status["rounds"]["restarts"] == 1, status
    assert any(VICTIM in line and "exit code 137" in line for line in status["rounds"]["history"]), status
    assert status["nodes"][VICTIM]["state"] == "succeeded"  # its newest incarnation's status
    # clean-up finds the replacement too: deleteJob would delete the job only once every run ended
    info = info_of(Path(env["LAUNCHER_HOME"]), "rec-1")
    assert info["backend_ids"]["recovery"]["maxRestarts"] == 2


def test_each_mode_says_what_recovery_means_in_validate_and_the_dry_run(project):
    spec, env = project
    dry = json.loads(run_cli("run", "-f", str(spec), "--dry-run", "--output", "json", *RECOVERY, env=env).stdout)
    retried = "the nodes of an attempt fail fast and, when the job run fails, the run is retried as a whole, up to 2 " \
        "restarts: a new job run, its next attempt, whose nodes first restore the newest outputs"
    assert any(retried in note for note in dry["notes"]) and not any("would refuse" in note for note in dry["notes"])
    [group] = dry["requests"][0]["body"]["jobNodeConfigurationDetails"]["jobNodeGroupConfigurationDetailsList"]
    sent = group["jobConfigurationDetails"]["environmentVariables"]  # no rounds: the client retries the run
    assert "LAUNCHER_RECOVERY" not in sent and json.loads(sent["LAUNCHER_RETRY"])["maxRestarts"] == 2
    elastic = run_cli("run", "-f", str(spec), "--dry-run", "--set",
                      "spec.cluster.spec.elastic={minNodes: 2, maxNodes: 3, maxRestarts: 1}", env=env)
    assert "the others go on down to minNodes 2; when the job run fails all the same, the run is retried as a " \
        "whole, up to 1 restarts" in elastic.stdout and "would refuse" not in elastic.stdout
    per_node = run_cli("run", "-f", str(spec), "--dry-run", *RECOVERY, *PER_NODE, env=env)
    assert "a lost node (its job run ended before the node reported its end) gets a new job run for it alone, " \
        "up to 2 restarts" in per_node.stdout + per_node.stderr
    assert "run would refuse" not in per_node.stdout + per_node.stderr
    # validate asks no service: it says the same, and imports no SDK to do so
    recovering = spec.parent / "recovering.yaml"
    recovering.write_text(spec.read_text().replace("      workDir:",
                                                   "      recovery: {maxRestarts: 2}\n      workDir:"))
    probe = ("import sys\nfrom launcher.cli import main\ncode = main(['validate', '-f', sys.argv[1]])\n"
             "print('imported oci' if 'oci' in sys.modules else 'no SDK imported')\nsys.exit(code)")
    valid = subprocess.run([sys.executable, "-c", probe, str(recovering)], env=env, capture_output=True, text=True,
                           timeout=60)
    assert valid.returncode == 0 and "note: recovery: in launchMode native" in valid.stdout, valid.stdout + valid.stderr
    assert retried in valid.stdout
    assert valid.stdout.rstrip().endswith("no SDK imported"), valid.stdout


def test_a_native_run_that_loses_a_replica_is_retried_whole_and_resumes_from_its_checkpoint(project, sim):
    """Static native, maxRestarts 2: the replica of NODE_RANK 2 (worker-1) is killed at its epoch 2. Its peers fail
    fast, the job run fails, and `run`, following it, starts attempt 2: a new job run of the job, whose nodes restore
    attempt 1's checkpoints and go on from epoch 3. Attempt 1 keeps its record of the dead replica: the exit code
    its node group reports and its last lines from Logging (which gets them late, a few per page)."""
    spec, env = project
    test_oci.with_late_logging(spec, sim)
    sim.dying["PyTorch-Distributed#2"], sim.dies_at = "dies_once", "epoch 2/"
    done = run_cli("run", "-f", str(spec), "--run-id", "retry-1", *RECOVERY, "--", "--epochs", "3", env=env,
                   timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    before, started, after = done.stdout.partition("; attempt 2 started, restart 1 of 2: its nodes restore the outputs")
    assert started, done.stdout
    assert "run retry-1: attempt 1 ended (node PyTorch-Distributed-worker-1: OCI: node group PyTorch-Distributed " \
        "failed: Job run artifact execution failed with exit code 137." in before
    assert re.search(r"rank \d: resumed from epoch-0002.pt \(continuing at epoch 3\)", after), after
    assert "epoch 1/3" not in after and "epoch 3/3" in after
    top = "oci://runs@simns/launcher/retry-1"
    assert f"run retry-1 succeeded; outputs are in {top}/attempts/retry-1.2/outputs/\n  attempt 1: node " \
        "PyTorch-Distributed-worker-1: OCI: node group" in after
    [first, second] = sim.runs.values()
    assert (first.state, second.state, second.job) == ("FAILED", "SUCCEEDED", first.job)
    [group] = second.body["jobNodeConfigurationOverrideDetails"]["jobNodeGroupConfigurationDetailsList"]
    sent = group["jobConfigurationDetails"]["environmentVariables"]
    assert (sent["LAUNCHER_RUN_ID"], json.loads(sent["LAUNCHER_RESTORE_FROM"])) == ("retry-1.2", [top])
    status = json.loads(run_cli("status", "retry-1", "--json", env=env).stdout)
    assert status["result"] == "succeeded" and [attempt["number"] for attempt in status["attempts"]] == [2]
    cause = status["attempts"][0]["cause"]
    assert (cause["node"], cause["kind"], cause["exit_code"]) == ("PyTorch-Distributed-worker-1", "lost", 137)
    assert status["nodes"]["PyTorch-Distributed-worker-1"]["state"] == "succeeded"  # in attempt 2
    test_oci.assert_logging_searched(sim)
    dead = json.loads(sim.objects[("simns", "runs", "launcher/retry-1/status/PyTorch-Distributed-worker-1.json")][0])
    assert dead["state"] == "failed" and dead["exit_code"] == 137 and dead["last_output"], dead
    assert "node group PyTorch-Distributed failed: Job run artifact execution failed with exit code 137" in \
        dead["reason"]


def test_an_elastic_per_node_run_grows_to_3_and_shrinks_to_2_while_it_trains(project, sim, tmp_path):
    """`launcher scale` on OCI, which has no supervisor: the command creates the added node's job run itself, like
    the last node's; shrinking asks the node to leave through the work dir, and its job run ends, succeeded. With
    deleteJob, the job goes once the run has ended, with every job run it had, the added node's too."""
    from test_scale import JOB, world_sizes

    spec, env = project
    (spec.parent / "scale_job.py").write_text(JOB)
    spec.write_text(spec.read_text().replace('entryPoint: "train.py"', 'entryPoint: "scale_job.py"'))
    done = tmp_path / "done"
    started = run_cli("run", "-f", str(spec), "--run-id", "scale-1", *PER_NODE, "--detach", "--env", f"DONE={done}",
                      "--set", "spec.cluster.spec.elastic={minNodes: 2, maxNodes: 3}",
                      "--set", "spec.cluster.spec.worker.replicas=1",
                      "--set", "spec.infrastructure.spec.deleteJob=true", env=env, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    watcher = Watcher("scale-1", env)
    watcher.wait_for(r"r0\].*WORLD_SIZE=2 from epoch", timeout=120)
    added = "PyTorch-Distributed-worker-1"
    grown = run_cli("scale", "scale-1", "--nodes", "3", env=env)
    assert grown.returncode == 0 and f"started {added}" in grown.stdout, grown.stdout + grown.stderr
    info = info_of(Path(env["LAUNCHER_HOME"]), "scale-1")
    assert info["nodes"][-1] == added and info["backend_ids"]["job_runs"][added] in sim.runs
    watcher.wait_for(r"r0\].*WORLD_SIZE=3 from epoch [1-9]", timeout=120)  # resumed from its checkpoint

    before_shrink = watcher.mark()  # a round at 2 nodes can come before the one at 3 (the joiner started late)
    shrunk = run_cli("scale", "scale-1", "--nodes", "2", env=env)
    assert shrunk.returncode == 0 and f"asked {added} to leave" in shrunk.stdout, shrunk.stdout + shrunk.stderr
    watcher.wait_for(r"r0\].*WORLD_SIZE=2 from epoch [1-9]\d*$", timeout=120, since=before_shrink)
    assert world_sizes(watcher.lines) == [2, 3, 2]
    sim.fail("POST", r"/jobRuns$", 400, "LimitExceeded", "Quota exceeded for shape VM.GPU2.1")
    refused = run_cli("scale", "scale-1", "--nodes", "3", env=env)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "refused the job run for PyTorch-Distributed-worker-2: 400 LimitExceeded: Quota exceeded" in refused.stderr
    assert len(info_of(Path(env["LAUNCHER_HOME"]), "scale-1")["nodes"]) == 3  # nothing was started

    done.touch()
    code, output = watcher.finish(timeout=120)
    assert code == 0, output[-3000:]
    status = json.loads(run_cli("status", "scale-1", "--json", env=env).stdout)
    assert status["result"] == "succeeded" and status["rounds"]["restarts"] == 0, status
    assert status["nodes"][added]["state"] == "left"
    [job_run] = [run for run in sim.runs.values() if env_of(run)["LAUNCHER_NODE_NAME"] == added]
    assert json.loads(env_of(job_run)["LAUNCHER_NODE_GROUPS"])[-1] == ["PyTorch-Distributed-worker", 2]
    # how each job run ended, not whether a command happened to read it SUCCEEDED before deleteJob took it (under
    # load the job was deleted, its runs with it, before any GET served their end)
    assert len(sim.runs) == 3 and {run.ended_as for run in sim.runs.values()} == {"SUCCEEDED"}
    assert [job["lifecycleState"] for job in sim.jobs.values()] == ["DELETED"]  # deleteJob, once it ended
    assert {run.state for run in sim.runs.values()} == {"DELETED"}  # with its runs
    assert info_of(Path(env["LAUNCHER_HOME"]), "scale-1")["backend_ids"]["job_deleted"] is True


# -- what a command does when it observes a lost node, on job runs that only sleep or exit ------------------------
IMAGE = "iad.ocir.io/simns/sleeper:1"
COMPARTMENT = "ocid1.compartment.oc1..sim"
# Dies with 137 while its incarnation is below DIES, else sleeps: a node lost (DIES times), then one that lives.
SLEEPER = ("import os, sys, time; incarnation = int(os.environ.get('LAUNCHER_NODE_INCARNATION', '0'))\n"
           "sys.exit(137) if incarnation < int(os.environ['DIES']) else time.sleep(120)")
NODES = ("m", "w-0", "w-1")


@pytest.fixture
def sleepers(sim, tmp_path, monkeypatch):
    """A recovering per-node run of three sleeping job runs whose node w-1 dies ``DIES`` times; returns a function
    that starts it (w-1's DIES, maxRestarts) and gives its RunInfo, each member's status in its work dir."""
    from launcher.backends.base import Request
    from launcher.backends.oci import service
    from launcher.runs.state import RunInfo

    sim.images[IMAGE] = tmp_path
    (tmp_path / "oci").mkdir(exist_ok=True)
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAUNCHER_OCI_ENDPOINT", sim.endpoint)
    monkeypatch.setenv("OCI_CLI_CONFIG_FILE", str(sim.write_config(tmp_path / "oci")))

    def start(dies: int, max_restarts: int, native: bool = False, rounds: bool = True, sleep: bool = False) -> RunInfo:
        work = tmp_path / "wd"
        job = {"projectId": "ocid1.datascienceproject.oc1..sim", "compartmentId": COMPARTMENT, "displayName": "s",
               "jobConfigurationDetails": {"jobType": "DEFAULT", "environmentVariables": {}},
               "jobInfrastructureConfigurationDetails": {"jobInfrastructureType": "ME_STANDALONE",
                                                         "shapeName": "VM.Standard.E4.Flex",
                                                         "blockStorageSizeInGBs": 50},
               "jobEnvironmentConfigurationDetails": {"jobEnvironmentType": "OCIR_CONTAINER", "image": IMAGE,
                                                      "cmd": ["python", "-c", SLEEPER], "entrypoint": []}}
        runs = [Request("create_job_run", node, {
            "projectId": job["projectId"], "compartmentId": COMPARTMENT, "jobId": "<id returned by create_job>",
            "displayName": f"s-{node}", "jobConfigurationOverrideDetails": {
                "jobType": "DEFAULT",
                "environmentVariables": {"LAUNCHER_NODE_NAME": node, "DIES": str(dies if node == "w-1" else 0)}}})
            for node in NODES]
        extra: dict = {}
        if native:  # one job run, its nodes the replicas of one node group; the replica of NODE_RANK 2 dies
            replica = "import time; time.sleep(120)" if sleep else \
                "import os, sys; sys.exit(137 if os.environ['NODE_RANK'] == '2' else 0)"
            container = {**job.pop("jobEnvironmentConfigurationDetails"), "cmd": ["python", "-c", replica]}
            job["jobNodeConfigurationDetails"] = {
                "jobNodeType": "MULTI_NODE", "startupOrder": "IN_PARALLEL",
                "jobNetworkConfiguration": {"jobNetworkType": "DEFAULT_NETWORK"},
                "jobNodeGroupConfigurationDetailsList": [{
                    "name": "g", "replicas": 3, "minimumSuccessReplicas": 3,
                    "jobInfrastructureConfigurationDetails": {**job.pop("jobInfrastructureConfigurationDetails"),
                                                              "jobInfrastructureType": "MULTI_NODE"},
                    "jobConfigurationDetails": {"jobType": "DEFAULT", "environmentVariables": {
                        "LAUNCHER_RUN_ID": "s", "LAUNCHER_WORK_DIR": str(work)}},
                    "jobEnvironmentConfigurationDetails": container}]}
            job.pop("jobConfigurationDetails")
            runs = [Request("create_job_run", "s", {"projectId": job["projectId"], "compartmentId": COMPARTMENT,
                                                    "jobId": "<id returned by create_job>", "displayName": "s"})]
            extra = {"mode": "native", "node_groups": {"g": list(NODES)}}
        ids = service.submit(service.data_science({}), "s", [Request("create_job", "s", job), *runs])
        for node in NODES:  # without a round: the nodes of a static native attempt, which fail fast
            (work / "s" / "status").mkdir(parents=True, exist_ok=True)
            (work / "s" / "status" / f"{node}.json").write_text(json.dumps({"state": "running", "round": 0}
                                                                           if rounds else {"state": "running"}))
        return RunInfo("s", "oci", str(work), list(NODES), "", "", 0.0, path=str(tmp_path / "info.yaml"),
                       backend_ids={**ids, "mode": "perNode", "endpoints": {}, "compartment": COMPARTMENT,
                                    "delete_job": True, "recovery": {"maxRestarts": max_restarts,
                                                                     "retryOn": ["lost"], "minNodes": 2}, **extra})

    return start


def fates_now(info):
    from launcher.backends.oci import OciBackend

    return OciBackend().node_fates(info)  # a new command: nothing cached


def created_runs(sim) -> list[dict]:
    return [body for method, path, body in sim.requests if method == "POST" and path == "/20190101/jobRuns"]


def observed_at_once(info, commands: int = 4) -> list[tuple[dict, object]]:
    """The fates as ``commands`` commands that ask the service at the same instant see them, each with its own
    copy of the run's record as that command holds it after."""
    barrier = threading.Barrier(commands)
    seen: list[tuple[dict, object]] = []

    def observe() -> None:
        own = copy.deepcopy(info)
        barrier.wait()
        seen.append((fates_now(own), own))

    threads = [threading.Thread(target=observe) for _ in range(commands)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return seen


def test_observers_at_once_create_one_replacement_and_cancel_and_clean_up_find_it(sim, sleepers, tmp_path):
    from launcher.backends.oci import OciBackend

    info = sleepers(dies=1, max_restarts=2)
    [lost] = [run for run in sim.runs.values() if env_of(run)["LAUNCHER_NODE_NAME"] == "w-1"]
    assert wait_until(lambda: lost.state == "FAILED", 30)
    seen = [fates for fates, _ in observed_at_once(info)]
    reasons = sorted(fates["w-1"].reason or "" for fates in seen)
    assert all(fates["w-1"].running for fates in seen), reasons  # being replaced: never lost to the run
    assert sum(reason.startswith("replaced by job run") for reason in reasons) == 1, reasons
    [replacement] = created_runs(sim)[3:]
    assert replacement["jobConfigurationOverrideDetails"]["environmentVariables"] == \
        {"LAUNCHER_NODE_NAME": "w-1", "DIES": "1", "LAUNCHER_NODE_INCARNATION": "1"}
    assert replacement["displayName"] == "s-w-1-1"
    status = json.loads((tmp_path / "wd" / "s" / "status" / "w-1.json").read_text())
    assert status["state"] == "lost" and status["exit_code"] == 137
    assert (tmp_path / "wd" / "s" / "rounds" / "00000" / "end" / "w-1.lost.json").exists()

    new = next(run for run in sim.runs.values() if run.body is not lost.body and env_of(run).get(
        "LAUNCHER_NODE_INCARNATION") == "1")
    assert wait_until(lambda: new.state == "IN_PROGRESS", 30)
    assert sorted(OciBackend().stop(info, grace=0)) == sorted(NODES)  # the replacement, not the lost run
    cancelled = [path.split("/")[3] for method, path, _ in sim.requests if "cancelJobRun" in path]
    assert new.id in cancelled and lost.id not in cancelled
    # deleteJob: the job is deleted with every run it had, once the cancelled ones (the replacement too) ended
    assert {run.state for run in sim.runs.values()} == {"DELETED"}


def test_a_replacement_that_dies_too_is_replaced_until_the_restarts_are_spent(sim, sleepers, tmp_path):
    """Incarnations 0, 1 and 2 die (1 and 2 before writing any status of their own); maxRestarts 2: two
    replacements, then the node stays lost and its fate says it ended."""
    info = sleepers(dies=3, max_restarts=2)
    assert wait_until(lambda: not fates_now(info)["w-1"].running and
                      (tmp_path / "wd" / "s" / "oci" / "incarnations" / "w-1.3.json").exists(), 60)
    incarnations = [body["jobConfigurationOverrideDetails"]["environmentVariables"].get("LAUNCHER_NODE_INCARNATION")
                    for body in created_runs(sim)]
    assert incarnations == [None, None, None, "1", "2"]
    last = json.loads((tmp_path / "wd" / "s" / "oci" / "incarnations" / "w-1.3.json").read_text())
    assert last["replaced"] is False and last["started"] is None
    assert fates_now(info)["w-1"].exit_code == 137 and len(created_runs(sim)) == 5  # nothing more, however often


def test_a_refused_replacement_is_said_and_recorded(sim, sleepers, tmp_path, capsys):
    info = sleepers(dies=1, max_restarts=2)
    sim.fail("POST", r"/jobRuns$", 400, "LimitExceeded", "Quota exceeded for shape VM.Standard.E4.Flex")
    seen = []
    assert wait_until(lambda: seen.append(fates_now(info)["w-1"]) or not seen[-1].running, 30)
    assert "its replacement was refused: 400 LimitExceeded: Quota exceeded" in seen[-1].reason
    assert "node w-1 was lost and OCI refused its replacement: 400 LimitExceeded" in capsys.readouterr().err
    record = json.loads((tmp_path / "wd" / "s" / "oci" / "incarnations" / "w-1.1.json").read_text())
    assert record["error"].startswith("400 LimitExceeded") and record["started"] is None
    assert not fates_now(info)["w-1"].running and len(created_runs(sim)) == 3  # not tried again


def test_a_native_replica_that_died_without_reporting_is_recorded_lost_not_replaced(sim, sleepers, tmp_path):
    """Native mode, elastic: the others went on (their statuses say succeeded); the job run failed with the dead
    replica's exit code. The replica is recorded lost, so the run's result is the others' success."""
    from launcher.runs.view import read_view

    info = sleepers(dies=0, max_restarts=2, native=True)
    [run] = sim.runs.values()
    assert wait_until(lambda: run.state == "FAILED", 30)
    for node in ("m", "w-0"):
        (tmp_path / "wd" / "s" / "status" / f"{node}.json").write_text(json.dumps({"state": "succeeded", "round": 1}))
    fates = fates_now(info)
    assert not fates["w-1"].running and fates["w-1"].exit_code == 137
    status = json.loads((tmp_path / "wd" / "s" / "status" / "w-1.json").read_text())
    assert status["state"] == "lost" and (tmp_path / "wd" / "s" / "rounds" / "00000" / "end" / "w-1.lost.json").exists()
    assert len(created_runs(sim)) == 1 and read_view(info).result == "succeeded"


# -- native mode: a job run that failed is followed by the run's next attempt, a new job run -------------------------
def write_statuses(directory: Path, **records: dict) -> None:
    for node, record in records.items():
        (directory / "status" / f"{node}.json").write_text(json.dumps(record))


LOST_A_PEER = {"state": "failed", "exit_code": 1, "reason": "rank 0: RuntimeError: Connection closed by peer"}


def test_a_native_run_whose_job_run_fails_is_retried_whole_once_until_its_restarts_are_spent(sim, sleepers, tmp_path):
    """Static native: the replica of NODE_RANK 2 exits 137 in every attempt. Commands observing at once start one
    attempt 2, a job run of the same job whose node groups' env name it; when it fails too, maxRestarts 1 is spent:
    no attempt 3, and the summary says how each attempt ended."""
    from launcher.runs.view import closing_line, read_view

    info = sleepers(dies=0, max_restarts=1, native=True, rounds=False)
    [first] = sim.runs.values()
    assert wait_until(lambda: first.state == "FAILED", 30)
    top = tmp_path / "wd" / "s"
    write_statuses(top, m=LOST_A_PEER, **{"w-0": LOST_A_PEER})  # w-1 died without a word
    seen = observed_at_once(info)
    assert all(fate.running for fates, _ in seen for fate in fates.values()), seen
    assert all(own.backend_ids["attempt"]["number"] == 2 for _, own in seen)  # each reads attempt 2's records now
    [second] = created_runs(sim)[1:]
    [group] = second["jobNodeConfigurationOverrideDetails"]["jobNodeGroupConfigurationDetailsList"]
    assert group["jobConfigurationDetails"]["environmentVariables"] == {
        "LAUNCHER_RUN_ID": "s.2", "LAUNCHER_WORK_DIR": f"{top}/attempts",
        "LAUNCHER_RESTORE_FROM": json.dumps([str(top)])}
    assert (second["displayName"], second["jobId"]) == ("s.2", first.job["id"])
    record = json.loads((top / "attempts" / "2.json").read_text())
    assert (record["started"], record["restarts"], record["url"]) == (True, 1, f"{top}/attempts/s.2")
    assert (record["cause"]["node"], record["cause"]["kind"], record["cause"]["exit_code"]) == ("w-1", "lost", 137)
    assert json.loads((top / "status" / "w-1.json").read_text())["state"] == "failed"  # recorded, as watch does

    [again] = [run for run in sim.runs.values() if run is not first]
    assert wait_until(lambda: again.state == "FAILED", 30)
    assert not any(fate.running for fate in fates_now(info).values())  # its nodes wrote nothing: lost, no restart left
    last = json.loads((top / "attempts" / "3.json").read_text())
    assert not last["started"] and last["given_up"].startswith("gave up after 1 of 1 restarts: node m: OCI: node group")
    assert len(created_runs(sim)) == 2 and not fates_now(info)["m"].running and len(created_runs(sim)) == 2
    view = read_view(info)
    assert view.result == "failed" and view.statuses["m"]["state"] == "failed"  # attempt 2's records
    summary = closing_line(view)
    assert "\n  attempt 1: node w-1: OCI: node group g failed: Job run artifact execution failed with exit code 137." \
        in summary and "; retried as attempt 2 (restart 1 of 1)\n  attempt 2: gave up after 1 of 1 restarts" in summary


@pytest.mark.parametrize("case", ["not retried", "cancelled before", "refused", "cancelled meanwhile", "claim left"])
def test_an_attempt_that_is_not_started_or_refused_or_cancelled_or_left_half_made(sim, sleepers, tmp_path, capsys,
                                                                                   case):
    from launcher.backends.oci import service
    from launcher.protocol.control import record_failure, request_cancel
    from launcher.protocol.store import WorkDir
    from launcher.runs.attempts import Attempt
    from launcher.runs.view import closing_line, read_view

    info = sleepers(dies=0, max_restarts=2, native=True, rounds=False)
    [first] = sim.runs.values()
    assert wait_until(lambda: first.state == "FAILED", 30)
    top = tmp_path / "wd" / "s"
    write_statuses(top, m=LOST_A_PEER, **{"w-0": LOST_A_PEER})
    if case == "not retried":  # a failure of its own (exit status 3), and retryOn is [lost]
        record_failure(WorkDir(str(top)), "m", 0, 3, "rank 0: ValueError: bad batch")
        stopped = {"state": "failed", "exit_code": 1, "reason": "stopped because node m failed with exit code 3"}
        write_statuses(top, m={"state": "failed", "exit_code": 3, "reason": "rank 0: ValueError: bad batch"},
                       **{"w-0": stopped, "w-1": stopped})
    elif case == "cancelled before":
        request_cancel(WorkDir(str(top)))
    elif case == "refused":
        sim.fail("POST", r"/jobRuns$", 400, "LimitExceeded", "Quota exceeded for shape VM.Standard.E4.Flex")
    elif case == "cancelled meanwhile":  # a cancel arrives while the command creates the next job run
        create = sim._create_run
        sim._create_run = lambda body: request_cancel(WorkDir(str(top))) or create(body)
    else:  # the command that set out to create attempt 2's job run died before it did
        cause = {"node": "w-1", "kind": "lost", "reason": "gone", "exit_code": 137, "at": 0.0}
        (top / "attempts").mkdir()
        (top / "attempts" / "2.json").write_bytes(Attempt(2, f"{top}/attempts/s.2", cause, True, 1).to_bytes())
        (top / "attempts" / "2.start.json").write_text(json.dumps({"at": time.time()}))
        assert all(fate.running for fate in fates_now(info).values()) and len(created_runs(sim)) == 1  # it may yet
        (top / "attempts" / "2.start.json").write_text(json.dumps({"at": time.time() - 1000}))
    fates = fates_now(info)
    record = json.loads((top / "attempts" / "2.json").read_text())
    if case in ("not retried", "cancelled before"):
        assert not record["started"] and len(created_runs(sim)) == 1
        assert record["given_up"] == ("not retried (exit status 3 is not in recovery.retryOn): node m: rank 0: "
                                      "ValueError: bad batch" if case == "not retried" else
                                      "not retried: the run was cancelled (cancelled by user)")
        assert read_view(info).result == "failed"  # a cancel after the failure does not change its cause
    elif case == "refused":
        assert not fates["m"].running
        assert "attempt 2 could not be started: 400 LimitExceeded: Quota" in fates["m"].reason
        assert "note: attempt 2 of the run could not be started: 400 LimitExceeded" in capsys.readouterr().err
        assert record["error"].startswith("400 LimitExceeded") and not record["units"]
        assert not fates_now(info)["m"].running and len(created_runs(sim)) == 1  # not tried again
        assert "attempt 2 could not be started: 400 LimitExceeded" in closing_line(read_view(info))
    elif case == "cancelled meanwhile":
        [second] = [run for run in sim.runs.values() if run is not first]
        assert (top / "attempts" / "s.2" / "control" / "cancel").exists()  # its nodes stop at once
        assert f"/20190101/jobRuns/{second.id}/actions/cancelJobRun" in [path for _, path, _ in sim.requests]
        assert wait_until(lambda: second.state == "CANCELED", 30) and read_view(info).result == "cancelled"
    else:
        assert all(fate.running for fate in fates.values()) and set(record["units"].values()) <= set(sim.runs)
        assert len(created_runs(sim)) == 2 and service.token("s", "attempt/2") in sim.created_by_token


def test_the_outputs_of_every_earlier_attempt_are_restored_newest_copy_of_each(tmp_path):
    """Attempt 2 wrote a newer epoch-2 checkpoint and a log; attempt 1's epoch-1 checkpoint, which attempt 2 had
    restored and not written again, is only in attempt 1's outputs: both come back, each file's newest copy."""
    from launcher.protocol.outputs import MANIFEST, OutputsSync, restore_newest
    from launcher.protocol.store import WorkDir

    def attempt(name: str, files: dict[str, float]) -> WorkDir:
        outputs = tmp_path / name / "outputs" / "main"
        for rel, written in files.items():
            (outputs / rel).parent.mkdir(parents=True, exist_ok=True)
            (outputs / rel).write_text(f"{name} {rel}")
        (outputs / MANIFEST).write_text(json.dumps({rel: [1, written] for rel, written in files.items()}))
        return WorkDir(str(tmp_path / name))

    first = attempt("a1", {"checkpoints/epoch-1.pt": 10.0, "checkpoints/epoch-2.pt": 20.0})
    second = attempt("a2", {"checkpoints/epoch-2.pt": 30.0, "log.txt": 31.0})
    sync = OutputsSync(WorkDir(str(tmp_path / "a3")), "main", str(tmp_path / "node"))
    assert restore_newest([first, second], sync) == 3
    restored = {path.relative_to(tmp_path / "node").as_posix(): path.read_text()
                for path in (tmp_path / "node").rglob("*") if path.is_file()}
    assert restored == {"checkpoints/epoch-1.pt": "a1 checkpoints/epoch-1.pt",
                        "checkpoints/epoch-2.pt": "a2 checkpoints/epoch-2.pt", "log.txt": "a2 log.txt"}
    assert sync.sync() == 0  # restored, not this node's to upload


@pytest.mark.parametrize("then", ["its job run ends", "a cancel comes"])
def test_an_attempt_whose_nodes_all_reported_is_decided_at_once_and_started_once_its_job_run_ended(
        sim, sleepers, tmp_path, then):
    """Every node reported its failure (exit status 3, retried: retryOn [failure]) while the job run is still in
    progress: attempt 2 is decided at once, and every verb follows it, but its job run is created only once the
    first has ended, so that the two never hold machines together; a cancel before then means it never starts."""
    from launcher.protocol.control import record_failure, request_cancel
    from launcher.protocol.store import WorkDir
    from launcher.runs.view import read_view

    info = sleepers(dies=0, max_restarts=1, native=True, rounds=False, sleep=True)
    info.backend_ids["recovery"]["retryOn"] = ["failure"]
    [first] = sim.runs.values()
    assert wait_until(lambda: first.state == "IN_PROGRESS", 30)
    top = tmp_path / "wd" / "s"
    record_failure(WorkDir(str(top)), "m", 0, 3, "rank 0: ValueError: bad batch")
    stopped = {"state": "failed", "exit_code": 1, "reason": "stopped because node m failed with exit code 3"}
    write_statuses(top, m={"state": "failed", "exit_code": 3, "reason": "rank 0: ValueError: bad batch"},
                   **{"w-0": stopped, "w-1": stopped})
    assert all(fate.running for fate in fates_now(info).values())
    record = json.loads((top / "attempts" / "2.json").read_text())
    assert record["started"] and not record["units"] and record["cause"]["kind"] == "failure"
    assert len(created_runs(sim)) == 1 and read_view(info).result == "pending"  # attempt 2's namespace, empty
    if then == "a cancel comes":
        request_cancel(WorkDir(f"{top}/attempts/s.2"))
    sim._cancel(first)  # the first job run ends (its nodes had reported; here it is cancelled)
    assert wait_until(lambda: first.state == "CANCELED", 30)
    fates = fates_now(info)
    record = json.loads((top / "attempts" / "2.json").read_text())
    if then == "its job run ends":
        assert all(fate.running for fate in fates.values()) and set(record["units"].values()) <= set(sim.runs)
        assert len(created_runs(sim)) == 2
    else:
        assert record["error"] == "the run was cancelled before it started" and len(created_runs(sim)) == 1
        assert not any(fate.running for fate in fates.values()) and read_view(info).result == "failed"


@pytest.mark.parametrize("max_restarts", [2, 3])
def test_restarts_count_across_attempts_and_their_rounds_and_the_next_nodes_are_told_what_is_left(tmp_path,
                                                                                                   max_restarts):
    """Attempt 2 began with 1 restart used (its own retry); its rounds used 1 more before a node was lost for good:
    with maxRestarts 3 attempt 3 begins with 3 used, and its rounds get none; with 2 the run stops."""
    from launcher.protocol.rendezvous import Decision
    from launcher.protocol.rounds import Round, decision_key
    from launcher.protocol.store import WorkDir
    from launcher.runs.attempts import Attempt, node_env
    from launcher.runs.retries import next_attempt
    from launcher.runs.state import RunInfo
    from launcher.runs.view import RunView

    store = WorkDir(str(tmp_path / "wd" / "r" / "attempts" / "r.2"))
    store.put(decision_key(1), Round(1, Decision("m", "127.0.0.1", 1, {"m": 0, "w-0": 1}), restarts=1).to_bytes())
    info = RunInfo("r", "oci", str(tmp_path / "wd"), list(NODES), "", "", 0.0)
    lost = {"state": "lost", "reason": "OCI: node group g failed: exit code 137", "exit_code": 137, "ended_at": 5.0}
    view = RunView(info, {"w-1": lost}, None, [], None, {})
    before = Attempt(2, store.url, {"node": "w-1", "kind": "lost", "reason": "gone"}, True, restarts=1)
    recovery = {"minNodes": 2, "maxRestarts": max_restarts, "retryOn": ["lost"]}
    third = next_attempt(view, store, recovery, before)
    assert (third.number, third.url, third.cause["node"]) == (3, f"{tmp_path}/wd/r/attempts/r.3", "w-1")
    if max_restarts == 2:
        assert not third.started and third.given_up == "gave up after 2 of 2 restarts: node w-1: " + lost["reason"]
        return
    assert third.started and third.restarts == 3
    env = {"LAUNCHER_RUN_ID": "r", "LAUNCHER_WORK_DIR": "oci://b@ns/wd/", "X": "y",
           "LAUNCHER_RECOVERY": json.dumps({**recovery, "maxRestarts": 3})}
    assert node_env(env, third.number, third.restarts, max_restarts) == {
        "LAUNCHER_RUN_ID": "r.3", "LAUNCHER_WORK_DIR": "oci://b@ns/wd/r/attempts", "X": "y",
        "LAUNCHER_RESTORE_FROM": json.dumps(["oci://b@ns/wd/r", "oci://b@ns/wd/r/attempts/r.2"]),
        "LAUNCHER_RECOVERY": json.dumps({**recovery, "maxRestarts": 0, "restartsBefore": 3})}
