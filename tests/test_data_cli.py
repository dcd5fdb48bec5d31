"""launcher.data through the real CLI and real torchrun: in an elastic run (3 nodes, min 2) a worker node and
later the main node are killed mid-epoch; every epoch of the model lineage trained each index exactly once
(the job's model counts them, tests/jobs/data_job.py), and `launcher data --json` shows every shard done."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from clirun import Watcher, run_id_from
from cluster import write_spec
from conftest import run_cli
from launcher.node.store import WorkDir
from test_recovery import ELASTIC, node_pid

pytestmark = pytest.mark.slow

JOB = (Path(__file__).parent / "jobs" / "data_job.py").read_text()
N, EPOCHS = 480, 5


def run_with_kills(tmp_path: Path, home: Path, work_dir: str, workers: int) -> str:
    env = [{"name": "DATA_WORKERS", "value": str(workers)}, {"name": "DATA_N", "value": str(N)},
           {"name": "DATA_EPOCHS", "value": str(EPOCHS)}]
    spec = write_spec(tmp_path, JOB, nodes=3, work_dir=work_dir, extra_cluster=ELASTIC, env=env)
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, dict(os.environ))
    watcher.wait_for(r"rank 0: epoch 1 step 10 world 3", timeout=120)
    os.kill(node_pid(home, run_id, "t-worker-1"), signal.SIGKILL)
    watcher.wait_for(r"rank 0: epoch [1-9] step 10 world \d round [1-9]", timeout=120)
    os.kill(node_pid(home, run_id, "t-main"), signal.SIGKILL)
    code, output = watcher.finish(timeout=240)
    assert code == 0, output[-4000:]
    assert "node t-worker-1 lost" in output and "node t-main lost" in output
    assert re.search(r"resuming epoch [1-9]", output)  # mid-epoch, not from the start
    return run_id


def assert_each_epoch_trained_once(run: WorkDir) -> None:
    newest: dict[str, tuple[float, str]] = {}
    for key, modified in run.find_modified("outputs").items():
        name = key.rsplit("/", 1)[-1]
        if re.fullmatch(r"epoch-\d+\.json", name) and modified >= newest.get(name, (0.0, ""))[0]:
            newest[name] = (modified, key)
    assert sorted(newest) == [f"epoch-{e}.json" for e in range(EPOCHS)], sorted(newest)
    for name, (_, key) in newest.items():
        counts = json.loads(run.get(f"outputs/{key}"))["counts"]
        wrong = {i: c for i, c in enumerate(counts) if c != 1}
        assert not wrong, f"{name}: indices trained other than once (index: times): {dict(list(wrong.items())[:10])}"


def assert_every_shard_done(run_id: str) -> None:
    done = run_cli("data", run_id, "--json")
    assert done.returncode == 0, done.stderr
    epochs = json.loads(done.stdout)["epochs"]
    assert [e["epoch"] for e in epochs] == list(range(EPOCHS))
    assert all(e["done"] == e["shards"] == N // 16 and e["in_flight"] == e["left"] == 0 for e in epochs), epochs
    table = run_cli("data", run_id).stdout
    assert re.search(r"^4\s+\S+\s+30\s+30\s+0\s+0$", table, re.M), table
    status = run_cli("status", run_id, "--json")
    assert json.loads(status.stdout)["data"] == epochs[-1]
    assert f"data: epoch 4: 30 of 30 shards done, 0 in flight, 0 left (launcher data {run_id})" \
        in run_cli("status", run_id).stdout


def test_kills_of_a_worker_and_the_main_mid_epoch_train_each_index_once(tmp_path, launcher_home):
    run_id = run_with_kills(tmp_path, launcher_home, "./wd", workers=2)
    assert_each_epoch_trained_once(WorkDir(str(tmp_path / "wd" / run_id)))
    assert_every_shard_done(run_id)


def test_the_same_on_an_s3_work_dir_without_loader_workers(tmp_path, launcher_home, s3_bucket):
    run_id = run_with_kills(tmp_path, launcher_home, f"s3://{s3_bucket}/runs", workers=0)
    assert_each_epoch_trained_once(WorkDir(f"s3://{s3_bucket}/runs/{run_id}"))
    assert_every_shard_done(run_id)
