"""Recovery and scaling on the docker backend, through the real CLI on the real engine: `docker kill` of a node's
container mid-training; the run goes on, the supervisor starts a new container for that node (a new incarnation)
that joins, and nothing of the run is left on the engine afterwards; `launcher scale` 2 -> 3 -> 2.

The nodes run the test base image with this checkout's launcher package and the job mounted (no image
build): the job is tests/test_recovery.py's, whose final weights show that every epoch ran exactly once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml

from clirun import Watcher, info_of, run_id_from, wait_until
from cluster import write_spec
from conftest import REPO, run_cli
from test_recovery import ELASTIC, EXPECTED, JOB, final_weights
from test_scale import JOB as ENDLESS_JOB
from test_scale import members, world_sizes

pytestmark = pytest.mark.slow


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60, check=True).stdout


def run_containers(run_id: str) -> list[str]:
    return docker("ps", "-aq", "--filter", f"label=launcher.run-id={run_id}").split()


def docker_spec(directory: Path, image: str, nodes: int, cluster: dict, script: str = JOB,
                env: tuple[dict, ...] = ()) -> Path:
    """write_spec's job on the docker backend: the base image, with the launcher package and ``directory``
    (the job) mounted at /code."""
    spec_path = write_spec(directory, script, nodes=nodes, extra_cluster=cluster, entry={"entryPoint": "/code/job.py"},
                           env=[{"name": "PYTHONPATH", "value": "/opt/launcher"}, *env])
    spec = yaml.safe_load(spec_path.read_text())
    spec["spec"]["infrastructure"] = {"kind": "infrastructure", "type": "docker", "spec": {
        "volumes": [f"{REPO / 'launcher'}:/opt/launcher/launcher:ro", f"{directory}:/code:ro"]}}
    spec["spec"]["cluster"]["spec"]["image"] = image
    spec_path.write_text(yaml.safe_dump(spec))
    return spec_path


def start(directory: Path, image: str, nodes: int, cluster: dict) -> tuple[str, Watcher]:
    started = run_cli("run", "-f", str(docker_spec(directory, image, nodes, cluster)), "--detach", cwd=directory)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    return run_id, Watcher(run_id, dict(os.environ))


def kill_container(run_id: str, node: str) -> None:
    [container] = docker("ps", "-q", "--filter", f"label=launcher.run-id={run_id}",
                         "--filter", f"label=launcher.node={node}").split()
    docker("kill", container)


@pytest.mark.parametrize("nodes, cluster, victim", [
    (3, ELASTIC, "t-worker-1"),  # elastic: the survivors go on, the replacement joins them
    (2, {"recovery": {"maxRestarts": 1}}, "t-worker-0"),  # static: the next round waits for the replacement
])
def test_a_killed_container_is_replaced_and_the_run_succeeds(tmp_path, launcher_home, node_base_image, nodes,
                                                              cluster, victim):
    run_id, watcher = start(tmp_path, node_base_image, nodes, cluster)
    watcher.wait_for(r"rank 0: epoch 6\b", timeout=120)
    killed = time.time()
    kill_container(run_id, victim)
    code, output = watcher.finish(timeout=240)
    assert code == 0, output[-4000:]
    assert f"node {victim} lost: node container was killed (SIGKILL, exit 137" in output
    # The replacement (it joins the next round, or the running one if that formed without it) trained from the
    # checkpoint, under the node's own name and hostname, in the node's new container.
    resumed = re.findall(rf"\[{victim}\s+r\d\] rank \d of \d: resuming after epoch (\d+)", output)
    assert resumed and int(resumed[-1]) >= 5, output[-4000:]
    record = json.loads((tmp_path / "wd" / run_id / "status" / f"{victim}.json").read_text())
    assert record["started_at"] > killed and record["host"] == victim and record["state"] == "succeeded"
    supervisor = json.loads((launcher_home / "runs" / run_id / "supervisor.json").read_text())
    first = yaml.safe_load((launcher_home / "runs" / run_id / "info.yaml").read_text())["backend_ids"]["containers"]
    assert supervisor["containers"][victim] != first[victim]
    assert f"node {victim} replaced ({supervisor['containers'][victim][:12]}, replacement 1)" in \
        (launcher_home / "runs" / run_id / "supervisor.log").read_text()
    assert torch.allclose(final_weights(tmp_path, run_id), torch.full((4,), EXPECTED), atol=1e-5)
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "succeeded" and status["rounds"]["restarts"] == 1
    assert any(f"node {victim}: node container was killed" in line for line in status["rounds"]["history"]), status
    assert run_containers(run_id) == []  # the dead container and its replacement were both removed


def test_a_replacement_the_engine_refuses_leaves_the_run_to_the_survivors(tmp_path, launcher_home, node_base_image):
    """The replacement's name is taken (the engine answers 409): the supervisor says so and records the node's
    end; the elastic run goes on with the 2 survivors and succeeds."""
    run_id = "refused-replacement-1"
    squatter = docker("create", "--name", f"{run_id}-t-worker-1-r1", node_base_image, "true").strip()
    try:
        started = run_cli("run", "-f", str(docker_spec(tmp_path, node_base_image, 3, ELASTIC)), "--detach",
                          "--run-id", run_id, cwd=tmp_path)
        assert started.returncode == 0, started.stdout + started.stderr
        watcher = Watcher(run_id, dict(os.environ))
        watcher.wait_for(r"rank 0: epoch 6\b", timeout=120)
        kill_container(run_id, "t-worker-1")
        code, output = watcher.finish(timeout=240)
    finally:
        docker("rm", "-f", squatter)
    assert code == 0, output[-4000:]
    assert re.search(r"continuing with 2 nodes \(min 2, max 3\)", output), output[-4000:]
    log = (launcher_home / "runs" / run_id / "supervisor.log").read_text()
    assert "could not replace node t-worker-1: the Docker engine refused its new container" in log
    assert "Conflict" in log or "already in use" in log, log
    lost = json.loads((tmp_path / "wd" / run_id / "rounds" / "00000" / "end" / "t-worker-1.lost.json").read_text())
    assert lost["replaced"] is False  # the survivors' round stopped waiting for a replacement that never came
    exit_record = json.loads((launcher_home / "runs" / run_id / "nodes" / "t-worker-1.exit.json").read_text())
    assert exit_record["exit_code"] == 137
    assert torch.allclose(final_weights(tmp_path, run_id), torch.full((4,), EXPECTED), atol=1e-5)
    assert run_containers(run_id) == []


@pytest.mark.parametrize("ending", ["restarts used up", "too few nodes left"])
def test_a_run_that_can_no_longer_recover_fails_at_once_naming_the_lost_node(tmp_path, launcher_home,
                                                                             node_base_image, ending):
    """A static run of 2 with one restart: its worker killed twice, or once where its replacement cannot be
    started (its container name is taken). The main stops within seconds, not at the 600 s rendezvous timeout,
    and the run's cause names the node that was lost."""
    run_id = f"cannot-recover-{'used-up' if ending == 'restarts used up' else 'too-few'}"
    squatter = docker("create", "--name", f"{run_id}-t-worker-0-r1", node_base_image, "true").strip() \
        if ending == "too few nodes left" else None
    try:
        spec = docker_spec(tmp_path, node_base_image, 2, {"recovery": {"maxRestarts": 1}})
        started = run_cli("run", "-f", str(spec), "--detach", "--run-id", run_id, cwd=tmp_path)
        assert started.returncode == 0, started.stdout + started.stderr
        watcher = Watcher(run_id, dict(os.environ))
        watcher.wait_for(r"rank 0: epoch 3\b", timeout=120)
        kill_container(run_id, "t-worker-0")
        if squatter is None:
            resumed = watcher.wait_for(r"restart 1 of 1", timeout=120)
            watcher.wait_for(r"rank 0: epoch \d+", timeout=120, since=watcher.lines.index(resumed))
            kill_container(run_id, "t-worker-0")
        killed = time.monotonic()
        code, output = watcher.finish(timeout=120)
    finally:
        if squatter:
            docker("rm", "-f", squatter)
    assert code == 1 and time.monotonic() - killed < 45, output[-4000:]
    summary = output[output.rindex("\nrun "):]
    lost = "node t-worker-0: node container was killed (SIGKILL, exit 137"
    said = f"gave up after 1 of 1 restarts: {lost}" if squatter is None else \
        ("round 1 cannot start: 1 node left (t-main), fewer than recovery.minNodes (2), and no replacement is "
         f"coming: {lost}")
    assert f"cause: {said}" in summary, summary
    assert "rendezvous timed out" not in output
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "failed" and status["nodes"]["t-main"]["state"] == "failed", status
    assert status["rounds"]["give_up"].startswith(said), status["rounds"]
    assert run_containers(run_id) == []


def test_take_over_follows_a_replaced_nodes_newest_container(docker_engine, node_base_image):
    """Without a supervisor, the verbs judge a replaced node by its newest container, not its dead first one."""
    import docker as docker_sdk

    from launcher.backends.docker.launch import node_containers, remove_run

    client = docker_sdk.from_env()
    run_id = "take-over-newest-1"
    labels = {"launcher.run-id": run_id, "launcher.node": "n"}
    try:
        client.containers.create(node_base_image, ["true"], name=f"{run_id}-n", labels=labels)
        newest = client.containers.create(node_base_image, ["true"], name=f"{run_id}-n-r2",
                                          labels={**labels, "launcher.incarnation": "2"})
        client.containers.create(node_base_image, ["true"], name=f"{run_id}-n-r1",
                                 labels={**labels, "launcher.incarnation": "1"})
        assert {name: c.id for name, c in node_containers(client, run_id).items()} == {"n": newest.id}
    finally:
        remove_run(client, run_id)
    assert run_containers(run_id) == []


def test_scale_adds_a_container_and_the_node_asked_to_leave_ends(tmp_path, launcher_home, node_base_image):
    done = tmp_path / "done"
    spec = docker_spec(tmp_path, node_base_image, 2, {"elastic": {"minNodes": 2, "maxNodes": 3}}, ENDLESS_JOB,
                       ({"name": "DONE", "value": "/code/done"},))
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, dict(os.environ))
    try:
        watcher.wait_for(r"r0\].*WORLD_SIZE=2 from epoch", timeout=60)
        grown = run_cli("scale", run_id, "--nodes", "3")
        assert grown.returncode == 0, grown.stdout + grown.stderr
        assert "started t-worker-1" in grown.stdout
        assert "t-worker-1" in info_of(launcher_home, run_id)["nodes"]
        assert docker("ps", "-q", "--filter", f"name={run_id}-t-worker-1", "--filter", "label=launcher.node=t-worker-1")
        assert wait_until(lambda: members(tmp_path, run_id) == ["t-main", "t-worker-0", "t-worker-1"], 60)
        watcher.wait_for(r"r0\].*WORLD_SIZE=3 from epoch [1-9]", timeout=60)  # resumed from its checkpoint
        shrunk = run_cli("scale", run_id, "--nodes", "2")
        assert shrunk.returncode == 0, shrunk.stdout + shrunk.stderr
        assert "asked t-worker-1 to leave" in shrunk.stdout
        assert wait_until(lambda: members(tmp_path, run_id) == ["t-main", "t-worker-0"], 60)
        watcher.wait_for(r"r0\].*WORLD_SIZE=2 from epoch [1-9]\d*$", timeout=60)
        assert world_sizes(watcher.lines) == [2, 3, 2]
    finally:
        done.touch()
    code, output = watcher.finish(timeout=60)
    assert code == 0, output[-3000:]
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "succeeded" and status["rounds"]["restarts"] == 0
    left = json.loads((tmp_path / "wd" / run_id / "status" / "t-worker-1.json").read_text())
    assert left["state"] == "left" and left["exit_code"] == 0, left
    assert run_containers(run_id) == []


def test_scale_refuses_without_a_supervisor_and_reports_one_that_does_not_start_the_nodes(tmp_path):
    from launcher.backends.docker import DockerBackend
    from launcher.backends.docker.supervisor import SUPERVISOR_FILE
    from launcher.errors import BackendError
    from launcher.runs.state import RunInfo
    from launcher.runs.supervision import ProcessRef

    info = RunInfo("r", "docker", str(tmp_path), ["t-main", "t-worker-0"], "", "", 0.0,
                   path=str(tmp_path / "info.yaml"))
    assert "its supervisor" in DockerBackend().scale_problem(info)
    deaf = subprocess.Popen([sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGUSR1, "
                             "signal.SIG_IGN); print(flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        deaf.stdout.readline()  # it ignores SIGUSR1 from here on
        (tmp_path / SUPERVISOR_FILE).write_text(json.dumps({"supervisor": asdict(ProcessRef.of(deaf.pid)),
                                                             "containers": {"t-main": "a", "t-worker-0": "b"}}))
        assert DockerBackend().scale_problem(info) is None
        with pytest.raises(BackendError, match=f"did not start t-worker-1 within 0.3s; see {tmp_path}/supervisor.log"):
            DockerBackend().scale(info, ["t-worker-1"], timeout=0.3)
    finally:
        deaf.kill()
        deaf.wait()
