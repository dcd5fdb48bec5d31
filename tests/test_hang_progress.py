"""The hang watch as the chaos soak (benchmarks/chaos.py) found it wanting: ranks that train without printing are
not hung (a step counts as progress, as a line does), and in a recovering run a hang ends the round, which the
policy retries where ``recovery.retryOn`` has ``failure``, rather than the run. Real torchrun and gloo on 2 local
nodes through the real CLI."""

from __future__ import annotations

import pytest

from cluster import write_spec
from conftest import run_cli

pytestmark = pytest.mark.slow

# Rank 0 prints each second; rank 1 (the other node's only rank) trains with an optimizer for 3 x hangTimeout and
# prints nothing until the end, as most scripts' ranks but the first do.
SILENT_BUT_TRAINING = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print("imported", flush=True)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
begun = time.monotonic()
while time.monotonic() - begun < 3 * int(os.environ["HANG_TIMEOUT"]):
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.2)
    if rank == 0 and int(time.monotonic() - begun) != int(time.monotonic() - begun - 0.2):
        print("step", flush=True)
print(f"rank {rank} trained", flush=True)
"""
TIMEOUT = 8  # a hang would be called at 8 s: the run trains for 24 s


def test_a_node_whose_ranks_train_in_silence_is_not_hung(tmp_path, launcher_home):
    spec = write_spec(tmp_path, SILENT_BUT_TRAINING, nodes=2, extra_cluster={"hangTimeout": TIMEOUT},
                      env=[{"name": "HANG_TIMEOUT", "value": str(TIMEOUT)}])
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "rank 1 trained" in done.stdout and "hung" not in done.stdout, done.stdout[-3000:]


def test_a_rank_that_stops_stepping_is_still_hung(tmp_path, launcher_home):
    """The steps count only while they grow: rank 1 stops after its first steps and sleeps in silence."""
    script = SILENT_BUT_TRAINING.replace("    time.sleep(0.2)\n",
                                         "    time.sleep(0.2)\n    if rank == 1 and time.monotonic() - begun > 2:\n"
                                         "        time.sleep(600)\n")
    spec = write_spec(tmp_path, script, nodes=2, extra_cluster={"hangTimeout": TIMEOUT},
                      env=[{"name": "HANG_TIMEOUT", "value": str(TIMEOUT)}])
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 1, done.stdout[-3000:]
    assert f"cause: hung: rank 1 made no progress for {TIMEOUT}s outside any collective" in done.stdout, \
        done.stdout[-3000:]


# Rank 1 hangs in round 0 only (silent, outside any collective); every round after trains and ends.
HANGS_IN_ROUND_0 = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} in round {os.environ['LAUNCHER_ROUND']}", flush=True)
if dist.get_rank() == 1 and os.environ["LAUNCHER_ROUND"] == "0":
    time.sleep(600)
dist.all_reduce(torch.ones(1))
print(f"rank {dist.get_rank()} done", flush=True)
"""


@pytest.mark.parametrize("retry_on", [["lost", "failure"], ["lost"]])
def test_a_hang_in_a_recovering_run_ends_the_round_and_the_policy_decides(tmp_path, launcher_home, retry_on):
    cluster = {"hangTimeout": TIMEOUT, "recovery": {"maxRestarts": 2, "retryOn": retry_on}}
    spec = write_spec(tmp_path, HANGS_IN_ROUND_0, nodes=2, extra_cluster=cluster)
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    hung = f"hung: rank 1 made no progress for {TIMEOUT}s outside any collective"
    if "failure" in retry_on:  # retried: round 1 trains to the end
        assert done.returncode == 0, done.stdout[-3000:]
        assert "rank 1 in round 1" in done.stdout and "rank 1 done" in done.stdout, done.stdout[-3000:]
        assert f"round 0 ended: {hung}" in done.stdout, done.stdout[-3000:]
    else:  # not retried: the run stops at once, naming the hang and the policy
        assert done.returncode == 1, done.stdout[-3000:]
        assert "cause: not retried (exit status 124 is not in recovery.retryOn): node t-worker-0: " + hung \
            in done.stdout, done.stdout[-3000:]
        assert "rank 1 in round 1" not in done.stdout
