"""The local backend end to end with the example from `launcher init`: real processes, real torchrun, real DDP."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from clirun import Watcher, alive, group_alive, info_of, init_project, run_id_from
from conftest import run_cli


@pytest.mark.parametrize("workers", [1, 2])
def test_run_trains_the_example_on_local_nodes(tmp_path, launcher_home, workers):
    spec = init_project(tmp_path, workers=workers, epochs=3)
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    nodes = 1 + workers
    # DDP really synchronised: every rank ends with the same parameters
    digests = re.findall(r"r(\d)\] rank (\d): final parameters (\w+)", done.stdout)
    assert sorted(int(rank) for _, rank, _ in digests) == list(range(nodes))
    assert len({digest for _, _, digest in digests}) == 1
    assert all(prefix == rank for prefix, rank, _ in digests)  # the watch prefix shows the true rank
    assert re.search(r"final test accuracy 0\.\d+", done.stdout)
    assert f"run {run_id} succeeded" in done.stdout

    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "succeeded"
    assert {n["state"] for n in status["nodes"].values()} == {"succeeded"}

    watch = run_cli("watch", run_id)
    assert watch.returncode == 0
    config = run_cli("show-config", run_id).stdout
    assert f"WORLD_SIZE:   {nodes} (1 process per node)" in config
    for name, node in status["nodes"].items():
        assert f"{node['rank']:>4}  {name}" in config
        assert re.search(rf"^\[{re.escape(name)}\s+r{node['rank']}\] ", watch.stdout, re.M), name
        # each node's last line (written just before its final status) reached the followed output
        assert re.search(rf"^\[{re.escape(name)}\s*\] \[launcher\] succeeded \(exit status 0\)$",
                         done.stdout, re.M), name

    info = info_of(launcher_home, run_id)
    outputs = Path(info["work_dir"]) / run_id / "outputs" / status["nodes"][info["nodes"][0]]["main"]
    assert (outputs / "model.pt").is_file()
    assert sorted(p.name for p in (outputs / "checkpoints").iterdir()) == [
        "epoch-0001.pt", "epoch-0002.pt", "epoch-0003.pt"]
    listed = run_cli("list").stdout
    assert run_id in listed and "succeeded" in listed


def test_killed_node_fails_the_run_fast_and_a_rerun_resumes(tmp_path, launcher_home):
    spec = init_project(tmp_path, workers=2, epochs=400)
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    info = info_of(launcher_home, run_id)
    watcher = Watcher(run_id, os.environ.copy())
    watcher.wait_for(r"r0\] rank 0: epoch 4/400")  # by then checkpoint 3 is on disk
    ranks = json.loads(run_cli("status", run_id, "--json").stdout)["nodes"]
    victim = next(name for name, node in ranks.items() if node["rank"] == 2)
    os.kill(info["backend_ids"]["nodes"][victim]["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    code, output = watcher.finish(timeout=60)
    assert time.monotonic() - killed_at < 10, "the run did not end within 10 s of the kill"
    assert code == 1
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "failed"
    dead = status["nodes"][victim]
    assert dead["state"] == "failed" and dead["exit_code"] == 137 and "SIGKILL" in dead["reason"]
    rank = dead["rank"]
    assert f"failed: node {victim} exited with status 137" in output
    table = run_cli("status", run_id).stdout
    assert re.search(rf"{re.escape(victim)}\s+{rank}\s+failed\s+137", table)
    for ref in info["backend_ids"]["nodes"].values():
        assert not alive(ref["pid"])

    # Run again from the failed run's checkpoints.
    again = run_cli("run", "-f", str(spec.with_name("train.yaml")), "--resume-from", run_id, "--detach", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    second = run_id_from(again.stdout)
    watcher = Watcher(second, os.environ.copy())
    line = watcher.wait_for(r"resumed from epoch-\d{4}\.pt")
    resumed_epoch = int(re.search(r"epoch-(\d{4})", line).group(1))
    assert resumed_epoch >= 3
    assert run_cli("cancel", second).returncode == 0
    watcher.finish()


def test_cancel_stops_every_process_and_keeps_logs(tmp_path, launcher_home):
    spec = init_project(tmp_path, workers=1, epochs=400)
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    run_id = run_id_from(started.stdout)
    info = info_of(launcher_home, run_id)
    watcher = Watcher(run_id, os.environ.copy())
    watcher.wait_for(r"epoch 2/400")
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    training_groups = [n["training_pgid"] for n in status["nodes"].values()]
    cancelled = run_cli("cancel", run_id, timeout=120)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled" in cancelled.stdout
    code, output = watcher.finish()
    assert code == 1 and f"run {run_id} cancelled" in output
    final = json.loads(run_cli("status", run_id, "--json").stdout)
    assert final["result"] == "cancelled"
    assert {n["state"] for n in final["nodes"].values()} == {"cancelled"}
    ids = info["backend_ids"]
    for ref in [ids["supervisor"], *ids["nodes"].values()]:
        assert not alive(ref["pid"]), ref
    for pgid in training_groups:
        assert not group_alive(pgid), pgid
    logs = run_cli("watch", run_id, "--no-follow").stdout
    assert "epoch 2/400" in logs and "stopping training: the run was cancelled" in logs


def test_verbs_on_unknown_runs_are_bad_input(launcher_home):
    done = run_cli("status", "no-such-run")
    assert done.returncode == 2 and "no run 'no-such-run'" in done.stderr
    done = run_cli("watch")
    assert done.returncode == 2 and "no runs recorded" in done.stderr


def test_an_over_long_run_reference_is_cut_short_in_the_error(tmp_path, launcher_home):
    pasted = "x" * 5000  # a log line pasted where a run id goes
    for args in (("status", pasted), ("run", "-f", str(tmp_path / "train.yaml"), "--run-id", pasted)):
        done = run_cli(*args)
        assert done.returncode == 2 and f"'{'x' * 60}…' (5000 characters)" in done.stderr, done.stderr
        assert len(done.stderr) < 400, done.stderr


def test_the_dry_run_is_what_the_nodes_receive(tmp_path, launcher_home):
    spec = init_project(tmp_path, workers=1, epochs=400)
    printed = run_cli("run", "-f", str(spec), "--dry-run", "--output", "json", "--run-id", "same-id-1")
    assert printed.returncode == 0, printed.stderr
    dry = json.loads(printed.stdout)
    started = run_cli("run", "-f", str(spec), "--run-id", "same-id-1", "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    try:
        pids = {name: ref["pid"] for name, ref in info_of(launcher_home, "same-id-1")["backend_ids"]["nodes"].items()}
        for node in dry["nodes"]:
            raw = Path(f"/proc/{pids[node['name']]}/environ").read_bytes().split(b"\0")
            environ = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
            assert {k: environ.get(k) for k in node["env"]} == node["env"]
            cmdline = Path(f"/proc/{pids[node['name']]}/cmdline").read_bytes().decode().split("\0")[:-1]
            assert cmdline == node["command"]
        reused = run_cli("run", "-f", str(spec), "--run-id", "same-id-1", "--detach", cwd=tmp_path)
        assert reused.returncode == 2 and "was used before" in reused.stderr
    finally:
        assert run_cli("cancel", "same-id-1").returncode == 0


def test_the_example_resumes_exactly_where_it_stopped(tmp_path, launcher_home):
    """Two epochs, then a resumed run to three, ends with the very parameters of three epochs straight, on
    two nodes: the resume restored the epoch, the model, the optimizer's momentum and the data progress,
    and which rank trains which samples depends on nothing but the data progress and the world size."""
    def final_digest(output: str) -> str:
        digests = set(re.findall(r"rank \d: final parameters (\w+)", output))
        assert len(digests) == 1, output
        return digests.pop()

    spec = init_project(tmp_path, workers=1, epochs=3)
    straight = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=300)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    first = run_cli("run", "-f", str(spec), "--", "--epochs", "2", cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    resumed = run_cli("run", "-f", str(spec), "--resume-from", run_id_from(first.stdout), cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert re.search(r"resumed from .*epoch-0002\.pt \(continuing at epoch 3\)", resumed.stdout), resumed.stdout
    assert not re.search(r"epoch [12]/3 ", resumed.stdout)
    assert final_digest(resumed.stdout) == final_digest(straight.stdout)
