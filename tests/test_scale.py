"""`launcher scale`: an elastic run grows and shrinks while it trains (real CLI, real torchrun, local backend);
the rounds neither wait for nor take in a node that left; runs that cannot be scaled are refused, saying why."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clirun import Watcher, info_of, run_id_from, wait_until
from cluster import write_spec
from conftest import run_cli
from launcher import node_names
from launcher.backends.oci import OciBackend
from launcher.backends.local.processes import request_nodes, supervisor_problem, write_processes
from launcher.commands.data import data_progress
from launcher.commands.scale import plan_change
from launcher.data.progress import EpochProgress
from launcher.errors import BackendError
from launcher.protocol.rendezvous import Registration
from launcher.protocol.rounds import latest_round
from launcher.node.settings import SettingsError, from_env
from launcher.protocol.store import WorkDir
from launcher.runs.additions import read_added
from launcher.protocol.recovery import LEAVE, Policy, RoundEnd
from launcher.runs.state import RunInfo
from launcher.runs.supervision import ProcessRef
from test_gpus import fake_gpus  # noqa: F401 - a fixture
from test_rounds import FAST, NODES, join_all, rounds_of

ELASTIC = {"elastic": {"minNodes": 2, "maxNodes": 3}}
# Trains until the test creates DONE (every rank agrees on it through an all-reduce), checkpointing each epoch.
JOB = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
checkpoints = os.environ["LAUNCHER_CHECKPOINT_DIR"]
path = os.path.join(checkpoints, "epoch.pt")
epoch = torch.load(path) if os.path.exists(path) else 0
print(f"rank {rank}: WORLD_SIZE={os.environ['WORLD_SIZE']} from epoch {epoch}", flush=True)
while True:
    done = torch.tensor([float(os.path.exists(os.environ["DONE"]))])
    dist.all_reduce(done)
    if done.item() > 0:
        break
    epoch += 1
    time.sleep(0.1)
    if rank == 0:
        torch.save(epoch, os.path.join(checkpoints, ".epoch.tmp"))
        os.replace(os.path.join(checkpoints, ".epoch.tmp"), path)
# Leave together: a rank that exits while its peer's gloo threads still talk to it can abort the peer (SIGABRT).
dist.barrier()
dist.destroy_process_group()
"""
QUICK_JOB = "print('done', flush=True)\n"
POLICY = Policy(0, min_nodes=2)


def members(tmp_path: Path, run_id: str) -> list[str]:
    latest = latest_round(WorkDir(str(tmp_path / "wd" / run_id)))
    return latest.members if latest else []


def world_sizes(lines: list[str]) -> list[int]:
    """The WORLD_SIZE rank 0 saw at each start of training, changes only."""
    seen = [int(m.group(1)) for line in lines if (m := re.search(r"r0\].*WORLD_SIZE=(\d+)", line))]
    return [size for i, size in enumerate(seen) if i == 0 or seen[i - 1] != size]


@pytest.mark.slow
def test_an_elastic_run_grows_to_3_and_shrinks_to_2_while_it_trains(tmp_path, launcher_home, fake_gpus):
    fake_gpus(3)  # launcher gives the nodes one each, and the node it adds the one left
    done = tmp_path / "done"
    spec = write_spec(tmp_path, JOB, nodes=2, extra_cluster=ELASTIC, env=[{"name": "DONE", "value": str(done)}])
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, dict(os.environ))
    watcher.wait_for(r"r0\].*WORLD_SIZE=2 from epoch", timeout=60)

    grown = run_cli("scale", run_id, "--nodes", "3")
    assert grown.returncode == 0, grown.stdout + grown.stderr
    assert "started t-worker-1" in grown.stdout
    assert "t-worker-1" in info_of(launcher_home, run_id)["nodes"]  # status, watch, cancel and clean see it
    assert "t-worker-1" in json.loads((launcher_home / "runs" / run_id / "processes.json").read_text())["nodes"]
    assert wait_until(lambda: members(tmp_path, run_id) == ["t-main", "t-worker-0", "t-worker-1"], 60)
    watcher.wait_for(r"r0\].*WORLD_SIZE=3 from epoch [1-9]", timeout=60)  # resumed from its checkpoint

    shrunk = run_cli("scale", run_id, "--nodes", "2")
    assert shrunk.returncode == 0, shrunk.stdout + shrunk.stderr
    assert "asked t-worker-1 to leave" in shrunk.stdout
    scale = json.loads((tmp_path / "wd" / run_id / "control" / "scale.json").read_text())
    assert scale["nodes"] == 2 and scale["remove"] == ["t-worker-1"]
    assert wait_until(lambda: members(tmp_path, run_id) == ["t-main", "t-worker-0"], 60)
    watcher.wait_for(r"r0\].*WORLD_SIZE=2 from epoch [1-9]\d*$", timeout=60)
    assert world_sizes(watcher.lines) == [2, 3, 2]

    done.touch()
    code, output = watcher.finish(timeout=60)
    assert code == 0, output[-3000:]
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "succeeded"
    assert status["rounds"]["restarts"] == 0  # a join and a leave cost no restart
    assert status["rounds"]["members"] == ["t-main", "t-worker-0"]
    left = json.loads((tmp_path / "wd" / run_id / "status" / "t-worker-1.json").read_text())
    assert left["state"] == "left" and left["exit_code"] == 0, left
    assert status["nodes"]["t-worker-1"]["rank"] is None  # it has none since it left (its last one was 2)
    gpus = {node: [gpu["index"] for gpu in record["accelerators"]["gpus"]] for node, record in status["nodes"].items()}
    assert gpus == {"t-main": ["0"], "t-worker-0": ["1"], "t-worker-1": ["2"]}
    assert re.search(r"^t-worker-1\s+-\s+left\s", run_cli("status", run_id).stdout, re.M)
    events = json.loads(run_cli("timeline", run_id, "--json").stdout)["events"]  # both requests, and who came and went
    assert [e["detail"] for e in events if e["phase"] == "scale"] == ["2 -> 3 nodes (+t-worker-1)",
                                                                       "3 -> 2 nodes (-t-worker-1)"]
    came_and_went = ("started", "joins", "asked-to-leave", "leaves")
    assert [e["phase"] for e in events if e["node"] == "t-worker-1" and e["phase"] in came_and_went] \
        == list(came_and_went)  # asked to leave (control/leave), then its round's leave record


def test_scale_refuses_runs_it_cannot_change(tmp_path, launcher_home, monkeypatch, capsys):
    static = write_spec(tmp_path, QUICK_JOB, nodes=1)
    finished = run_cli("run", "-f", str(static), cwd=tmp_path)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    refused = run_cli("scale", run_id_from(finished.stdout), "--nodes", "2")
    assert refused.returncode == 2
    assert "is not elastic: only a run with spec.cluster.spec.elastic (minNodes, maxNodes) can be scaled" \
        in refused.stderr

    elastic = write_spec(tmp_path, QUICK_JOB, nodes=2, extra_cluster=ELASTIC)
    finished = run_cli("run", "-f", str(elastic), cwd=tmp_path)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    run_id = run_id_from(finished.stdout)
    outside = run_cli("scale", run_id, "--nodes", "4")
    assert outside.returncode == 2
    assert f"--nodes 4 is outside run {run_id}'s minNodes..maxNodes (2..3, spec.cluster.spec.elastic)" \
        in outside.stderr
    ended = run_cli("scale", run_id, "--nodes", "3")
    assert ended.returncode == 2
    assert f"run {run_id} has ended (succeeded): only a running run can be scaled" in ended.stderr
    assert not (tmp_path / "wd" / run_id / "control" / "scale.json").exists()  # nothing recorded

    # `launcher data` words an ended run as ended (nothing is to come "yet", nothing is "in flight")
    data = run_cli("data", run_id)
    assert data.stdout == f"run {run_id} has ended (succeeded) and recorded no epoch of launcher.data.ElasticSampler\n"
    monkeypatch.setattr("launcher.data.progress.read_progress", lambda store: [EpochProgress(0, "1.0", 4, 2, 1, 1)])
    assert data_progress(run_id, as_json=False) == 0
    table = capsys.readouterr().out
    assert f"run {run_id}: data progress when it ended (succeeded)" in table
    assert "PARTLY DONE  NOT STARTED" in table and "IN FLIGHT" not in table and "yet" not in table


def test_a_backend_that_cannot_scale_says_so(tmp_path):
    info = RunInfo("r", "oci", str(tmp_path), ["t-main"], "", "", 0.0)
    assert "the oci backend cannot scale a running run yet" in OciBackend().scale_problem(info)
    with pytest.raises(BackendError, match="cannot scale"):
        OciBackend().scale(info, ["t-worker-1"])
    assert "its supervisor" in supervisor_problem(tmp_path) and "is not running" in supervisor_problem(tmp_path)


def test_a_supervisor_that_does_not_start_the_nodes_is_reported_with_its_log(tmp_path):
    deaf = subprocess.Popen([sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGUSR1, "
                             "signal.SIG_IGN); print(flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        deaf.stdout.readline()  # it ignores SIGUSR1 from here on
        write_processes(str(tmp_path), ProcessRef.of(deaf.pid), {})
        with pytest.raises(BackendError, match=f"did not start t-worker-1 within 0.3s; see {tmp_path}/supervisor.log"):
            request_nodes(tmp_path, ["t-worker-1"], timeout=0.3)
        assert read_added(tmp_path) == ["t-worker-1"]
    finally:
        deaf.kill()
        deaf.wait()


def test_added_names_continue_the_worker_numbering_and_rank_after_the_specs_nodes():
    groups = [("j-main", 1), ("j-worker", 2)]
    assert node_names.added(groups, ["j-main", "j-worker-0", "j-worker-1", "j-worker-2"], 2) == \
        ["j-worker-3", "j-worker-4"]  # a name that left is never given again
    assert node_names.added([("j-main", 1), ("j-worker", 0)], ["j-main"], 1) == ["j-worker-0"]
    assert node_names.expand(node_names.including(groups, "j-worker-3"))[-1] == "j-worker-3"
    with pytest.raises(ValueError):
        node_names.including(groups, "j-wrker-3")  # a typo is no node of the groups
    order = node_names.expand(groups)
    assert node_names.rank_order(order, "j-worker", ["j-worker-10", "j-worker-3", "j-main", "other"]) == \
        ["j-main", "j-worker-3", "j-worker-10"]


def test_an_added_node_is_told_groups_that_hold_its_name_and_a_typo_is_still_refused():
    groups = [["t-main", 1], ["t-worker", 1]]
    env = {"LAUNCHER_RUN_ID": "r", "LAUNCHER_WORK_DIR": "/tmp/wd", "LAUNCHER_ENTRYPOINT": "job.py",
           "LAUNCHER_NODE_NAME": "t-worker-2", "LAUNCHER_NODE_GROUPS": json.dumps(groups)}
    with pytest.raises(SettingsError, match="'t-worker-2' is not a node of LAUNCHER_NODE_GROUPS"):
        from_env(env)  # the spec's groups alone do not hold it
    told = {**env, "LAUNCHER_NODE_GROUPS": json.dumps(node_names.including(groups, "t-worker-2"))}
    assert from_env(told).node == "t-worker-2"
    with pytest.raises(SettingsError, match="not a node"):
        from_env({**told, "LAUNCHER_NODE_NAME": "t-wroker-2"})


def test_shrinking_asks_the_highest_numbered_workers_first_and_the_main_last():
    groups = [("j-main", 1), ("j-worker", 2)]
    present = ["j-worker-3", "j-main", "j-worker-0"]  # j-worker-1 left earlier, j-worker-3 was added
    assert plan_change(groups, present, [], 1).remove == ["j-worker-3", "j-worker-0"]
    assert plan_change(groups, ["j-worker-0", "j-worker-1"], [], 1).remove == ["j-worker-1"]
    grown = plan_change(groups, present, ["j-main", "j-worker-0", "j-worker-1", "j-worker-3"], 4)
    assert grown.before == ["j-main", "j-worker-0", "j-worker-3"] and grown.add == ["j-worker-4"]


def test_a_member_that_leaves_ends_its_round_is_not_waited_for_and_costs_no_restart(tmp_path):
    store = WorkDir(str(tmp_path / "run"))
    join_all(store, POLICY, NODES, 0, grows="w")
    rounds = rounds_of(store, POLICY)
    assert not rounds.ended(0, NODES)
    rounds.end(0, RoundEnd("w-1", LEAVE, "the run was scaled to 2 nodes", None, time.time()))
    assert rounds.ended(0, NODES) and not rounds.ended(0, ["m", "w-0"])  # a non-member's leave ends nothing
    begun = time.monotonic()
    joined = join_all(store, POLICY, ["m", "w-0"], 1, grows="w")
    assert time.monotonic() - begun < FAST.settle  # w-1 is not expected: no settling
    assert joined["m"].members == ["m", "w-0"] and joined["m"].restarts == 0  # a leave costs nothing


def test_a_node_that_left_while_waiting_is_not_taken_in(tmp_path):
    store = WorkDir(str(tmp_path / "run"))
    join_all(store, POLICY, NODES, 0, grows="w")
    store.create(f"rounds/00001/nodes/{Registration('w-1', '127.0.0.1', 1002).key.rsplit('/', 1)[1]}", b"{}")
    rounds_of(store, POLICY).end(1, RoundEnd("w-1", LEAVE, "scaled", None, time.time()))
    joined = join_all(store, POLICY, ["m", "w-0"], 1, grows="w")
    assert joined["m"].members == ["m", "w-0"]
