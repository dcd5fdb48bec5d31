"""Runs opened from their work dir where this machine has no record of them, and the example's word on
where its model is, through the real CLI."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from clirun import init_project, run_id_from
from cluster import write_spec
from conftest import run_cli
from launcher.backend_names import BACKENDS
from launcher.protocol.logship import LogShipper
from launcher.protocol.rendezvous import DECISION_KEY, Decision, Registration, register
from launcher.protocol.status import status_key
from launcher.protocol.store import WorkDir
from launcher.runs.preflight import RUN_RECORD

RANKS = {"zeta-main": 0, "alpha-worker-0": 1}  # the main sorts after its worker by name: shown in rank order


def _run_recorded_elsewhere(url: str, state: str, outputs: dict[str, bytes] | None = None) -> WorkDir:
    """A 2-node run as its nodes leave it in the work dir, submitted from another machine (no info.yaml here)."""
    run = WorkDir(url, fresh_instance=True)
    run.put(RUN_RECORD, json.dumps({"run_id": url.rsplit("/", 1)[1], "backend": "local", "nodes": 2,
                                    "created_at": time.time()}).encode())
    run.put(DECISION_KEY, Decision("zeta-main", "10.0.0.5", 29500, RANKS).to_bytes())
    for node, rank in RANKS.items():
        register(run, Registration(node, "10.0.0.5", 29500))
        run.put(status_key(node), json.dumps({"node": node, "rank": rank, "state": state, "address": "10.0.0.5",
                                              "updated_at": time.time()}).encode())
        shipper = LogShipper(run, node)
        shipper.add_many([("out", f"epoch 1 on {node}", rank)])
        shipper.flush()
    for key, data in (outputs or {}).items():
        run.put(f"outputs/zeta-main/{key}", data)
    return run


def test_a_run_opens_from_its_work_dir_url_where_it_is_not_recorded(launcher_home, s3_bucket):
    """Only the local info.yaml opened a run, so a teammate could not watch, inspect or cancel it."""
    url = f"s3://{s3_bucket}/runs/far-1"
    run = _run_recorded_elsewhere(url, "running")
    status = run_cli("status", url, "--json")
    assert status.returncode == 0, status.stderr
    assert "not recorded on this machine" in status.stderr
    shown = json.loads(status.stdout)
    assert (shown["recorded_here"], shown["result"], list(shown["nodes"])) == (False, "running", list(RANKS))
    assert "not recorded here" in run_cli("status", url + "/").stdout.splitlines()[0]
    assert "main node:    zeta-main" in run_cli("show-config", url).stdout
    watched = run_cli("watch", url, "--no-follow")
    assert watched.returncode == 0 and "r0] epoch 1 on zeta-main" in watched.stdout, watched
    cancelled = run_cli("cancel", url, "--grace", "0")
    assert cancelled.returncode == 0 and "cancel requested" in cancelled.stdout, cancelled.stderr
    assert run.get_record("control/cancel")  # the nodes, wherever they run, stop on this marker
    root = run_cli("status", f"s3://{s3_bucket}/runs")
    assert root.returncode == 2 and "a run's work dir is WORK_DIR/RUN_ID" in root.stderr, root.stderr


def test_resume_from_a_work_dir_url(tmp_path, launcher_home, s3_bucket):
    url = f"s3://{s3_bucket}/runs/far-2"
    _run_recorded_elsewhere(url, "succeeded", {"checkpoints/epoch-0001.pt": b"weights of epoch 1"})
    spec = write_spec(tmp_path, "import os, pathlib\nprint('restored:', (pathlib.Path(os.environ["
                      "'LAUNCHER_OUTPUTS_DIR']) / 'checkpoints/epoch-0001.pt').read_text(), flush=True)\n", nodes=1)
    done = run_cli("run", "-f", str(spec), "--resume-from", url, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "restored: weights of epoch 1" in done.stdout


def test_the_example_names_where_its_model_is_kept_and_its_work_dir_opens_the_run(tmp_path, launcher_home):
    """The example printed a temporary outputs path, gone once the run ended."""
    spec = init_project(tmp_path, workers=0, epochs=1)
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    saved = Path(re.search(r"model saved to (\S+)", done.stdout).group(1))
    assert saved == tmp_path / "work_dir" / run_id / "outputs" / "pytorch-ddp-main" / "model.pt"
    assert saved.is_file()
    elsewhere = {**os.environ, "LAUNCHER_HOME": str(tmp_path / "another-home")}
    status = run_cli("status", f"work_dir/{run_id}", cwd=tmp_path, env=elsewhere)
    assert status.returncode == 0 and f"run {run_id} succeeded" in status.stdout, status.stdout + status.stderr


def test_a_compose_run_still_gathering_its_nodes_opens_from_its_directory(tmp_path, launcher_home, capsys):
    """In-process: what a run.json written by `launcher compose` and a partial registration make of a run."""
    from launcher.runs.state import resolve_run

    run = WorkDir(str(tmp_path / "wd" / "c-1"))
    run.put(RUN_RECORD, json.dumps({"run_id": "c-1", "backend": "compose", "nodes": 3, "created_at": 5.0}).encode())
    register(run, Registration("c-worker-1", "10.0.0.7", 29500))
    info = resolve_run(str(tmp_path / "wd" / "c-1"))
    assert (info.backend, info.backend_ids, info.nodes, info.recorded) == ("docker", {"compose": "-"},
                                                                          ["c-worker-1"], False)
    assert "1 of its 3 nodes have registered so far" in capsys.readouterr().err


@pytest.mark.parametrize("recorded, shown", [(name, name) for name in BACKENDS] + [("compose", "docker")])
def test_status_of_a_work_dir_url_names_the_backend_its_run_json_records(tmp_path, launcher_home, recorded, shown):
    """Every backend the registry knows (and compose, a docker run) is read back as itself, never as local."""
    url = str(tmp_path / "wd" / f"run-{recorded}")
    run = _run_recorded_elsewhere(url, "running")
    run.put(RUN_RECORD, json.dumps({"run_id": f"run-{recorded}", "backend": recorded, "nodes": 2,
                                    "created_at": time.time()}).encode())
    done = run_cli("status", url, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["backend"] == shown
    assert f"run run-{recorded} ({shown}; not recorded here" in run_cli("status", url).stdout
