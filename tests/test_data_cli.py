"""launcher.data through the real CLI and real torchrun. An elastic run (3 nodes, min 2) loses a worker node
mid-epoch and later its main the moment an epoch ended; another grows from 2 to 3 nodes (`launcher scale`) in the
middle of an epoch and then loses its main the same way; a static run with one restart loses its main mid-epoch
and is retried. Every epoch of the model lineage trained each index exactly once (the job's model counts them,
tests/jobs/data_job.py), a scale or retry went on from the checkpoint's mid-epoch progress, and `launcher data`
shows every shard done, also of the epoch whose last progress records the main's training never got to write."""

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
from launcher.protocol.store import WorkDir
from test_recovery import ELASTIC, node_pid

pytestmark = pytest.mark.slow

JOB = (Path(__file__).parent / "jobs" / "data_job.py").read_text()
N, SHARDS, EPOCHS = 240, 15, 5  # the job's shards have 16 indices
HOLD = (1, 12)  # rank 0 holds after step 12 of epoch 1 in round 0, 2 steps past its checkpoint (every 5 steps)
FREEZE = 1  # rank 0 freezes (its record writer too) right after epoch 1's end-of-epoch checkpoint, in the round
# that gets there: the one after the hold (round 0 holds in epoch 1), or the one after that if a node joins first


def start(tmp_path: Path, work_dir: str, cluster: dict, *, nodes: int, workers: int, epochs: int = EPOCHS,
          hold: bool = False, freeze: bool = False) -> tuple[str, Watcher]:
    env = [{"name": "DATA_WORKERS", "value": str(workers)}, {"name": "DATA_N", "value": str(N)},
           {"name": "DATA_EPOCHS", "value": str(epochs)}]
    if hold:
        env.append({"name": "DATA_HOLD", "value": "%d:%d" % HOLD})
    if freeze:
        env.append({"name": "DATA_FREEZE", "value": str(FREEZE)})
    spec = write_spec(tmp_path, JOB, nodes=nodes, work_dir=work_dir, extra_cluster=cluster, env=env)
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    return run_id, Watcher(run_id, dict(os.environ))


def held(watcher: Watcher) -> int:
    """Await rank 0's hold; the number of indices of the epoch that its newest checkpoint holds as trained."""
    epoch, step = HOLD
    checkpoint = watcher.wait_for(rf"rank 0: epoch {epoch} step {step - step % 5} world \d round 0 trained \d+$")
    holding = watcher.wait_for(rf"rank 0: holding at epoch {epoch} step {step}, trained \d+$")
    saved = int(checkpoint.rsplit(" ", 1)[1])
    assert 0 < saved < int(holding.rsplit(" ", 1)[1]) < N  # mid-epoch, with steps trained past the checkpoint
    return saved


def assert_resumed(watcher: Watcher, saved: int) -> int:
    """The first epoch after round 0 is the held one, begun with exactly the checkpoint's progress (a restore,
    neither a start from scratch nor one that kept the steps after the checkpoint); returns that round."""
    begun = watcher.wait_for(r"rank 0: epoch \d+ begins with \d+ of \d+ trained, world \d round [1-9]\d*$")
    assert re.search(rf"epoch {HOLD[0]} begins with {saved} of {N} trained", begun), begun
    return int(begun.rsplit(" ", 1)[1])


def run_with_kills(tmp_path: Path, home: Path, work_dir: str, workers: int, *, grown: bool = False) -> str:
    """While rank 0 holds in round 0 in the middle of an epoch (past a checkpoint), kill a worker node, or with
    ``grown`` scale the run from 2 nodes to 3; then kill the main while its rank 0 is frozen right after an epoch's
    end-of-epoch checkpoint, in whatever round gets there: its progress records of that epoch stay as its writer's
    last pass left them, which may be some steps short of the epoch's end."""
    run_id, watcher = start(tmp_path, work_dir, ELASTIC, nodes=2 if grown else 3, workers=workers, hold=True,
                            freeze=True)
    saved = held(watcher)
    if grown:
        scaled = run_cli("scale", run_id, "--nodes", "3")
        assert scaled.returncode == 0, scaled.stdout + scaled.stderr
        assert "started t-worker-1" in scaled.stdout
        victims = ["t-main"]
    else:
        os.kill(node_pid(home, run_id, "t-worker-1"), signal.SIGKILL)
        victims = ["t-worker-1", "t-main"]
    assert_resumed(watcher, saved)
    frozen = watcher.wait_for(rf"rank 0: frozen at the end of epoch {FREEZE} in round \d+, trained {N}$")
    os.kill(node_pid(home, run_id, "t-main"), signal.SIGKILL)
    code, output = watcher.finish(timeout=240)
    assert code == 0, output[-4000:]
    assert all(f"node {victim} lost" in output for victim in victims), output[-4000:]
    frozen_round = int(re.search(r"in round (\d+)", frozen).group(1))
    after = re.findall(rf"rank 0: epoch {FREEZE + 1} begins with (\d+) of {N} trained, world \d round (\d+)$", output,
                       re.M)
    assert [trained for trained, round_number in after if int(round_number) > frozen_round][:1] == ["0"], after
    return run_id


def assert_each_epoch_trained_once(run: WorkDir, epochs: int = EPOCHS) -> None:
    newest: dict[str, tuple[float, str]] = {}
    for key, (modified, _) in run.find_stats("outputs").items():
        name = key.rsplit("/", 1)[-1]
        if re.fullmatch(r"epoch-\d+\.json", name) and modified >= newest.get(name, (0.0, ""))[0]:
            newest[name] = (modified, key)
    assert sorted(newest) == [f"epoch-{e}.json" for e in range(epochs)], sorted(newest)
    for name, (_, key) in newest.items():
        counts = json.loads(run.get(f"outputs/{key}"))["counts"]
        wrong = {i: c for i, c in enumerate(counts) if c != 1}
        assert not wrong, f"{name}: indices trained other than once (index: times): {dict(list(wrong.items())[:10])}"


def assert_every_shard_done(run_id: str, epochs: int = EPOCHS) -> None:
    last = epochs - 1
    done = run_cli("data", run_id, "--json")
    assert done.returncode == 0, done.stderr
    progress = json.loads(done.stdout)["epochs"]
    assert [e["epoch"] for e in progress] == list(range(epochs))
    assert all(e["done"] == e["shards"] == SHARDS and e["in_flight"] == e["left"] == 0 for e in progress), progress
    table = run_cli("data", run_id).stdout
    assert re.search(rf"^{last}\s+\S+\s+{SHARDS}\s+{SHARDS}\s+0\s+0$", table, re.M), table
    status = run_cli("status", run_id, "--json")
    assert json.loads(status.stdout)["data"] == progress[-1]
    assert f"data: epoch {last}: {SHARDS} of {SHARDS} shards done, 0 in flight, 0 left (launcher data {run_id})" \
        in run_cli("status", run_id).stdout


def test_a_run_grown_mid_epoch_then_losing_its_main_trains_each_index_once(tmp_path, launcher_home):
    run_id = run_with_kills(tmp_path, launcher_home, "./wd", workers=2, grown=True)
    assert_each_epoch_trained_once(WorkDir(str(tmp_path / "wd" / run_id)))
    assert_every_shard_done(run_id)


def test_kills_of_a_worker_and_the_main_mid_epoch_on_s3_train_each_index_once(tmp_path, launcher_home, s3_bucket):
    run_id = run_with_kills(tmp_path, launcher_home, f"s3://{s3_bucket}/runs", workers=0)
    assert_each_epoch_trained_once(WorkDir(f"s3://{s3_bucket}/runs/{run_id}"))
    assert_every_shard_done(run_id)


def test_a_static_run_retried_after_losing_its_main_mid_epoch_resumes_and_trains_each_index_once(
        tmp_path, launcher_home):
    epochs = 2
    run_id, watcher = start(tmp_path, "./wd", {"recovery": {"maxRestarts": 1}}, nodes=2, workers=2, epochs=epochs,
                            hold=True)
    saved = held(watcher)
    os.kill(node_pid(launcher_home, run_id, "t-main"), signal.SIGKILL)
    assert_resumed(watcher, saved)
    code, output = watcher.finish(timeout=240)
    assert code == 0, output[-4000:]
    assert "node t-main lost: node process killed by SIGKILL" in output and "restart 1 of 1" in output
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["rounds"]["restarts"] == 1
    data = status["data"]  # the newest epoch's progress
    assert (data["epoch"], data["done"], data["in_flight"], data["left"]) == (epochs - 1, SHARDS, 0, 0), data
    assert_each_epoch_trained_once(WorkDir(str(tmp_path / "wd" / run_id)), epochs)
