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
from test_oci import project, sim  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow
PER_NODE = ("--set", "spec.infrastructure.spec.launchMode=perNode")
RECOVERY = ("--set", "spec.cluster.spec.recovery={maxRestarts: 2}")
VICTIM = "PyTorch-Distributed-worker-1"


def env_of(run) -> dict[str, str]:
    return run.body["jobConfigurationOverrideDetails"]["environmentVariables"]


def test_a_lost_node_gets_a_new_job_run_for_it_alone_once_however_many_observe_it(project, sim):  # noqa: F811
    spec, env = project
    sim.dying[VICTIM] = "dies_once"  # killed at its first epoch; its replacement lives
    started = run_cli("run", "-f", str(spec), "--run-id", "rec-1", *PER_NODE, *RECOVERY, "--detach",
                      "--", "--epochs", "3", env=env, timeout=120)
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


def test_native_mode_says_a_replica_cannot_be_replaced(project):  # noqa: F811
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
