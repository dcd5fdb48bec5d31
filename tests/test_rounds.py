"""Membership rounds (launcher.protocol.rounds) on a real local work dir, nodes as threads: every node that
trains in a round was given the same members; lost members leave, joiners come in at the next round;
the recovery policy decides restarts and when to stop."""

from __future__ import annotations

import random
import threading
import time

import json

import pytest
from hypothesis import given, settings, strategies as st

from cluster import write_spec
from conftest import run_cli

from launcher.protocol.rendezvous import PollPolicy, Registration
from launcher.protocol.rounds import Rounds, Superseded, Timing, grouped_history, latest_round
from launcher.protocol.store import WorkDir
from launcher.protocol.recovery import FAILURE, JOIN, KILLED, LOST, PEER, Policy, RoundEnd
from launcher.runs.state import RunInfo
from launcher.runs.view import RunView, closing_line

NODES = ["m", "w-0", "w-1"]
FAST = Timing(settle=0.3, first_settle=0.5, end_check=0.05)


def rounds_of(store: WorkDir, policy: Policy, grows: str | None = None) -> Rounds:
    return Rounds(store, NODES, policy, FAST, grows=grows)


def join_all(store: WorkDir, policy: Policy, names: list[str], number: int, delays: dict[str, float] | None = None,
             grows: str | None = None):
    """Every node in ``names`` joins round ``number`` at once (after its delay); their rounds, by node.
    ``grows``: the group `launcher scale` adds nodes to (tests/test_scale.py)."""
    results: dict[str, object] = {}

    def join(name: str) -> None:
        time.sleep((delays or {}).get(name, 0.0))
        me = Registration(name, "127.0.0.1", 1000 + NODES.index(name))
        results[name] = rounds_of(store, policy, grows).join(number, me, timeout=20,
                                                             poll=PollPolicy(initial=0.01, cap=0.02))

    threads = [threading.Thread(target=join, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.fixture
def store(tmp_path) -> WorkDir:
    return WorkDir(str(tmp_path / "run"))


def test_the_first_round_has_everyone_in_the_specs_order(store):
    joined = join_all(store, Policy(2, min_nodes=2), NODES, 0, delays={"m": 0.2})
    assert {r.number for r in joined.values()} == {0}
    decision = joined["w-1"].decision
    assert decision.ranks == {"m": 0, "w-0": 1, "w-1": 2} and decision.main == "m"
    assert all(r == joined["m"] for r in joined.values())


def test_a_lost_member_leaves_at_once_and_counts_as_a_restart(store):
    join_all(store, Policy(2, min_nodes=2), NODES, 0)
    rounds_of(store, Policy(2, min_nodes=2)).end(0, RoundEnd("w-1", LOST, "killed", 137, time.time()))
    started = time.monotonic()
    joined = join_all(store, Policy(2, min_nodes=2), ["m", "w-0"], 1)
    assert time.monotonic() - started < FAST.settle  # no settling: every member that was not lost is there
    assert list(joined["m"].decision.ranks) == ["m", "w-0"] and joined["m"].restarts == 1
    assert joined["m"].history == ("round 0: node w-1: killed",)


def test_a_node_whose_training_process_was_killed_is_expected_in_the_next_round(store):
    policy = Policy(2, min_nodes=2)
    join_all(store, policy, NODES, 0)
    rounds_of(store, policy).end(0, RoundEnd("w-1", KILLED, "rank 2's training process was killed (SIGKILL)", 137,
                                             time.time()))
    joined = join_all(store, policy, NODES, 1, delays={"w-1": FAST.settle / 2})  # a lost node's round would not wait
    assert list(joined["m"].decision.ranks) == NODES and joined["m"].restarts == 1
    assert joined["m"].history == ("round 0: node w-1: rank 2's training process was killed (SIGKILL)",)


def test_a_lost_member_being_replaced_is_waited_for_up_to_the_replacement_wait(store):
    policy = Policy(2, min_nodes=2, replacement_wait=2.0)
    join_all(store, policy, NODES, 0)
    rounds_of(store, policy).end(0, RoundEnd("w-1", LOST, "killed", 137, time.time(), replaced=True))
    # its replacement registers well after the settle time (a Slurm job the scheduler starts seconds later)
    joined = join_all(store, policy, NODES, 1, delays={"w-1": 3 * FAST.settle})
    assert list(joined["m"].decision.ranks) == NODES, "one round with the replacement, not one its join ends"
    assert joined["m"].restarts == 1
    rounds_of(store, policy).end(1, RoundEnd("w-1", LOST, "killed", 137, time.time(), replaced=True))
    started = time.monotonic()
    joined = join_all(store, policy, ["m", "w-0"], 2)  # a replacement that never comes: the round goes on
    assert list(joined["m"].decision.ranks) == ["m", "w-0"] and joined["m"].restarts == 2
    assert policy.replacement_wait <= time.monotonic() - started < policy.replacement_wait + 5


def test_a_lost_record_written_after_the_survivors_began_waiting_is_still_read(store):
    policy = Policy(2, min_nodes=2, replacement_wait=10.0)
    join_all(store, policy, NODES, 0)
    rounds_of(store, policy).end(0, RoundEnd("w-0", PEER, "lost a peer", 1, time.time()))  # a survivor, first
    recorded = threading.Timer(FAST.settle / 2, rounds_of(store, policy).end,
                               (0, RoundEnd("w-1", LOST, "killed", 137, time.time(), replaced=True)))
    recorded.start()
    joined = join_all(store, policy, NODES, 1, delays={"w-1": 4 * FAST.settle})
    recorded.join()
    assert list(joined["m"].decision.ranks) == NODES


def test_the_replacement_wait_goes_from_the_spec_to_every_nodes_policy(tmp_path):
    spec = write_spec(tmp_path, "print('x')\n", nodes=3, extra_cluster={"elastic": {"minNodes": 2, "maxNodes": 3}})

    def waits(*overrides: str) -> list[float]:
        done = run_cli("run", "-f", str(spec), "--dry-run", "--output", "json", *overrides)
        assert done.returncode == 0, done.stderr
        return [Policy.from_settings(json.loads(node["env"]["LAUNCHER_RECOVERY"])).replacement_wait
                for node in json.loads(done.stdout)["nodes"]]

    assert waits() == [30.0] * 3
    assert waits("--set", "spec.cluster.spec.recovery.replacementWait=5") == [5.0] * 3
    bad = run_cli("run", "-f", str(spec), "--dry-run", "--set", "spec.cluster.spec.recovery.replacementWait=-1")
    assert bad.returncode == 2 and "spec.cluster.spec.recovery.replacementWait: must be an integer from 0 to 86400" \
        in bad.stderr, bad.stderr


def test_a_lost_member_that_is_not_replaced_is_not_waited_for(store):
    policy = Policy(2, min_nodes=2, replacement_wait=10.0)
    join_all(store, policy, NODES, 0)
    rounds_of(store, policy).end(0, RoundEnd("w-1", LOST, "killed", 137, time.time()))
    rounds_of(store, policy).end(0, RoundEnd("w-0", PEER, "lost a peer", 1, time.time()))
    started = time.monotonic()
    joined = join_all(store, policy, ["m", "w-0"], 1)
    assert list(joined["m"].decision.ranks) == ["m", "w-0"] and time.monotonic() - started < 5


def test_the_main_can_be_lost_too(store):
    join_all(store, Policy(1, min_nodes=2), NODES, 0)
    rounds_of(store, Policy(1, min_nodes=2)).end(0, RoundEnd("m", LOST, "killed", 137, time.time()))
    joined = join_all(store, Policy(1, min_nodes=2), ["w-0", "w-1"], 1)
    assert joined["w-0"].decision.main == "w-0" and joined["w-0"].decision.ranks == {"w-0": 0, "w-1": 1}


def test_a_node_that_missed_a_decision_ends_that_round_and_joins_the_next_without_a_restart(store):
    policy = Policy(0, min_nodes=2)
    join_all(store, policy, ["m", "w-0"], 0)  # decided after settling, without w-1
    late: dict[str, object] = {}
    thread = threading.Thread(target=lambda: late.update(joined=rounds_of(store, policy).join(
        0, Registration("w-1", "127.0.0.1", 1002), timeout=20, poll=PollPolicy(initial=0.01, cap=0.02))))
    thread.start()
    deadline = time.monotonic() + 10
    while not rounds_of(store, policy).ended(0) and time.monotonic() < deadline:
        time.sleep(0.01)  # the members learn of the joiner from the round's end marker, as the nodes do
    assert [end.kind for end in rounds_of(store, policy).ends(0)] == [JOIN]
    joined = join_all(store, policy, ["m", "w-0"], 1)
    thread.join(10)
    assert late["joined"].number == 1 and late["joined"] == joined["m"]
    assert list(joined["m"].decision.ranks) == NODES and joined["m"].restarts == 0  # a join uses no restart


def test_a_replacement_started_while_its_node_still_runs_takes_its_place_and_the_older_start_ends(store):
    """Two starts of one node at once (an engine's follower that misread a loss): the newer one trains, the older
    one ends, and the run goes on; before, each one's join ended the round the other was a member of, for ever."""
    policy = Policy(2, min_nodes=2)
    join_all(store, policy, NODES, 0)  # w-1's first start is a member of round 0
    fast = PollPolicy(initial=0.01, cap=0.02)
    outcome: dict[str, object] = {}

    def join(key: str, number: int, registration: Registration) -> None:
        try:
            outcome[key] = rounds_of(store, policy).join(number, registration, timeout=20, poll=fast)
        except Superseded as exc:
            outcome[key] = exc

    newer = threading.Thread(target=join, args=("newer", 0, Registration("w-1", "127.0.0.1", 1012, incarnation=1)))
    newer.start()
    deadline = time.monotonic() + 10
    while not store.list("rounds/00001/nodes") and time.monotonic() < deadline:
        time.sleep(0.01)  # it ended round 0 by joining, and waits in round 1
    assert [end.kind for end in rounds_of(store, policy).ends(0)] == [JOIN]
    others = [threading.Thread(target=join, args=(name, 1, Registration(name, "127.0.0.1", 1000 + NODES.index(name))))
              for name in NODES]  # round 0's members, the older w-1 among them, meet in round 1
    for thread in others:
        thread.start()
    for thread in [*others, newer]:
        thread.join(30)
    assert isinstance(outcome["w-1"], Superseded) and "incarnation 1 of node w-1" in str(outcome["w-1"])
    assert outcome["newer"] == outcome["m"] == outcome["w-0"] and outcome["m"].number == 1
    assert list(outcome["m"].decision.ranks) == NODES and outcome["m"].restarts == 0
    assert not rounds_of(store, policy).ended(1)  # nobody's join ends the round the newer start trains in


def test_a_static_round_waits_for_the_replacement(store):
    policy = Policy(1, min_nodes=3)  # static: every node, always
    join_all(store, policy, NODES, 0)
    rounds_of(store, policy).end(0, RoundEnd("w-0", LOST, "killed", 137, time.time(), replaced=True))
    joined = join_all(store, policy, NODES, 1, delays={"w-0": 0.8})  # the replacement comes later than settle
    assert list(joined["m"].decision.ranks) == NODES and joined["m"].restarts == 1


@pytest.mark.parametrize("policy, ends, give_up", [
    (Policy(2), [RoundEnd("w-0", FAILURE, "rank 1: ValueError: bad", 1, 1.0)],
     "not retried (exit status 1 is not in recovery.retryOn): node w-0: rank 1: ValueError: bad"),
    (Policy(2, retry_on=("lost", 3)), [RoundEnd("w-0", FAILURE, "exit 3", 3, 1.0)], None),
    (Policy(2, retry_on=("failure",)), [RoundEnd("w-0", FAILURE, "x", 1, 1.0), RoundEnd("m", PEER, "lost", 1, 0.5)],
     None),
    (Policy(0), [RoundEnd("w-0", LOST, "killed", 137, 1.0)], "gave up after 0 of 0 restarts: node w-0: killed"),
    (Policy(1), [RoundEnd("w-0", KILLED, "rank 1's training process was killed (SIGKILL)", 137, 1.0)], None),
    (Policy(1, retry_on=("failure",)), [RoundEnd("w-0", KILLED, "rank 1's ...", 137, 1.0)],
     "not retried (a training process killed from outside (lost) is not in recovery.retryOn): node w-0: rank 1's ..."),
])
def test_the_policy_decides_which_ends_are_retried(policy, ends, give_up):
    assert policy.next_round(ends, 0)[1] == give_up


def test_the_run_stops_when_its_restarts_are_used_up(store):
    policy = Policy(1, retry_on=("failure",), min_nodes=2)
    join_all(store, policy, ["m", "w-0"], 0)
    for number in (0, 1):
        rounds_of(store, policy).end(number, RoundEnd("w-0", FAILURE, f"rank 1: ValueError (round {number})", 1,
                                                      time.time()))
        joined = join_all(store, policy, ["m", "w-0"], number + 1)
    final = joined["m"]
    assert final.give_up == "gave up after 1 of 1 restarts: node w-0: rank 1: ValueError (round 1)"
    assert final.cause.node == "w-0" and final.cause.reason == "rank 1: ValueError (round 1)"  # not m, who says so
    assert final.history == ("round 0: node w-0: rank 1: ValueError (round 0)",
                             "round 1: node w-0: rank 1: ValueError (round 1)")
    assert latest_round(store) == final


def test_a_static_run_whose_restarts_are_used_up_stops_at_once_naming_the_lost_node(store):
    """Restarts used up and the lost node not replaced: the two left can never make the three a static round
    needs, so the round is decided as the run's stop as soon as the loss is on record, not at the timeout."""
    policy = Policy(1, min_nodes=3)
    join_all(store, policy, NODES, 0)
    rounds_of(store, policy).end(0, RoundEnd("w-0", LOST, "node process killed by SIGKILL", 137, time.time(),
                                             replaced=True))
    join_all(store, policy, NODES, 1)
    rounds_of(store, policy).end(1, RoundEnd("w-0", LOST, "node process killed by SIGKILL", 137, time.time()))
    started = time.monotonic()
    joined = join_all(store, policy, ["m", "w-1"], 2)  # a 20 s rendezvous timeout
    assert time.monotonic() - started < 2.0
    final = joined["m"]
    assert final == joined["w-1"] and final.decision is None and not final.short_of_nodes
    assert final.give_up == "gave up after 1 of 1 restarts: node w-0: node process killed by SIGKILL"
    assert final.cause.node == "w-0" and final.history[-1] == "round 1: node w-0: node process killed by SIGKILL"


def test_a_round_that_can_never_have_min_nodes_stops_the_run_at_once(store):
    """Restarts left, but a lost node that no one replaces (a backend that cannot) leaves fewer than minNodes."""
    policy = Policy(3, min_nodes=3)
    join_all(store, policy, NODES, 0)
    rounds_of(store, policy).end(0, RoundEnd("w-1", LOST, "node process killed by SIGKILL", 137, time.time()))
    started = time.monotonic()
    joined = join_all(store, policy, ["m", "w-0"], 1)
    assert time.monotonic() - started < 2.0
    final = joined["w-0"]
    assert final.decision is None and final.cause.node == "w-1" and final.short_of_nodes
    assert final.give_up == ("round 1 cannot start: 2 nodes left (m, w-0), fewer than recovery.minNodes (3), and no "
                             "replacement is coming: node w-1: node process killed by SIGKILL")


def test_a_round_waits_for_a_replacement_that_is_coming_even_below_min_nodes(store):
    policy = Policy(3, min_nodes=3)
    join_all(store, policy, NODES, 0)
    rounds_of(store, policy).end(0, RoundEnd("w-1", LOST, "killed", 137, time.time(), replaced=True))
    joined = join_all(store, policy, NODES, 1, delays={"w-1": 1.0})
    assert list(joined["m"].decision.ranks) == NODES and joined["m"].restarts == 1


def test_a_stopped_runs_summary_names_the_cause_and_says_each_cause_once(store, tmp_path):
    """Every rank raises the same error in every round: the summary's headline names the node whose end stopped the
    run, not the one that obeyed; each round is listed once, and a cause seen by several nodes once."""
    policy = Policy(1, retry_on=("failure",), min_nodes=2)
    join_all(store, policy, ["m", "w-0"], 0)
    for number in (0, 1):
        for rank, node in enumerate(["w-0", "m"]):
            rounds_of(store, policy).end(number, RoundEnd(node, FAILURE, f"rank {rank}: ValueError: bad\n    at "
                                                          "job.py:3", 1, time.time()))
        joined = join_all(store, policy, ["m", "w-0"], number + 1)
    final = joined["m"]
    assert final.history[0] == "round 0: node w-0: rank 0: ValueError: bad\n    at job.py:3\n    on node m too"
    marker = {"node": "m", "rank": 0, "exit_code": 1, "reason": final.give_up, "at": 1.0, **final.failure_details()}
    info = RunInfo("r", "local", str(tmp_path), ["m", "w-0"], "", "", 0.0)
    statuses = {name: {"state": "failed", "reason": final.give_up} for name in ["m", "w-0"]}
    summary = closing_line(RunView(info, statuses, None, [marker], None, {}))
    assert summary == ("run r failed: node w-0 exited with status 1\n"
                       "  cause: gave up after 1 of 1 restarts: node w-0: rank 0: ValueError: bad\n    at job.py:3\n"
                       "  rounds 0 and 1: the same cause\n    on node m too")
    assert grouped_history(final.history) == [f"rounds 0 and 1: {final.history[0].split(': ', 1)[1]}"]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(0, 0.3), min_size=3, max_size=3), st.integers(0, 2**32 - 1))
def test_every_node_of_a_round_gets_the_same_members_whatever_the_timing(tmp_path_factory, delays, seed):
    store = WorkDir(str(tmp_path_factory.mktemp("run")))
    policy = Policy(3, min_nodes=2)
    names = random.Random(seed).sample(NODES, 3)
    joined = join_all(store, policy, names, 0, delays=dict(zip(names, delays)))
    by_round: dict[int, list] = {}
    for result in joined.values():
        by_round.setdefault(result.number, []).append(result)
    for same_round in by_round.values():
        assert all(result == same_round[0] for result in same_round)
    for name, result in joined.items():
        assert name in result.decision.ranks  # nobody trains in a round it is not a member of
