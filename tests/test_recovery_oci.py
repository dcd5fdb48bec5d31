"""Recovery on OCI, through the real CLI and the real `oci` SDK against tests/ocisim.py, which really runs the nodes.

Per-node mode: a node whose job run fails is given a new job run for it alone (same name, the next
incarnation), by whichever command observes the failure, once however many observe it at once.
Native mode: a replica cannot be replaced alone, and the dry-run and run say so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from clirun import info_of, wait_until
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


def test_native_mode_says_a_replica_cannot_be_replaced(project):
    spec, env = project
    dry = run_cli("run", "-f", str(spec), "--dry-run", *RECOVERY, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "run would refuse: recovery without elastic needs lost nodes to be replaced, and in launchMode native" \
        in dry.stdout + dry.stderr
    refused = run_cli("run", "-f", str(spec), *RECOVERY, env=env)
    assert refused.returncode != 0 and "which cannot be replaced alone: use launchMode: perNode" in refused.stderr
    elastic = run_cli("run", "-f", str(spec), "--dry-run", "--set",
                      "spec.cluster.spec.elastic={minNodes: 2, maxNodes: 3, maxRestarts: 1}", env=env)
    assert "in launchMode native a lost replica is not replaced" in elastic.stdout + elastic.stderr
    assert "run would refuse" not in elastic.stdout + elastic.stderr
    per_node = run_cli("run", "-f", str(spec), "--dry-run", *RECOVERY, *PER_NODE, env=env)
    assert "a lost node (its job run ended before the node reported its end) gets a new job run for it alone, " \
        "up to 2 restarts" in per_node.stdout + per_node.stderr
    assert "run would refuse" not in per_node.stdout + per_node.stderr


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

    def start(dies: int, max_restarts: int, native: bool = False) -> RunInfo:
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
            container = {**job.pop("jobEnvironmentConfigurationDetails"), "cmd": [
                "python", "-c", "import os, sys; sys.exit(137 if os.environ['NODE_RANK'] == '2' else 0)"]}
            job["jobNodeConfigurationDetails"] = {
                "jobNodeType": "MULTI_NODE", "startupOrder": "IN_PARALLEL",
                "jobNetworkConfiguration": {"jobNetworkType": "DEFAULT_NETWORK"},
                "jobNodeGroupConfigurationDetailsList": [{
                    "name": "g", "replicas": 3, "minimumSuccessReplicas": 3,
                    "jobInfrastructureConfigurationDetails": {**job.pop("jobInfrastructureConfigurationDetails"),
                                                              "jobInfrastructureType": "MULTI_NODE"},
                    "jobConfigurationDetails": job.pop("jobConfigurationDetails"),
                    "jobEnvironmentConfigurationDetails": container}]}
            runs = [Request("create_job_run", "s", {"projectId": job["projectId"], "compartmentId": COMPARTMENT,
                                                    "jobId": "<id returned by create_job>", "displayName": "s"})]
            extra = {"mode": "native", "node_groups": {"g": list(NODES)}}
        ids = service.submit(service.data_science({}), "s", [Request("create_job", "s", job), *runs])
        work = tmp_path / "wd"
        for node in NODES:
            (work / "s" / "status").mkdir(parents=True, exist_ok=True)
            (work / "s" / "status" / f"{node}.json").write_text(json.dumps({"state": "running", "round": 0}))
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


def test_observers_at_once_create_one_replacement_and_cancel_and_clean_up_find_it(sim, sleepers, tmp_path):
    from launcher.backends.oci import OciBackend

    info = sleepers(dies=1, max_restarts=2)
    [lost] = [run for run in sim.runs.values() if env_of(run)["LAUNCHER_NODE_NAME"] == "w-1"]
    assert wait_until(lambda: lost.state == "FAILED", 30)
    barrier = threading.Barrier(4)
    seen: list[dict] = []

    def observe() -> None:
        barrier.wait()
        seen.append(fates_now(info))

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
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
    assert last["replaced"] is False and last["job_run"] is None
    assert fates_now(info)["w-1"].exit_code == 137 and len(created_runs(sim)) == 5  # nothing more, however often


def test_a_refused_replacement_is_said_and_recorded(sim, sleepers, tmp_path, capsys):
    info = sleepers(dies=1, max_restarts=2)
    sim.fail("POST", r"/jobRuns$", 400, "LimitExceeded", "Quota exceeded for shape VM.Standard.E4.Flex")
    seen = []
    assert wait_until(lambda: seen.append(fates_now(info)["w-1"]) or not seen[-1].running, 30)
    assert "its replacement was refused: 400 LimitExceeded: Quota exceeded" in seen[-1].reason
    assert "node w-1 was lost and OCI refused its replacement: 400 LimitExceeded" in capsys.readouterr().err
    record = json.loads((tmp_path / "wd" / "s" / "oci" / "incarnations" / "w-1.1.json").read_text())
    assert record["error"].startswith("400 LimitExceeded") and record["job_run"] is None
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
