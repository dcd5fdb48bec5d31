"""The chaos soak's training job (benchmarks/chaos.py): DDP on gloo over ``CHAOS_N`` indices an epoch with
``ElasticLoader``, a checkpoint every ``CHAOS_EVERY`` steps into ``LAUNCHER_CHECKPOINT_DIR``, and with each
checkpoint a ledger: the ids every rank trained in the steps it commits, gathered to rank 0. A step that was
trained but never committed (its node died before the next checkpoint) is not in the ledger, and the round after
trains it again from the checkpoint: the ledger of every epoch must hold each id exactly once.

Rank 0 also keeps ``counted_s``, the seconds the committed steps took (each commit adds the time since the step
before its first), so that the soak's ETTR counts only steps that count. What the harness reads from the log:

- ``chaos: round R rank K of W on NODE resumes at step S pid P``: every rank, at its start;
- ``chaos: round R step S``: rank 0, after each step it trained (S counts every step of the run's lineage);
- ``chaos: round R commit S``: rank 0, after each checkpoint (S its last step);
- ``chaos: done``: rank 0, after the last epoch; the ledger goes to the outputs as ``ledger.json``.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from launcher.data import ElasticLoader, ElasticSampler, report

N, BATCH = int(os.environ.get("CHAOS_N", "3000")), int(os.environ.get("CHAOS_BATCH", "8"))
EPOCHS, EVERY = int(os.environ.get("CHAOS_EPOCHS", "4")), int(os.environ.get("CHAOS_EVERY", "20"))
STEP_SECONDS = float(os.environ.get("CHAOS_STEP_S", "0.05"))


class Indices(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


dist.init_process_group("gloo")
rank, world, round_number = dist.get_rank(), dist.get_world_size(), os.environ.get("LAUNCHER_ROUND", "0")
path = os.path.join(os.environ["LAUNCHER_CHECKPOINT_DIR"], "chaos.pt")
local = torch.load(path, weights_only=False) if os.path.exists(path) else None
held = [None] * world
dist.all_gather_object(held, (local["step"] if local else -1, rank))  # the newest checkpoint any rank holds
newest, holder = max(held)
state = None
if newest >= 0:
    box = [local if rank == holder else None]
    dist.broadcast_object_list(box, src=holder)
    state = box[0]
state = state or {"step": 0, "model": None, "sampler": None, "ledger": {}, "counted_s": 0.0}

model = torch.nn.Linear(16, 1)
sampler = ElasticSampler(N, shard_size=50, shuffle=True, seed=0)
if state["model"] is not None:
    model.load_state_dict(state["model"])
    sampler.load_state_dict(state["sampler"])
print(f"chaos: round {round_number} rank {rank} of {world} on {os.environ.get('LAUNCHER_NODE_NAME')} resumes at "
      f"step {state['step']} pid {os.getpid()}", flush=True)
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
loader = ElasticLoader(Indices(), batch_size=BATCH, sampler=sampler)
step, pending, since = state["step"], [], time.time()


def commit(epoch: int, *, ends: bool = False) -> None:
    """Checkpoint the steps trained since the last commit, with every rank's ids of them (collective); ``ends``:
    the epoch's last, which keeps its ledger as a tensor (a long soak's checkpoint stays small)."""
    global pending, since
    progress = sampler.state_dict()  # collective
    trained = [None] * world
    dist.all_gather_object(trained, pending)
    if rank == 0:
        ledger = state["ledger"].setdefault(epoch, [])
        ledger.extend(index for ids in trained for index in ids)
        if ends:
            state["ledger"][epoch] = torch.tensor(ledger, dtype=torch.int32)
        now = time.time()
        state.update(step=step, model=model.state_dict(), sampler=progress, counted_s=state["counted_s"] + now - since)
        torch.save(state, os.path.join(os.path.dirname(path), ".chaos.pt"))  # a dot-name is never synced torn
        os.replace(os.path.join(os.path.dirname(path), ".chaos.pt"), path)
        print(f"chaos: round {round_number} commit {step}", flush=True)
    pending, since = [], time.time()


for epoch in sampler.epochs(end=EPOCHS):
    for batch in loader:
        inputs = torch.randn(len(batch), 16)
        ddp(inputs).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(STEP_SECONDS)
        step += 1
        report(step)  # the step numbers tell launcher the steps each incident trained again
        pending.extend(int(index) for index in batch)
        if rank == 0:
            print(f"chaos: round {round_number} step {step}", flush=True)
        if step % EVERY == 0:  # every rank takes the same steps: a collective is safe
            commit(epoch)
    commit(epoch, ends=True)

if rank == 0:
    with open(os.path.join(os.environ["LAUNCHER_OUTPUTS_DIR"], "ledger.json"), "w") as file:
        epochs = {str(epoch): [int(index) for index in ids] for epoch, ids in state["ledger"].items()}
        json.dump({"n": N, "epochs": epochs, "counted_s": state["counted_s"], "steps": step}, file)
    print("chaos: done", flush=True)
dist.destroy_process_group()
