"""ElasticSampler and ElasticLoader: deterministic order, equal steps on every rank, consumption counted
through the DataLoader's prefetching, the refusals, and DDP resuming with another world size mid-epoch with
real torch.distributed (gloo) processes and no Join."""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from launcher.data import ElasticLoader, ElasticSampler
from launcher.data.plan import TooFewSamples
from launcher.data.progress import read_progress
from launcher.protocol.store import WorkDir

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


def test_ranks_get_contiguous_stretches_of_the_same_order_in_equal_steps():
    order = list(ElasticSampler(N, SHARD, seed=7))
    ranks = [ElasticSampler(N, SHARD, seed=7, rank=r, world_size=3) for r in range(3)]
    got = []
    for rank in ranks:
        rank._checked = True  # no process group here: the start check is a collective
        rank.set_epoch(0)
        got.append(list(rank.batches(BATCH)))
    assert [len(batches) for batches in got] == [5, 5, 5]  # 17, 17 and 16 samples: 5 steps each
    assert [i for batches in got for batch in batches for i in batch] == order


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_counts_what_reached_the_loop_not_what_was_prefetched(workers, tmp_path):
    sampler = ElasticSampler(N, SHARD, shuffle=False, work_dir=str(tmp_path))
    loader = ElasticLoader(Indices(N), batch_size=BATCH, sampler=sampler, num_workers=workers)
    trained: list[int] = []
    epochs = sampler.epochs(end=1)
    for _ in epochs:
        for batch in loader:
            trained += batch.tolist()
            if len(trained) == 3 * BATCH:
                state = sampler.state_dict()
                break
        break
    assert sampler._run.handed_out > len(trained) if workers else True  # the workers had prefetched more
    assert state["done"] == [[0, 12]] and not state["complete"]
    epochs.close()  # writes the progress records now
    progress = read_progress(WorkDir(str(tmp_path)))
    assert [(p.shards, p.done, p.in_flight, p.left) for p in progress] == [(10, 2, 1, 7)]

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
    assert state["done"] == [[0, 8]]


def test_a_complete_epoch_is_skipped_and_resuming_starts_where_the_state_left_off():
    sampler = ElasticSampler(N, SHARD)
    for _ in sampler.epochs(end=1):
        list(sampler)
    state = sampler.state_dict()
    resumed = ElasticSampler(N, SHARD)
    resumed.load_state_dict(state)
    assert [epoch for epoch in resumed.epochs(end=3) if list(resumed)] == [1, 2]
    resumed = ElasticSampler(N, SHARD)
    resumed.load_state_dict(state)
    assert [epoch for epoch in resumed.epochs(start=0, end=2) if list(resumed)] == [1]


def test_many_processes_need_a_process_group_and_the_loader():
    sampler = ElasticSampler(N, SHARD, rank=0, world_size=2)
    with pytest.raises(RuntimeError, match="2 training processes needs torch.distributed initialized"):
        sampler.set_epoch(0)
    sampler._checked = True
    with pytest.raises(RuntimeError, match="must be read through launcher.data.ElasticLoader"):
        iter(sampler)


def test_ranks_that_start_from_different_states_are_refused():
    class Rank(ElasticSampler):
        def _gather(self, value):
            return [value, value + 1]

    with pytest.raises(RuntimeError, match=r"ranks start from different states \(ranks 1 differ from rank 0"):
        Rank(N, SHARD, rank=0, world_size=2).set_epoch(0)


def test_fewer_samples_left_than_ranks_is_refused_with_what_to_do():
    state = ElasticSampler(N, SHARD, shuffle=False).state_dict() | {"done": [[0, N - 1]]}
    sampler = ElasticSampler(N, SHARD, shuffle=False, rank=0, world_size=2)
    sampler.load_state_dict(state)
    sampler._checked = True
    sampler.set_epoch(0)
    with pytest.raises(TooFewSamples, match="epoch 0: 1 samples of this epoch are left for 2 training processes "
                                            r"\(the checkpoint holds the other 49 as trained\).*at most 1 process"):
        next(sampler.batches(BATCH))
    tiny = ElasticSampler(2, SHARD, rank=0, world_size=3)
    tiny._checked = True
    with pytest.raises(TooFewSamples, match="the dataset has 2 samples for 3 training processes.*at most 2"):
        next(tiny.batches(BATCH))


def test_a_second_pass_without_a_new_epoch_is_refused_and_leaving_early_is_said():
    sampler = ElasticSampler(N, SHARD)
    loader = ElasticLoader(Indices(N), batch_size=BATCH, sampler=sampler)
    with pytest.warns(UserWarning, match="epoch 0 ended with 46 of this rank's 50 samples untrained"):
        for _ in sampler.epochs(end=1):
            next(iter(loader))
    with pytest.raises(RuntimeError, match="epoch 0 was already iterated; call sampler.set_epoch"):
        list(loader)


def test_a_second_sampler_recording_in_the_same_run_is_named(tmp_path):
    first, second = ElasticSampler(N, SHARD, work_dir=str(tmp_path)), ElasticSampler(7, SHARD, work_dir=str(tmp_path))
    for _ in first.epochs(end=1):
        list(first)
    with pytest.warns(UserWarning, match=r"another ElasticSampler \(of 50 samples, not 7\).*records=False"):
        for _ in second.epochs(end=1):
            list(second)
    quiet = ElasticSampler(7, SHARD, work_dir=str(tmp_path), records=False)
    for _ in quiet.epochs(end=1):
        assert len(list(quiet)) == 7


def test_a_state_of_other_settings_is_refused():
    state = ElasticSampler(N, SHARD, seed=1).state_dict()
    with pytest.raises(ValueError, match="saved with seed=1, this sampler has seed=2"):
        ElasticSampler(N, SHARD, seed=2).load_state_dict(state)


@pytest.mark.parametrize("argument, message", [({"drop_last": True}, "cannot take drop_last"),
                                                ({"shuffle": True}, "shuffle=True conflicts"),
                                                ({"in_order": False}, "needs in_order=True")])
def test_a_loader_that_would_lose_or_reorder_indices_is_refused(argument, message):
    with pytest.raises(ValueError, match=message):
        ElasticLoader(Indices(N), batch_size=BATCH, sampler=ElasticSampler(N, SHARD), **argument)


def test_a_work_dir_that_cannot_hold_the_records_warns_and_training_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    sampler = ElasticSampler(N, SHARD, work_dir=str(blocker))
    trained = []
    with pytest.warns(UserWarning, match="progress records were not written to the work dir.*file"):
        for _ in sampler.epochs(end=1):
            trained += list(sampler)
    assert sorted(trained) == list(range(N))


# -- `launcher data` when an attempt is stopped before its writer's last pass -------------------------------

class _Stopped:
    """The work dir as a stopped process's writer sees it: nothing it writes from now on arrives."""

    def put(self, key, data):
        pass

    def create(self, key, data):
        return True


def _rank(monkeypatch, wd, rank: int, world: int, round_number: int, state=None) -> ElasticSampler:
    """Rank ``rank`` of attempt ``round_number``.0 (no process group: the start check is skipped)."""
    monkeypatch.setenv("LAUNCHER_ROUND", str(round_number))
    sampler = ElasticSampler(N, SHARD, shuffle=False, work_dir=str(wd), rank=rank, world_size=world)
    sampler._checked = True
    if state is not None:
        sampler.load_state_dict(state)
    return sampler


def _begin(sampler: ElasticSampler, epoch: int):
    """Begin ``epoch`` (closing the one before): its batches."""
    sampler.set_epoch(epoch)
    return sampler.batches(BATCH)


def _consume(sampler: ElasticSampler, batches, steps: int | None = None) -> None:
    """The loop receives ``steps`` more batches (all that are left by default)."""
    for step, _ in enumerate(batches, 1):
        sampler.note_batch()
        if step == steps:
            break


def _shown(wd) -> list[tuple[int, str, int, int, int, int]]:
    return [(p.epoch, p.attempt, p.shards, p.done, p.in_flight, p.left) for p in read_progress(WorkDir(str(wd)))]


def test_a_rank_stopped_before_its_last_count_of_an_epoch_was_written_shows_the_epoch_done(monkeypatch, tmp_path):
    # Attempt 1.0 (2 ranks) trains epoch 0 to its end. Rank 0's writer wrote its count after 5 of 7 steps; its
    # process is stopped (a node lost) early in epoch 1, before its next pass wrote the rest or the final count.
    # Rank 1's writer got to write its final count of epoch 0 and its start of epoch 1.
    first, second = (_rank(monkeypatch, tmp_path, rank, 2, 1) for rank in (0, 1))
    batches = _begin(first, 0)
    _consume(first, batches, 5)
    first._recorder.flush()
    first._recorder.store = _Stopped()
    _consume(first, batches)
    _consume(first, _begin(first, 1), 1)
    _consume(second, _begin(second, 0))
    _consume(second, _begin(second, 1), 1)
    second._recorder.flush()
    # Attempt 2.0 resumes epoch 1 from the checkpoint taken at its first step, and trains 2 steps of it.
    checkpoint = ElasticSampler(N, SHARD, shuffle=False)._state(1, [(0, BATCH), (25, 25 + BATCH)])
    resumed = _rank(monkeypatch, tmp_path, 0, 2, 2, checkpoint)
    _consume(resumed, _begin(resumed, 1), 2)
    resumed._recorder.flush()
    # Attempt 1.0's record of epoch 0 says rank 0 consumed 19 of its 25 samples (shard 3 of its 5 partly, shard
    # 4 not at all), but epoch 1 began in 1.0 and 2.0: every rank of 1.0 had consumed its whole stretch of epoch 0.
    assert _shown(tmp_path) == [(0, "1.0", 10, 10, 0, 0), (1, "2.0", 10, 2, 2, 6)]


def test_a_resume_from_a_checkpoint_of_a_complete_epoch_records_that_epoch_done(monkeypatch, tmp_path):
    # Attempt 0.0 trains the last epoch to its end and saves its checkpoint, but is stopped before its writer
    # wrote more than the count after 5 of 13 steps. Attempt 1.0 starts from that checkpoint: nothing to train.
    stopped = _rank(monkeypatch, tmp_path, 0, 1, 0)
    batches = _begin(stopped, 0)
    _consume(stopped, batches, 5)
    stopped._recorder.flush()
    stopped._recorder.store = _Stopped()
    _consume(stopped, batches)
    resumed = _rank(monkeypatch, tmp_path, 0, 1, 1, ElasticSampler(N, SHARD, shuffle=False)._state(0, [(0, N)]))
    assert list(resumed.epochs(end=1)) == []
    assert _shown(tmp_path) == [(0, "1.0", 10, 10, 0, 0)]
    assert [p.as_dict() for p in read_progress(WorkDir(str(tmp_path)), latest_only=True)] == [
        {"epoch": 0, "attempt": "1.0", "shards": 10, "done": 10, "in_flight": 0, "left": 0}]


def test_epochs_a_stopped_attempt_recorded_without_a_plan_or_not_at_all_show_done_once_the_lineage_went_on(
        monkeypatch, tmp_path):
    # Attempt 0.0 (2 ranks): rank 0's writer wrote epoch 0 and nothing after; rank 1's wrote epochs 0 and 1, not 2.
    # Both were stopped in epoch 3 after a checkpoint, from which attempt 1.0 resumes.
    first, second = (_rank(monkeypatch, tmp_path, rank, 2, 0) for rank in (0, 1))
    _consume(first, _begin(first, 0))
    first._recorder.flush()
    first._recorder.store = _Stopped()
    for epoch in (1, 2):
        _consume(first, _begin(first, epoch))
        _consume(second, _begin(second, epoch - 1))
    second._recorder.flush()
    second._recorder.store = _Stopped()
    _consume(second, _begin(second, 2))
    resumed = _rank(monkeypatch, tmp_path, 0, 2, 1, ElasticSampler(N, SHARD, shuffle=False)._state(3, [(0, 2)]))
    _consume(resumed, _begin(resumed, 3))  # rank 0's stretch: positions 2-25 (rank 1 records nothing)
    resumed._recorder.flush()
    assert _shown(tmp_path) == [(0, "0.0", 10, 10, 0, 0), (1, "0.0", 10, 10, 0, 0), (2, "-", 10, 10, 0, 0),
                                (3, "1.0", 10, 5, 1, 4)]


def test_ranks_that_left_an_epoch_early_show_it_partly_done_after_the_next_epoch_began(monkeypatch, tmp_path):
    ranks = [_rank(monkeypatch, tmp_path, rank, 2, 0) for rank in (0, 1)]
    for sampler in ranks:
        _consume(sampler, _begin(sampler, 0), 3)  # both leave after 3 steps (break): 12 of 25 samples each
        _consume(sampler, _begin(sampler, 1))
        sampler._recorder.flush()
    assert _shown(tmp_path) == [(0, "0.0", 10, 4, 2, 4), (1, "0.0", 10, 10, 0, 0)]


def test_a_pass_writes_an_ended_epochs_final_count_before_the_next_epochs_records(monkeypatch, tmp_path):
    from launcher.data.records import Recorder

    monkeypatch.setattr(Recorder, "_start", lambda self: None)  # no writer thread: the test takes the passes
    sampler = _rank(monkeypatch, tmp_path, 0, 1, 0)
    recorder = sampler._recorder
    _consume(sampler, _begin(sampler, 0), 2)
    _, due = recorder._due()
    assert [(key, value) for key, _, value in due][-1] == ("data/00000/0.0/progress/0.json", {"consumed": 8, "of": 50})
    _consume(sampler, _begin(sampler, 1), 1)
    _, due = recorder._due()
    assert [key for key, _, _ in due] == ["data/00000/0.0/progress/0.json", "data/00001/0.0/plan.json",
                                          "data/00001/0.0/progress/0.json"]
    assert due[0][2] == {"consumed": 8, "of": 50, "final": True}


# -- real torch.distributed: resume on another world size mid-epoch; equal steps, no Join -------------------

DIST_N, DIST_SHARD, CHECKPOINT_AT = 202, 8, 6


def _train(rank: int, world: int, round_number: int, workers: int, stop_at: int | None, tmp: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.setpgrp()  # what this rank starts (its DataLoader's workers) is in its group: _spawn stops them with it
    os.environ["LAUNCHER_ROUND"] = str(round_number)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init-{round_number}", rank=rank, world_size=world)
    sampler = ElasticSampler(DIST_N, DIST_SHARD, seed=1, work_dir=f"{tmp}/wd")
    state_file = Path(tmp, "state.pt")
    if state_file.exists():
        sampler.load_state_dict(torch.load(state_file))
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # Workers forked from the rank, as under torchrun (by default a process started by a forkserver, as this
    # one is, starts them through a forkserver of its own: seconds each on a busy machine).
    context = {"multiprocessing_context": "fork"} if workers else {}
    loader = ElasticLoader(Indices(DIST_N), batch_size=BATCH, sampler=sampler, num_workers=workers, **context)
    trained: list[int] = []
    steps = 0
    for _ in sampler.epochs(end=1):
        for batch in loader:  # no Join: a rank without a batch for a step the others take would hang them
            model(batch.float().unsqueeze(1)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            trained += batch.tolist()
            steps += 1
            if steps == stop_at:  # every rank "dies" here, after a checkpoint
                state = sampler.state_dict()
                if rank == 0:
                    torch.save(state, state_file)
                Path(tmp, f"trained-{round_number}-{rank}.json").write_text(json.dumps(trained))
                dist.barrier()
                os._exit(0)
    final = sampler.state_dict()
    weights = [None] * world
    dist.all_gather_object(weights, [p.detach().tolist() for p in model.parameters()])
    Path(tmp, f"trained-{round_number}-{rank}.json").write_text(json.dumps(trained))
    Path(tmp, f"result-{rank}.json").write_text(json.dumps({
        "steps": steps, "complete": final["complete"], "same_weights": weights.count(weights[0]) == world}))
    dist.barrier()


def _spawn(world: int, *args) -> None:
    # Ranks fork from a clean server process (forking this one, with its threads, can hang a child) that has
    # imported once what every rank needs: DDP's first use imports torch._dynamo, 4 s.
    # A rank that "dies" (os._exit) leaves its DataLoader's workers behind; one that fails or hangs, all it
    # started. Each rank leads a process group of its own (see _train), stopped here whether the ranks ended
    # well or not. (Started through a forkserver of the rank's, as they were, its workers waited for that
    # server and the server for them, for ever.)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch._dynamo", "launcher.data", "test_data_sampler"])
    procs = [context.Process(target=_train, args=(rank, world, *args)) for rank in range(world)]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=60)
        assert [proc.exitcode for proc in procs] == [0] * world
    finally:
        for proc in procs:
            if proc.pid is not None:
                proc.kill()  # one still running (a failure); before its group, which it may not have made yet
                proc.join(10)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:  # nothing of it is left
                    pass


@pytest.fixture
def forkserver():
    """This test's forkserver (and the resource tracker it starts) stopped after it, not at the session's end."""
    tracker = multiprocessing.resource_tracker._resource_tracker
    had_tracker = tracker._fd is not None
    yield
    multiprocessing.forkserver._forkserver._stop()  # waits for it: its children (the ranks) are gone
    if not had_tracker:
        tracker._stop()  # likewise: nothing that holds its pipe is left


def test_ddp_resumes_on_another_world_size_mid_epoch_in_equal_steps(forkserver, tmp_path):
    _spawn(2, 0, 2, CHECKPOINT_AT, str(tmp_path))  # 2 ranks, DataLoader workers; all stop after step 6
    _spawn(3, 1, 0, None, str(tmp_path))  # 3 ranks resume from it and finish the epoch
    trained = [i for path in tmp_path.glob("trained-*.json") for i in json.loads(path.read_text())]
    assert sorted(trained) == list(range(DIST_N))
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("result-*.json"))]
    left = DIST_N - 2 * CHECKPOINT_AT * BATCH  # 154, split 52, 51, 51: 13 steps each
    assert [r["steps"] for r in results] == [-(-left // (3 * BATCH))] * 3, results
    assert all(r["complete"] and r["same_weights"] for r in results)
