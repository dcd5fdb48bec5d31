"""A straggler made for real (issue 39): one rank of a real 2-node local run burns CPU on every step, or waits for
its data, beside three that do not; the nodes' own samplers measure it, and `run`, `status` and `top` name it,
once, with what its figures suggest. Nothing here writes a health record by hand."""

from __future__ import annotations

import json
import os
import re

import pytest

from clirun import LiveCli, run_id_from
from cluster import write_spec
from conftest import run_cli

# Training with a real optimizer and a plain DataLoader, and no launcher code: torch's optimizer hook counts the
# steps, the DataLoader hook the samples and the waits for them. Rank 3 is slow for real, by SLOW: "cpu" burns CPU
# on every step, "data" makes every sample of its dataset take 2 ms to come. Every rank stops at the same step once
# the test creates STOP (an all-reduce of the flag), so no rank is left waiting in a collective.
SCRIPT = """
import os, time
import torch
import torch.distributed as dist

SLOW = "{slow}"
dist.init_process_group("gloo")
rank = dist.get_rank()


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 1024

    def __getitem__(self, index):
        if rank == 3 and SLOW == "data":
            time.sleep(0.002)
        return torch.randn(32)


model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Data(), batch_size=16)
started = time.monotonic()
print(f"rank {{rank}} trains", flush=True)
step, stop = 0, False
while not stop:
    for batch in loader:
        if rank == 3 and SLOW == "cpu":
            spent = time.process_time()
            while time.process_time() - spent < 0.05:
                pass
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        flag = torch.tensor([float(os.path.exists("STOP") or time.monotonic() - started > 300)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            stop = True
            break
print(f"rank {{rank}} stopped after {{step}} steps", flush=True)
dist.destroy_process_group()
"""

STRAGGLER = r"straggler: rank 3 on node (t-main|t-worker-0) does (\d+(?:\.\d+)?)x the median work per step"


@pytest.mark.parametrize("slow, suggests", [("cpu", "CPU-bound"), ("data", "waiting on data")])
def test_a_slow_rank_is_named_a_straggler_once_by_run_status_and_top(tmp_path, slow, suggests):
    spec = write_spec(tmp_path, SCRIPT.format(slow=slow), nodes=2, extra_cluster={"processesPerNode": 2})
    env = {**os.environ, "LAUNCHER_HOME": str(tmp_path / "home"), "LAUNCHER_HEALTH_SAMPLE": "1",
           "LAUNCHER_HEALTH_WINDOW": "8"}
    run = LiveCli(["run", "-f", str(spec)], env, cwd=tmp_path)
    try:
        line = run.wait_for(STRAGGLER, timeout=240)
        run_id = run_id_from("\n".join(run.lines))
        node, ratio = re.search(STRAGGLER, line).groups()
        assert float(ratio) >= 1.3 and line.endswith(f": {suggests}"), line

        status = run_cli("status", run_id, "--json", env=env)
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert [(s["rank"], s["node"], s["suggests"]) for s in shown["stragglers"]] == [(3, node, suggests)]
        ranks = {entry["rank"]: entry for entry in shown["ranks"]}
        assert sorted(ranks) == [0, 1, 2, 3], ranks
        # every rank counted steps and has a rate (over the last 1 s interval, which on a loaded machine may hold
        # no step of a rank: 0 is a rate), and its last line's time
        assert all(entry["steps"] > 0 and isinstance(entry["steps_per_s"], (int, float)) and entry["last_line_at"]
                   for entry in ranks.values()), json.dumps(ranks, indent=1)
        assert all(record["cpu_percent"] is not None and record["rss_bytes"] > 0
                   for record in shown["nodes"].values()), shown["nodes"]

        top = run_cli("top", run_id, "--once", env=env)
        assert top.returncode == 0, top.stderr
        [rank_row] = [row for row in top.stdout.splitlines() if row.startswith("  rank 3 ")]
        assert "straggler" in rank_row, top.stdout
    finally:
        (tmp_path / "STOP").write_text("")
    code, output = run.finish(timeout=300)
    assert code == 0, output[-3000:]
    assert len(re.findall(STRAGGLER, output)) == 1, "named once, not on every poll"
    assert not re.search(r"straggler: rank [012] ", output), output[-3000:]
