"""What failures cost a run (launcher.runs.incidents): each round or attempt end that training came back from, its
time from the last step to every rank's first step after it, the steps trained again, and the run's ETTR. Pure:
records built by hand (a real run's figures are checked in tests/test_recovery.py)."""

from __future__ import annotations

import pytest

from launcher.protocol import events as node_events
from launcher.runs import incidents
from launcher.runs import timeline as tl

T0 = 1_000_000.0


def steps(node: str, rank: int, round_number: int, first: float, last: float | None, *, first_step: int | None,
          last_step: int | None, counted: int, attempt: int = 1) -> list[tl.Event]:
    """A rank's decision, first step and (where its round ended) last step, ``first``/``last`` seconds after submit."""
    found = [tl.Event(T0 + first - 1, node_events.DECIDED, node, round_number, attempt=attempt),
             tl.Event(T0 + first, node_events.FIRST_STEP, node, round_number, rank, attempt=attempt,
                      detail="report" if first_step else "optimizer", step=first_step)]
    if last is not None:
        found.append(tl.Event(T0 + last, node_events.LAST_STEP, node, round_number, rank, attempt=attempt,
                              step=last_step, steps=counted))
    return found


def recovered_run(reported: bool) -> tl.Timeline:
    """Two nodes train steps of 0.1 s from 2 s; w-0 dies at 5.5 s (last step 5.45 s, step 35 reported), the next
    round trains again at 7 s from the checkpoint of step 30, and the run ends at 12 s."""
    events = []
    for node, rank in (("m", 0), ("w-0", 1)):
        events += steps(node, rank, 0, 2.0, 5.45 if node == "m" else None, first_step=1 if reported else None,
                        last_step=35 if reported else None, counted=35)
        events += steps(node, rank, 1, 7.0 + rank * 0.1, 11.5, first_step=31 if reported else None,
                        last_step=60 if reported else None, counted=30)
    events += [tl.Event(T0 + 5.5, tl.DEATH, "w-0", 0, detail="lost: node process killed by SIGKILL"),
               tl.Event(T0 + 5.5, tl.ROUND_ENDED, None, 0, detail="node w-0: lost: node process killed by SIGKILL"),
               tl.Event(T0 + 6.0, tl.ROUND_DECIDED, None, 1), tl.Event(T0 + 12.0, tl.RECORDED, "m", 1)]
    return tl.Timeline("r", T0, ["m", "w-0"], sorted(events, key=lambda e: e.at), T0 + 30, recovering=True)


def test_an_incident_costs_the_time_from_its_last_step_to_training_again_and_the_steps_trained_twice():
    costs = incidents.costs(recovered_run(reported=True), {"m": 1, "w-0": 1}, ended_at=T0 + 12.0)
    [incident] = costs.incidents
    assert (incident.round, incident.kind, incident.node) == (1, "lost", "w-0")
    assert incident.lost_s == pytest.approx(7.1 - 5.45)  # the last rank's first step after it
    assert incident.recomputed_steps == 5  # 35 trained, resumed at 31
    assert incident.step_s == pytest.approx(3.45 / 34)  # first to last step of round 0, over the steps between
    assert incident.cost_s == pytest.approx(1.65 + 5 * 3.45 / 34)
    assert (costs.wall_s, costs.start_s, costs.training_s) == (12.0, 2.0, pytest.approx(9.5))
    assert costs.ettr == pytest.approx((9.5 - incident.cost_s) / 12.0)
    assert costs.accelerator_hours == pytest.approx(incident.cost_s * 2 / 3600)
    assert costs.line() == f"1 incident cost 2.2s, {costs.accelerator_hours:.2g} GPU-hours; ETTR {costs.ettr:.1%}"
    assert incident.line() == ("round 1 (lost: w-0): 1.7s from the last step to training again + 5 steps trained "
                               "again (0.5s) = 2.2s")
    assert costs.to_dict()["incidents"][0]["recomputed_steps"] == 5


def test_without_step_numbers_the_steps_trained_again_are_not_known_and_the_line_says_how_to_give_them():
    costs = incidents.costs(recovered_run(reported=False), {}, ended_at=T0 + 12.0)
    [incident] = costs.incidents
    assert incident.recomputed_steps is None and incident.cost_s == pytest.approx(1.65)
    assert incident.step_s == pytest.approx(3.45 / 34)  # from the counted steps
    assert "node-hours" in costs.line() and "launcher.data.report(step) gives them" in costs.line()


def test_an_undisturbed_run_reads_its_start_and_end_only():
    events = [*steps("m", 0, 0, 3.0, 9.0, first_step=None, last_step=None, counted=60),
              tl.Event(T0 + 10.0, tl.RECORDED, "m", 0)]
    costs = incidents.costs(tl.Timeline("r", T0, ["m"], events, T0 + 20), {"m": 0}, ended_at=T0 + 10.0)
    assert costs.incidents == [] and costs.ettr == pytest.approx(0.6)
    assert costs.line() == "no incident; ETTR 60.0% (its start took 3.0s)"


def test_a_running_run_counts_its_training_up_to_now_and_a_round_not_training_again_yet_costs_nothing_yet():
    timeline = recovered_run(reported=True)
    cut = [event for event in timeline.events if not (event.round == 1 and event.phase == node_events.FIRST_STEP)
           and event.phase != tl.RECORDED and not (event.round == 1 and event.phase == node_events.LAST_STEP)]
    costs = incidents.costs(tl.Timeline("r", T0, ["m", "w-0"], cut, T0 + 6.5, recovering=True), {}, ended_at=None)
    [incident] = costs.incidents
    assert incident.again_at is None and incident.cost_s is None
    assert incident.line() == "round 1 (lost: w-0): not training again (yet)"
    assert costs.training_s == pytest.approx(4.5) and costs.wall_s == pytest.approx(6.5)


def test_a_whole_run_retry_is_an_incident_of_its_attempt():
    events = [*steps("m", 0, 0, 2.0, 4.0, first_step=1, last_step=20, counted=20),
              tl.Event(T0 + 4.2, tl.ATTEMPT_ENDED, None, None, attempt=1, detail="node m: exit status 1"),
              *steps("m", 0, 0, 8.0, 10.0, first_step=11, last_step=30, counted=20, attempt=2),
              tl.Event(T0 + 10.5, tl.RECORDED, "m", 0, attempt=2)]
    costs = incidents.costs(tl.Timeline("r", T0, ["m"], events, T0 + 20, attempts=2), {}, ended_at=T0 + 10.5)
    [incident] = costs.incidents
    assert (incident.attempt, incident.kind, incident.cause) == (2, "attempt", "node m: exit status 1")
    assert incident.lost_s == pytest.approx(4.0) and incident.recomputed_steps == 10
    assert incident.line().startswith("attempt 2 (attempt): 4.0s from the last step to training again + 10 steps")


FAILS_ONCE = """
import os, time, torch, torch.distributed as dist
from launcher.data import report
dist.init_process_group("gloo")
rank, round_number = dist.get_rank(), int(os.environ["LAUNCHER_ROUND"])
path = os.path.join(os.environ["LAUNCHER_CHECKPOINT_DIR"], "step.pt")
step = torch.load(path)["step"] if os.path.exists(path) else 0
while step < 60:
    dist.all_reduce(torch.ones(1))
    time.sleep(0.1)
    step += 1
    report(step)
    print(f"round {round_number} rank {rank} step {step} at {time.time()}", flush=True)
    if step % 10 == 0 and rank == 0:
        torch.save({"step": step}, path + ".tmp")
        os.replace(path + ".tmp", path)
    if round_number == 0 and step == 35 and rank == 1:
        os._exit(3)
"""


@pytest.mark.slow
def test_a_real_runs_incident_is_reported_with_what_it_cost_within_a_second(tmp_path, launcher_home):
    """Rank 1 fails at step 35 of round 0; the next round resumes from the checkpoint of step 30. The job's own
    lines say when its last step before and every rank's first step after were: the cost launcher reports from its
    progress records (written once a second) is within a second and a half of that."""
    import json
    import re

    from clirun import run_id_from
    from cluster import write_spec
    from conftest import run_cli

    spec = write_spec(tmp_path, FAILS_ONCE, nodes=2,
                      extra_cluster={"recovery": {"maxRestarts": 1, "retryOn": ["failure"]}})
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:]
    steps_at = {(int(round_number), int(rank), int(step)): float(at) for round_number, rank, step, at in
                re.findall(r"round (\d) rank (\d) step (\d+) at ([\d.]+)", done.stdout)}
    stopped = max(steps_at[0, rank, 35] for rank in (0, 1))
    again = max(steps_at[1, rank, 31] for rank in (0, 1))  # every rank's first step after it
    step_s = (steps_at[0, 0, 35] - steps_at[0, 0, 1]) / 34
    run_id = run_id_from(done.stdout)
    costs = json.loads(run_cli("status", run_id, "--json").stdout)["costs"]
    [incident] = costs["incidents"]
    assert (incident["round"], incident["kind"], incident["node"]) == (1, "failure", "t-worker-0"), incident
    assert incident["recomputed_steps"] == 5, incident
    assert incident["step_s"] == pytest.approx(step_s, rel=0.5), (incident, step_s)
    assert incident["cost_s"] == pytest.approx(again - stopped + 5 * step_s, abs=1.5), (incident, again - stopped)
    assert 0 < costs["ettr"] < 1 and costs["start_s"] > 0
    text = run_cli("status", run_id).stdout
    assert re.search(r"^1 incident cost [\d.]+s, [\d.e-]+ node-hours; ETTR [\d.]+%$", text, re.M), text
    assert "round 1 (failure: t-worker-0):" in run_cli("timeline", run_id).stdout


def test_a_round_that_ends_before_it_trains_lasts_until_that_end_and_nothing_is_counted_twice():
    """w-0 dies at 5.5 s; round 1 is decided, but m dies at 6.5 s before round 1 trained; round 2 trains at 9 s from
    the checkpoint of step 30. Together they cost the last step (5.45 s) to 9 s, plus the 5 steps trained again."""
    events = []
    for node, rank in (("m", 0), ("w-0", 1)):
        events += steps(node, rank, 0, 2.0, 5.45 if node == "m" else None, first_step=1, last_step=35, counted=35)
        events.append(tl.Event(T0 + 6.1, node_events.DECIDED, node, 1))
        events += steps(node, rank, 2, 9.0, 11.5, first_step=31, last_step=50, counted=20)
    events += [tl.Event(T0 + 5.5, tl.DEATH, "w-0", 0, detail="lost: node process killed by SIGKILL"),
               tl.Event(T0 + 5.5, tl.ROUND_ENDED, None, 0, detail="node w-0: lost"),
               tl.Event(T0 + 6.0, tl.ROUND_DECIDED, None, 1),
               tl.Event(T0 + 6.5, tl.DEATH, "m", 1, detail="lost: node process killed by SIGKILL"),
               tl.Event(T0 + 6.5, tl.ROUND_ENDED, None, 1, detail="node m: lost"),
               tl.Event(T0 + 7.0, tl.ROUND_DECIDED, None, 2), tl.Event(T0 + 12.0, tl.RECORDED, "m", 2)]
    timeline = tl.Timeline("r", T0, ["m", "w-0"], sorted(events, key=lambda e: e.at), T0 + 30, recovering=True)
    first, second = incidents.costs(timeline, {}, ended_at=T0 + 12.0).incidents
    assert (first.round, first.trained_again, first.recomputed_steps) == (1, False, 5)
    assert first.lost_s == pytest.approx(6.5 - 5.45)  # until round 1 ended too
    assert (second.round, second.trained_again, second.recomputed_steps) == (2, True, 0)
    assert second.lost_s == pytest.approx(9.0 - 6.5)  # from that end to training again
    assert first.lost_s + second.lost_s == pytest.approx(9.0 - 5.45)
    assert first.line().startswith("round 1 (lost: w-0): 1.1s from the last step to its round's end, before it "
                                   "trained + 5 steps trained again")
    assert second.line() == "round 2 (lost: m): 2.5s from the end noticed to training again"


def test_training_begins_at_the_first_round_whose_ranks_stepped():
    """A fault ended round 0 before any rank stepped: the start lasts until round 1 trained."""
    events = [tl.Event(T0 + 1.0, node_events.DECIDED, "m", 0),
              tl.Event(T0 + 2.0, tl.DEATH, "w-0", 0, detail="lost: node process killed by SIGKILL"),
              tl.Event(T0 + 2.0, tl.ROUND_ENDED, None, 0, detail="node w-0: lost"),
              tl.Event(T0 + 2.5, tl.ROUND_DECIDED, None, 1),
              *steps("m", 0, 1, 4.0, 9.0, first_step=None, last_step=None, counted=50),
              tl.Event(T0 + 10.0, tl.RECORDED, "m", 1)]
    costs = incidents.costs(tl.Timeline("r", T0, ["m"], events, T0 + 20, recovering=True), {}, ended_at=T0 + 10.0)
    assert costs.start_s == pytest.approx(4.0) and costs.ettr == pytest.approx(0.5)
