"""The claim protocol of launcher.data: exactly one rank wins each unit (threads, processes, S3), and under
random interleavings, prefetching, deaths and rollback to the last state_dict() the model lineage trains
every index of the epoch exactly once, whatever world size comes next."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
from collections import Counter
from contextlib import contextmanager

from hypothesis import given, settings, strategies as st

from launcher.data import ElasticSampler
from launcher.data.claims import Claims, claim_all, claim_order
from launcher.node.store import WorkDir

UNITS = [f"{k}-0" for k in range(40)]


def claim_with_threads(url: str, ranks: int) -> list[list[str]]:
    won: list[list[str]] = [[] for _ in range(ranks)]
    start = threading.Barrier(ranks)

    def rank(r: int) -> None:
        claims = Claims(WorkDir(url), 0, "0.0", r)
        start.wait()
        won[r].extend(claim_all(claims, UNITS, r, ranks))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won


def assert_partition(won: list[list[str]]) -> None:
    everything = [unit for part in won for unit in part]
    assert sorted(everything) == sorted(UNITS), Counter(everything).most_common(3)


def test_one_winner_per_unit_among_threads(tmp_path):
    assert_partition(claim_with_threads(str(tmp_path / "run"), 4))


def _claim_in_process(url: str, rank: int, ranks: int, start, out) -> None:
    claims = Claims(WorkDir(url), 0, "0.0", rank)
    start.wait()
    out.put((rank, list(claim_all(claims, UNITS, rank, ranks))))


def test_one_winner_per_unit_among_processes(tmp_path):
    context = multiprocessing.get_context("fork")
    start, out = context.Barrier(3), context.Queue()
    procs = [context.Process(target=_claim_in_process, args=(str(tmp_path / "run"), r, 3, start, out))
             for r in range(3)]
    for proc in procs:
        proc.start()
    won = [out.get(timeout=30)[1] for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert_partition(won)


def test_claims_on_s3(s3_bucket):
    url = f"s3://{s3_bucket}/runs/r1"
    assert_partition(claim_with_threads(url, 3))
    # A create the store performed whose answer was lost reads "exists" on retry: the token tells it was ours.
    store = WorkDir(url)
    mine, other = Claims(store, 1, "0.0", 0), Claims(store, 1, "0.0", 1)
    store.create(f"{mine.prefix}/claims/7-0", mine.token)
    assert mine.claim("7-0") and not other.claim("7-0")


def test_ranks_start_at_their_own_stripe_and_steal_from_the_others_ends():
    own, steal = claim_order([str(u) for u in range(6)], rank=1, world=3)
    assert own == ["2", "3"] and steal == ["5", "4", "1", "0"]


# -- the whole protocol under random interleavings, deaths and rollbacks ----------------------------------

class SimulatedRank(ElasticSampler):
    """An ElasticSampler whose collective is the in-process group of simulated ranks (a stand-in for
    all_gather_object, so that hypothesis can drive many interleavings in one process)."""

    group: list["SimulatedRank"]

    def _gather(self, part):
        return [rank._run.offsets() for rank in self.group]


@contextmanager
def attempt(number: int):
    before = os.environ.get("LAUNCHER_ROUND")
    os.environ["LAUNCHER_ROUND"] = str(number)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LAUNCHER_ROUND", None)
        else:
            os.environ["LAUNCHER_ROUND"] = before


def start_ranks(work_dir: str, size: int, shard_size: int, world: int, number: int, epoch: int, state):
    with attempt(number):
        group = [SimulatedRank(size, shard_size, seed=3, prefetch=1 + r % 2, work_dir=work_dir, rank=r,
                               world_size=world) for r in range(world)]
    for rank in group:
        rank.group = group
        rank.counted = True  # as ElasticLoader does: the simulation tells what the loop trained
        if state is not None:
            rank.load_state_dict(state)
        rank.set_epoch(epoch)
    return group, [iter(rank) for rank in group], [[] for _ in group]


action = st.one_of(
    st.tuples(st.just("pull"), st.integers(0, 3), st.integers(1, 9)),
    st.tuples(st.just("train"), st.integers(0, 3), st.integers(1, 9)),
    st.tuples(st.just("checkpoint"), st.just(0), st.just(0)),
    st.tuples(st.just("die"), st.integers(1, 4), st.just(0)),
)


@settings(max_examples=120, deadline=None)
@given(size=st.integers(1, 70), shard_size=st.integers(1, 9), world=st.integers(1, 4), epoch=st.integers(0, 2),
       actions=st.lists(action, max_size=40))
def test_every_index_of_an_epoch_is_trained_once_by_the_lineage(size, shard_size, world, epoch, actions):
    work_dir = tempfile.mkdtemp(prefix="claims-")
    number = 0
    group, iterators, pending = start_ranks(work_dir, size, shard_size, world, number, epoch, None)
    trained: list[int] = []  # by the model since its last checkpoint
    checkpoint: tuple[dict | None, list[int]] = (None, [])

    def pull(r: int, count: int) -> None:  # the DataLoader prefetches
        for _ in range(count):
            index = next(iterators[r], None)
            if index is None:
                return
            pending[r].append(index)

    def train(r: int, count: int) -> None:
        batch, pending[r][:] = pending[r][:count], pending[r][count:]
        trained.extend(batch)
        group[r].note_batch(len(batch))

    try:
        for kind, a, b in actions:
            r = a % len(group)
            if kind == "pull":
                pull(r, b)
            elif kind == "train":
                train(r, b)
            elif kind == "checkpoint":
                states = [rank.state_dict() for rank in group]
                assert all(state == states[0] for state in states)
                checkpoint = (states[0], checkpoint[1] + trained)
                trained = []
            else:  # a node died: every training process restarts from the checkpoint, maybe with another size
                for rank in group:
                    rank._close_run()
                number += 1
                group, iterators, pending = start_ranks(work_dir, size, shard_size, a, number, epoch, checkpoint[0])
                trained = []
        while any(not rank._run.exhausted or pending[r] for r, rank in enumerate(group)):
            for r in range(len(group)):  # round-robin, so that ranks steal from each other
                pull(r, 2)
                train(r, 2)
        lineage = checkpoint[1] + trained
        assert sorted(lineage) == list(range(size)), Counter(lineage).most_common(3)
        assert group[0].state_dict()["complete"]  # and the state at the end says so
    finally:
        for rank in group:
            rank._close_run()
