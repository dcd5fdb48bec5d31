"""A training job whose model records which indices it trained: parameter w[i] counts the times index i was
trained in the current epoch (each step's gradient is 1 at the batch's indices; SGD with lr = world size
undoes DDP's averaging). w is checkpointed with the model, so it rolls back with it; at each epoch's end the
counts go to the outputs, and a test checks that every index was trained exactly once per epoch.

Rank 0 says at each epoch's start how many of its indices the model has trained already (after a restore: the
checkpoint's mid-epoch progress) and at each checkpoint how many it holds. With DATA_HOLD=EPOCH:STEP it stops
after that step of round 0, past its last checkpoint, until its node stops it: a test scales the run or kills a
node there, in the middle of an epoch whatever the machine's speed. With DATA_FREEZE=EPOCH it stops the whole
process (SIGSTOP: the sampler's record writer too) right after that epoch's end-of-epoch checkpoint, in whatever
round gets there: a test kills its node there, as if it died the moment the epoch ended, before the writer's next
pass (at most every 0.5 s) wrote the epoch's last counts. The round after resumes past that epoch: it happens once."""

import ctypes
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from launcher.data import ElasticLoader, ElasticSampler

N, SHARD, BATCH = int(os.environ.get("DATA_N", "480")), 16, 4
EPOCHS, EVERY = int(os.environ.get("DATA_EPOCHS", "5")), 5
WORKERS, STEP_SECONDS = int(os.environ.get("DATA_WORKERS", "0")), 0.03
HOLD, TORCHRUN, PR_SET_PDEATHSIG = os.environ.get("DATA_HOLD"), os.getppid(), 1
FREEZE = os.environ.get("DATA_FREEZE")


class Indices(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


class Recorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(N))

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return self.w[indices].sum()


dist.init_process_group("gloo")
rank, world, round_number = dist.get_rank(), dist.get_world_size(), os.environ.get("LAUNCHER_ROUND")
checkpoints, outputs = os.environ["LAUNCHER_CHECKPOINT_DIR"], os.environ["LAUNCHER_OUTPUTS_DIR"]
path = os.path.join(checkpoints, "state.pt")
# Every rank starts from the newest checkpoint any of them holds (the sampler's state must be the same on all).
local = torch.load(path) if os.path.exists(path) else None
saves = [None] * world
dist.all_gather_object(saves, (local["saves"] if local else -1, rank))
newest, holder = max(saves)
state = None
if newest >= 0:
    box = [local if rank == holder else None]
    dist.broadcast_object_list(box, src=holder)
    state = box[0]

model = Recorder()
sampler = ElasticSampler(N, shard_size=SHARD, shuffle=True, seed=0)
if state:
    model.load_state_dict(state["model"])
    sampler.load_state_dict(state["sampler"])
    print(f"rank {rank} of {world}: resuming epoch {state['sampler']['epoch']} (round {round_number})", flush=True)
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=float(world))
loader = ElasticLoader(Indices(), batch_size=BATCH, sampler=sampler, num_workers=WORKERS)
count = newest + 1


def trained() -> int:
    """How many indices of the current epoch the model has trained (the sum of the counts)."""
    return int(-model.w.detach().sum().round())


def hold(freeze: bool = False) -> None:
    """Wait until this process is stopped (the other ranks wait in their next step's allreduce): by its node, when
    a scale or a lost node ends round 0, or else with its torchrun. torch starts ranks in sessions of their own, and
    a killed node's supervisor kills torchrun's process group only, so a rank that torchrun had no time to stop
    would outlive the run. ``freeze``: stop every thread of the process now (SIGKILL still ends it)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != TORCHRUN:  # gone already
        os._exit(1)
    if freeze:
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(1)  # continued (SIGCONT): not by the test; end as a killed process would
    signal.pause()


def save() -> None:
    global count
    progress = sampler.state_dict()  # collective
    if rank == 0:
        torch.save({"saves": count, "model": model.state_dict(), "sampler": progress}, path + ".tmp")
        os.replace(path + ".tmp", path)
    count += 1


for epoch in sampler.epochs(end=EPOCHS):
    if not (state and state["sampler"]["epoch"] == epoch):
        with torch.no_grad():
            model.w.zero_()
    if rank == 0:
        print(f"rank 0: epoch {epoch} begins with {trained()} of {N} trained, world {world} round {round_number}",
              flush=True)
    for step, batch in enumerate(loader, 1):
        ddp(batch).backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(STEP_SECONDS)
        if step % EVERY == 0:  # every rank takes the same steps: a collective is safe
            save()
            print(f"rank {rank}: epoch {epoch} step {step} world {world} round {round_number} "
                  f"trained {trained()}", flush=True)
        if rank == 0 and round_number == "0" and HOLD == f"{epoch}:{step}":
            print(f"rank 0: holding at epoch {epoch} step {step}, trained {trained()}", flush=True)
            hold()
    if rank == 0:
        counts = (-model.w.detach()).round().int().tolist()
        with open(os.path.join(outputs, f".epoch-{epoch}.tmp"), "w") as handle:
            json.dump({"epoch": epoch, "round": round_number, "counts": counts}, handle)
        os.replace(os.path.join(outputs, f".epoch-{epoch}.tmp"), os.path.join(outputs, f"epoch-{epoch}.json"))
    save()
    print(f"rank {rank}: epoch {epoch} done", flush=True)
    if rank == 0 and FREEZE == str(epoch):
        print(f"rank 0: frozen at the end of epoch {epoch} in round {round_number}, trained {trained()}", flush=True)
        hold(freeze=True)
dist.barrier()
dist.destroy_process_group()
