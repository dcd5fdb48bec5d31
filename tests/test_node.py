"""The node bootstrap as real processes with real torchrun: ranks, fail-fast, cancel, timeout, logs, outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cluster import Cluster, write_spec
from launcher.protocol.control import request_cancel
from launcher.runs.timeline import RECORDED, derive, read_records

CHECK = """\
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
assert os.environ["NNODES"] == str(world) and os.environ["NODE_RANK"] == str(rank)
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
assert total.item() == world * (world + 1) / 2, total
out = os.environ["LAUNCHER_OUTPUTS_DIR"]
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:  # the outputs and checkpoint dirs exist already
    json.dump({"argv": sys.argv[1:], "tricky": os.environ.get("TRICKY"), "rank": rank, "sum": total.item()}, f)
torch.save(total, os.path.join(os.environ["LAUNCHER_CHECKPOINT_DIR"], f"total{rank}.pt"))
print(f"rank {rank}/{world} all_reduce ok", flush=True)
dist.destroy_process_group()
"""

FOREVER = """\
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
step = 0
while True:
    t = torch.ones(1)
    dist.all_reduce(t)
    if step % 50 == 0:
        print(f"rank {rank} step {step}", flush=True)
    if step == 200 and os.environ.get("FAIL_RANK") == str(rank):
        print(f"rank {rank} about to fail", flush=True)
        if os.environ.get("FAIL_HOW") == "abort":
            os.abort()
        os._exit(7)  # sys.exit would run gloo's teardown, which may itself abort (SIGABRT) in torch 2.13
    step += 1
    time.sleep(0.01)
"""

TRICKY_ARGS = ["$(touch /tmp/launcher-pwned)", "`id`", "a b", "it's \"q\"", "two\nlines", "naïve ✓", "$HOME"]


@pytest.mark.parametrize("n", [2, 3])
def test_real_torchrun_ranks_and_all_reduce(tmp_path, n):
    spec = write_spec(tmp_path, CHECK, nodes=n, args=TRICKY_ARGS,
                      env=[{"name": "TRICKY", "value": TRICKY_ARGS[0] + TRICKY_ARGS[4]}])
    cluster = Cluster(spec)
    codes = cluster.wait()
    assert codes == {name: 0 for name in cluster.nodes}, {k: v.output for k, v in cluster.nodes.items()}
    decision = json.loads(cluster.run.get("rendezvous.json"))
    assert sorted(decision["ranks"].values()) == list(range(n))
    for name in cluster.nodes:
        status = cluster.status(name)
        assert status["state"] == "succeeded" and status["exit_code"] == 0
        assert status["rank"] == decision["ranks"][name]
        rank = status["rank"]
        synced = json.loads(cluster.run.get(f"outputs/{name}/rank{rank}.json"))
        assert synced["argv"] == TRICKY_ARGS  # byte for byte, no shell on the way
        assert synced["tricky"] == TRICKY_ARGS[0] + TRICKY_ARGS[4]
        assert cluster.run.get(f"outputs/{name}/checkpoints/total{rank}.pt")  # saved there without a makedirs
        assert f"rank {rank}/{n} all_reduce ok" in cluster.log_text(name)
    assert not os.path.exists("/tmp/launcher-pwned")


def test_rendezvous_timeout_names_the_missing_node(tmp_path):
    spec = write_spec(tmp_path, CHECK, nodes=3, extra_cluster={"rendezvousTimeout": 2})
    cluster = Cluster(spec, start=["t-main", "t-worker-0"])
    codes = cluster.wait(timeout=60)
    assert codes == {"t-main": 1, "t-worker-0": 1}
    for name, node in cluster.nodes.items():
        assert "missing: t-worker-1" in node.output
        status = cluster.status(name)
        assert status["state"] == "failed" and "missing: t-worker-1" in status["reason"]


@pytest.mark.parametrize("how,code,reason", [("exit", 7, "rank 1 exited with status 7"),
                                             ("abort", 134, "rank 1 killed by SIGABRT")])
def test_a_failing_node_stops_its_peers_and_keeps_its_logs(tmp_path, how, code, reason):
    spec = write_spec(tmp_path, FOREVER, nodes=3)
    cluster = Cluster(spec, env={"FAIL_RANK": "1", "FAIL_HOW": how})
    codes = cluster.wait(timeout=120)
    decision = json.loads(cluster.run.get("rendezvous.json"))
    failing = next(name for name, rank in decision["ranks"].items() if rank == 1)
    assert codes[failing] == code
    failed = cluster.status(failing)
    assert failed["state"] == "failed" and failed["exit_code"] == code and failed["reason"] == reason
    ended = [failed["ended_at"]]
    for name in cluster.nodes:
        if name != failing:
            assert codes[name] != 0
            status = cluster.status(name)
            assert status["state"] == "failed", status
            ended.append(status["ended_at"])
    assert max(ended) - min(ended) < 10
    log = cluster.log_text(failing)
    assert "rank 1 step 150" in log and "rank 1 about to fail" in log  # written before the failure


def test_sigkill_of_a_node_ends_the_run_failed_within_20s(tmp_path):
    spec = write_spec(tmp_path, FOREVER, nodes=3)
    cluster = Cluster(spec)
    victim = cluster.nodes["t-worker-1"]
    assert victim.wait_for_line("step 100")
    os.killpg(victim.proc.pid, signal.SIGKILL)  # the node, its torchrun and its trainer
    killed_at = time.monotonic()
    for name, node in cluster.nodes.items():
        if name != "t-worker-1":
            assert node.proc.wait(timeout=30) != 0
    # not the rendezvous timeout (600 s): PEER_GRACE_SECONDS (5 s) for the dead node's marker that never comes, then
    # torchrun's teardown, which took up to 11 s at load average 16 on the 2-core test machine
    assert time.monotonic() - killed_at < 20
    for name in cluster.nodes:
        if name != "t-worker-1":
            assert cluster.status(name)["state"] == "failed"


def test_cancel_marker_stops_every_node_as_cancelled(tmp_path):
    spec = write_spec(tmp_path, FOREVER, nodes=2)
    cluster = Cluster(spec)
    for node in cluster.nodes.values():
        assert node.wait_for_line("step 50")
    request_cancel(cluster.run)
    cancelled_at = time.monotonic()
    codes = cluster.wait(timeout=30)
    assert time.monotonic() - cancelled_at < 10
    assert codes == {name: 130 for name in cluster.nodes}
    for name in cluster.nodes:
        assert cluster.status(name)["state"] == "cancelled"
        # either it stopped its training on seeing the marker, or its training failed first because
        # the peer had stopped, and the marker was then found to be the cause
        assert "the run was cancelled" in cluster.log_text(name)


def test_sigterm_is_forwarded_to_training(tmp_path):
    spec = write_spec(tmp_path, FOREVER, nodes=2)
    cluster = Cluster(spec)
    main = cluster.nodes["t-main"]
    assert main.wait_for_line("step 50")
    main.proc.send_signal(signal.SIGTERM)
    assert main.proc.wait(timeout=30) == 130
    assert cluster.status("t-main")["state"] == "cancelled"
    assert cluster.nodes["t-worker-0"].proc.wait(timeout=30) != 0  # its peer is gone: it fails, it does not hang


def test_work_dir_on_s3(tmp_path, moto, s3_bucket):
    spec = write_spec(tmp_path, CHECK, nodes=2, work_dir=f"s3://{s3_bucket}/runs")
    cluster = Cluster(spec, env=moto.env())
    codes = cluster.wait()
    assert codes == {name: 0 for name in cluster.nodes}, {k: v.output for k, v in cluster.nodes.items()}
    assert cluster.status("t-main")["state"] == "succeeded"
    assert cluster.run.url.startswith(f"s3://{s3_bucket}/runs/")
    phases = {(event.node, event.phase) for event in derive(read_records(cluster.run))}  # the timeline reads S3 too
    assert {(node, phase) for node in cluster.nodes for phase in ("started", "torchrun", "exited", RECORDED)} <= phases


def test_elastic_runs_train_in_membership_rounds_of_static_torchrun(tmp_path):
    spec = write_spec(tmp_path, CHECK, nodes=2, extra_cluster={"elastic": {"minNodes": 2, "maxNodes": 2}})
    cluster = Cluster(spec)
    codes = cluster.wait()
    assert codes == {name: 0 for name in cluster.nodes}, {k: v.output for k, v in cluster.nodes.items()}
    first = json.loads(cluster.run.get("rounds/00000.json"))
    assert first["decision"]["ranks"] == {"t-main": 0, "t-worker-0": 1} and first["restarts"] == 0
    assert cluster.run.get("rendezvous.json") is None
    main_log = cluster.nodes["t-main"].output
    assert "--rdzv-backend" not in main_log and "--node-rank 0" in main_log
    assert sorted(l.split()[1] for n in cluster.nodes.values() for l in n.lines if "all_reduce ok" in l) == \
        ["0/2", "1/2"]


def test_a_second_attempt_with_the_same_run_id_stops_at_once_and_writes_nothing(tmp_path):
    """As a second `docker-compose up` of one file would: same run id, same node names."""
    spec = write_spec(tmp_path, "print('first attempt')", nodes=1)
    first = Cluster(spec)
    assert first.wait(timeout=120) == {"t-main": 0}
    before = sorted(p.relative_to(first.run.root) for p in Path(first.run.root).rglob("*"))
    record = first.status("t-main")
    node = first.plan.nodes[0]
    again = subprocess.run(list(node.command), env={**os.environ, **node.env}, cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 2
    assert "its run id was used before" in again.stderr and "nothing was written" in again.stderr
    assert sorted(p.relative_to(first.run.root) for p in Path(first.run.root).rglob("*")) == before
    assert first.status("t-main") == record
