"""How launcher.data splits an epoch among ranks: every rank the same number of steps, the stretches disjoint
and covering what is left; and under random checkpoints, deaths, prefetching and new world sizes, the model
lineage trains every index of the epoch exactly once. Pure: simulated ranks in one process."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from launcher.data import ElasticSampler
from launcher.data.intervals import complement, normalize, take, total
from launcher.data.plan import Plan, TooFewSamples, batch_sizes


@st.composite
def remaining_positions(draw):
    size = draw(st.integers(1, 120))
    cuts = sorted(draw(st.lists(st.integers(0, size), max_size=8)))
    done = normalize(zip(cuts[::2], cuts[1::2]))
    return size, complement(done, size)


@settings(max_examples=300, deadline=None)
@given(positions=remaining_positions(), world=st.integers(1, 6), batch_size=st.integers(1, 9))
def test_every_rank_takes_the_same_number_of_steps_over_disjoint_stretches_that_cover_the_rest(
        positions, world, batch_size):
    size, remaining = positions
    plan = Plan(remaining, world, size)
    left = total(remaining)
    if 0 < left < world:
        said = (f"the dataset has {left} samples for {world} training processes" if left == size else
                f"{left} samples of this epoch are left for {world} training processes")
        with pytest.raises(TooFewSamples, match=said):
            plan.steps(batch_size)
        return
    steps = plan.steps(batch_size)
    covered = []
    for rank in range(world):
        first, count = plan.share(rank)
        sizes = plan.batches(rank, batch_size)
        assert len(sizes) == steps and sum(sizes) == count and min(sizes, default=1) >= 1
        if steps * batch_size >= count:
            assert max(sizes, default=0) <= batch_size
        covered += plan.trained(rank, count)
    assert normalize(covered) == remaining and total(covered) == left  # no position twice
    assert steps == min(-(-left // (world * batch_size)), left // world)  # as few as batch_size allows


def test_batches_spread_a_stretch_evenly_and_intervals_are_taken_in_order():
    assert batch_sizes(10, 3) == [4, 3, 3] and batch_sizes(0, 0) == []
    assert take([(0, 3), (10, 14)], 2, 3) == [(2, 3), (10, 12)]
    assert complement([(2, 4)], 6) == [(0, 2), (4, 6)] and normalize([(3, 5), (0, 3), (7, 7)]) == [(0, 5)]


# -- the lineage under random checkpoints, deaths and world sizes -----------------------------------------

class SimulatedRank(ElasticSampler):
    """An ElasticSampler whose collective is the in-process group of simulated ranks (a stand-in for
    all_gather_object, so that hypothesis can drive many runs in one process)."""

    group: list["SimulatedRank"]

    def _gather(self, value):
        return [rank._run.consumed for rank in self.group]


def start_ranks(size: int, world: int, epoch: int, state, batch_size: int):
    group = [SimulatedRank(size, 4, seed=3, rank=r, world_size=world) for r in range(world)]
    for rank in group:
        rank.group = group
        rank._checked = True  # the start check's collective: every simulated rank loads the same state
        if state is not None:
            rank.load_state_dict(state)
        rank.set_epoch(epoch)
    return group, [rank.batches(batch_size) for rank in group], [[] for _ in group]


action = st.one_of(
    st.tuples(st.just("prefetch"), st.integers(0, 5), st.integers(1, 3)),
    st.tuples(st.just("step"), st.just(0), st.just(0)),
    st.tuples(st.just("checkpoint"), st.just(0), st.just(0)),
    st.tuples(st.just("die"), st.integers(1, 5), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 80), world=st.integers(1, 4), batch_size=st.integers(1, 6), epoch=st.integers(0, 2),
       actions=st.lists(action, max_size=40))
def test_every_index_of_an_epoch_is_trained_once_by_the_lineage(size, world, batch_size, epoch, actions):
    world = min(world, size)
    group, batches, prefetched = start_ranks(size, world, epoch, None, batch_size)
    trained: list[int] = []  # by the model since its last checkpoint
    checkpoint: tuple[dict | None, list[int]] = (None, [])

    def prefetch(r: int, count: int) -> bool:  # a DataLoader asks for batches ahead of the loop
        for _ in range(count):
            batch = next(batches[r], None)
            if batch is None:
                return False
            prefetched[r].append(batch)
        return True

    def step() -> bool:
        """Every rank trains its next batch (DDP: in lock-step); False once the epoch is over."""
        got = [bool(prefetched[r]) or prefetch(r, 1) for r in range(len(group))]
        assert len(set(got)) == 1, f"ranks disagree on whether there is another step: {got}"
        for r, rank in enumerate(group):
            if got[r]:
                trained.extend(prefetched[r].pop(0))
                rank.note_batch()
        return got[0]

    for kind, a, b in actions:
        if kind == "prefetch":
            prefetch(a % len(group), b)
        elif kind == "step":
            step()
        elif kind == "checkpoint":
            states = [rank.state_dict() for rank in group]
            assert all(state == states[0] for state in states)
            checkpoint = (states[0], checkpoint[1] + trained)
            trained = []
        else:  # a node died: training restarts from the checkpoint, maybe with another world size
            left = size - total(checkpoint[0]["done"]) if checkpoint[0] and checkpoint[0]["epoch"] == epoch else size
            if 0 < left < a:
                with pytest.raises(TooFewSamples):
                    next(start_ranks(size, a, epoch, checkpoint[0], batch_size)[1][0])
                a = left
            group, batches, prefetched = start_ranks(size, max(a, 1), epoch, checkpoint[0], batch_size)
            trained = []
    while step():
        pass
    lineage = checkpoint[1] + trained
    assert sorted(lineage) == list(range(size)), Counter(lineage).most_common(3)
    assert group[0].state_dict()["complete"]  # and the state at the end says so
