"""ElasticSampler and ElasticLoader: deterministic order, consumption counted through the DataLoader's
prefetching, resume with another world size mid-epoch, and DDP with uneven batch counts under Join,
with real torch.distributed (gloo) processes."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from launcher.data import ElasticLoader, ElasticSampler

N, SHARD, BATCH = 50, 5, 4


class Indices(Dataset):
    """Item i is i itself: a batch shows exactly which indices were trained."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


@pytest.fixture(autouse=True)
def outside_a_run(monkeypatch):
    for name in ("LAUNCHER_WORK_DIR", "LAUNCHER_RUN_ID", "LAUNCHER_ROUND", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_same_seed_same_order_and_each_epoch_its_own():
    first, second = ElasticSampler(N, SHARD, seed=7), ElasticSampler(N, SHARD, seed=7)
    orders = [[list(sampler) for _ in sampler.epochs(end=2)] for sampler in (first, second)]
    assert orders[0] == orders[1]
    assert orders[0][0] != orders[0][1] and sorted(orders[0][0]) == sorted(orders[0][1]) == list(range(N))
    plain = ElasticSampler(N, SHARD, shuffle=False)
    assert [list(plain) for _ in plain.epochs(end=1)] == [list(range(N))]


def test_two_ranks_get_whole_shards_of_the_same_order(tmp_path):
    ranks = [ElasticSampler(N, SHARD, seed=7, work_dir=str(tmp_path), rank=r, world_size=2) for r in range(2)]
    for rank in ranks:
        rank.set_epoch(0)
    got = [list(rank) for rank in ranks]
    order = list(ElasticSampler(N, SHARD, seed=7))
    shards = {tuple(order[k:k + SHARD]) for k in range(0, N, SHARD)}
    assert {tuple(part[k:k + SHARD]) for part in got for k in range(0, len(part), SHARD)} == shards


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_counts_what_reached_the_loop_not_what_was_prefetched(workers):
    sampler = ElasticSampler(N, SHARD, shuffle=False)
    loader = ElasticLoader(Indices(N), batch_size=BATCH, sampler=sampler, num_workers=workers)
    trained: list[int] = []
    for _ in sampler.epochs(end=1):
        for batch in loader:
            trained += batch.tolist()
            if len(trained) == 3 * BATCH:
                state = sampler.state_dict()
                break
    assert sampler._run.yielded > len(trained) if workers else True  # the workers had prefetched more
    assert state["done"] == [[0, 2]] and state["partial"] == {"2": 2} and not state["complete"]

    again = ElasticSampler(N, SHARD, shuffle=False)
    again.load_state_dict(state)
    rest = ElasticLoader(Indices(N), batch_size=BATCH, sampler=again, num_workers=workers)
    for epoch in again.epochs(end=1):
        assert epoch == 0
        trained += [i for batch in rest for i in batch.tolist()]
    assert trained == list(range(N))
    assert again.state_dict()["complete"]


def test_a_plain_dataloader_is_exact_without_workers_and_warns():
    sampler = ElasticSampler(N, SHARD, shuffle=False)
    loader = DataLoader(Indices(N), batch_size=BATCH, sampler=sampler)
    sampler.set_epoch(0)
    iterator = iter(loader)
    next(iterator), next(iterator)
    with pytest.warns(UserWarning, match="not read through launcher.data.ElasticLoader.*num_workers=0"):
        state = sampler.state_dict()
    assert state["done"] == [[0, 1]] and state["partial"] == {"1": 3}


def test_a_complete_epoch_is_skipped_and_resuming_starts_where_the_state_left_off():
    sampler = ElasticSampler(N, SHARD)
    for _ in sampler.epochs(end=1):
        list(sampler)
    state = sampler.state_dict()
    resumed = ElasticSampler(N, SHARD)
    resumed.load_state_dict(state)
    assert list(resumed.epochs(end=3)) == [1, 2]
    resumed = ElasticSampler(N, SHARD)
    resumed.load_state_dict(state)
    assert list(resumed.epochs(start=0, end=2)) == [1]


def test_many_processes_without_a_work_dir_are_refused(monkeypatch):
    monkeypatch.setenv("LAUNCHER_RUN_ID", "r1")
    with pytest.raises(RuntimeError, match="2 training processes must share their claims through a work dir, "
                                           "and LAUNCHER_WORK_DIR is not set"):
        ElasticSampler(N, SHARD, rank=0, world_size=2)


def test_a_state_of_other_settings_is_refused():
    state = ElasticSampler(N, SHARD).state_dict()
    with pytest.raises(ValueError, match="saved with shard_size=5, this sampler has shard_size=6"):
        ElasticSampler(N, 6).load_state_dict(state)


def test_a_loader_that_would_drop_indices_is_refused():
    with pytest.raises(ValueError, match="cannot drop_last"):
        ElasticLoader(Indices(N), batch_size=BATCH, sampler=ElasticSampler(N, SHARD), drop_last=True)


def test_a_work_dir_that_cannot_hold_claims_fails_the_loop_with_the_reason(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    sampler = ElasticSampler(N, SHARD, work_dir=str(blocker), rank=0, world_size=2)
    sampler.set_epoch(0)
    with pytest.raises(RuntimeError, match="could not claim data for epoch 0: work dir .*file"):
        list(sampler)
    sampler._close_run()


def test_inside_join_state_dict_is_taken_only_at_the_agreed_steps():
    sampler = ElasticSampler(N, SHARD, checkpoint_every=2)
    loader = ElasticLoader(Indices(N), batch_size=BATCH, sampler=sampler)
    sampler.set_epoch(0)
    sampler.join_hook()
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(RuntimeError, match="only every checkpoint_every=2 steps"):
        sampler.state_dict()
    next(iterator)
    assert sampler.checkpoint_due() and sampler.state_dict()["partial"]
    sampler._close_run()


# -- real torch.distributed: resume on another world size mid-epoch; uneven batches under Join ------------

DIST_N, DIST_SHARD, EVERY = 200, 8, 2


def _train(rank: int, world: int, round_number: int, workers: int, stop_at: int | None, tmp: str) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    os.environ["LAUNCHER_ROUND"] = str(round_number)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init-{round_number}", rank=rank, world_size=world)
    sampler = ElasticSampler(DIST_N, DIST_SHARD, seed=1, work_dir=f"{tmp}/wd", checkpoint_every=EVERY)
    state_file = Path(tmp, "state.pt")
    if state_file.exists():
        sampler.load_state_dict(torch.load(state_file))
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ElasticLoader(Indices(DIST_N), batch_size=BATCH, sampler=sampler, num_workers=workers)
    trained: list[int] = []
    states: list[dict] = []
    for _ in sampler.epochs(end=1):
        with Join([model, sampler]):
            for step, batch in enumerate(loader, 1):
                model(batch.float().unsqueeze(1)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                trained += batch.tolist()
                if sampler.checkpoint_due():
                    states.append(sampler.state_dict())
                    if step == stop_at:  # every rank "dies" here, after the checkpoint
                        if rank == 0:
                            torch.save(states[-1], state_file)
                        Path(tmp, f"trained-{round_number}-{rank}.json").write_text(json.dumps(trained))
                        dist.barrier()
                        os._exit(0)
    final = sampler.state_dict()  # after Join: every rank again
    weights = [None] * world
    dist.all_gather_object(weights, [p.detach().tolist() for p in model.parameters()])
    Path(tmp, f"trained-{round_number}-{rank}.json").write_text(json.dumps(trained))
    Path(tmp, f"result-{rank}.json").write_text(json.dumps({
        "steps": len(trained) // BATCH, "complete": final["complete"], "same_weights": weights.count(weights[0]) == world,
        "tail_state_complete": bool(states) and states[-1]["complete"]}))
    dist.barrier()


def _spawn(world: int, *args) -> None:
    # Ranks fork from a clean server process (forking this one, with its threads, can hang a child) that has
    # imported once what every rank needs: DDP's first use imports torch._dynamo, 4 s.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch._dynamo", "torch.distributed.algorithms.join", "launcher.data",
                                    "test_data_sampler"])
    procs = [context.Process(target=_train, args=(rank, world, *args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * world


def test_ddp_resumes_on_another_world_size_mid_epoch_and_uneven_ranks_finish_together(tmp_path):
    _spawn(2, 0, 2, 6, str(tmp_path))  # 2 ranks, DataLoader workers; all stop after step 6's checkpoint
    _spawn(3, 1, 0, None, str(tmp_path))  # 3 ranks resume from it and finish the epoch
    trained = [i for path in tmp_path.glob("trained-*.json") for i in json.loads(path.read_text())]
    assert sorted(trained) == list(range(DIST_N))
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("result-*.json"))]
    assert len({r["steps"] for r in results}) > 1, results  # uneven: Join had to carry the early ranks
    assert all(r["complete"] and r["same_weights"] for r in results)
    assert any(r["tail_state_complete"] for r in results)  # a checkpoint in the tail, joined ranks included
