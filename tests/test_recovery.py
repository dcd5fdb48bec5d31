"""Recovery through the real CLI, real torchrun and real processes on the local backend: elastic runs go on
when a node (worker or main) or one training process is killed, lost nodes are replaced, static runs with
restarts resume from their checkpoint, and a failure that happens every time is not retried forever.

The job trains a tiny model whose every step averages the same gradient on every rank, so its final
weights do not depend on who was there but on every epoch having run exactly once: one repeated or
skipped epoch changes them. It checkpoints through LAUNCHER_CHECKPOINT_DIR and resumes from it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from clirun import Watcher, run_id_from, wait_until
from cluster import write_spec
from conftest import run_cli

pytestmark = pytest.mark.slow

EPOCHS = 30
JOB = f"""
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
checkpoints = os.environ["LAUNCHER_CHECKPOINT_DIR"]
path = os.path.join(checkpoints, "state.pt")
state = torch.load(path) if os.path.exists(path) else {{"epoch": 0, "w": torch.zeros(4)}}
w = torch.nn.Parameter(state["w"])
optimizer = torch.optim.SGD([w], lr=0.1)  # its steps are what launcher counts as the job's
print(f"rank {{rank}} of {{world}}: resuming after epoch {{state['epoch']}}", flush=True)
for epoch in range(state["epoch"] + 1, {EPOCHS} + 1):
    if os.environ.get("FAIL_AT") == str(epoch) and rank == 1:
        raise ValueError(f"bad batch at epoch {{epoch}}")
    grad = w.detach() - 1.0
    dist.all_reduce(grad)
    w.grad = grad / world
    optimizer.step()
    time.sleep(0.3)
    if rank == 0:
        torch.save({{"epoch": epoch, "w": w.detach()}}, os.path.join(checkpoints, ".state.tmp"))
        os.replace(os.path.join(checkpoints, ".state.tmp"), path)
        torch.save(w.detach(), os.path.join(os.environ["LAUNCHER_OUTPUTS_DIR"], "model.pt"))
    print(f"rank {{rank}}: epoch {{epoch}}", flush=True)
dist.destroy_process_group()
"""
EXPECTED = 1 - 0.9 ** EPOCHS  # every weight, after EPOCHS steps from 0 towards 1 with rate 0.1
ELASTIC = {"elastic": {"minNodes": 2, "maxNodes": 3, "maxRestarts": 3}}


def start(tmp_path: Path, nodes: int, cluster: dict, env: list | None = None) -> tuple[str, Watcher]:
    spec = write_spec(tmp_path, JOB, nodes=nodes, extra_cluster=cluster, env=env)
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    return run_id, Watcher(run_id, dict(os.environ))


def node_pid(home: Path, run_id: str, node: str) -> int:
    return json.loads((home / "runs" / run_id / "processes.json").read_text())["nodes"][node]["pid"]


def training_pid(tmp_path: Path, run_id: str, node: str) -> int:
    """The training process of ``node`` (local rank 0), from the file its stack hook writes."""
    status = json.loads((tmp_path / "wd" / run_id / "status" / f"{node}.json").read_text())
    return int((Path(status["training_logs"]) / "stacks" / "0.stack").read_text().split()[1])


def final_weights(tmp_path: Path, run_id: str) -> torch.Tensor:
    models = sorted((tmp_path / "wd" / run_id / "outputs").glob("*/model.pt"), key=lambda p: p.stat().st_mtime)
    return torch.load(models[-1])


def finish(watcher: Watcher) -> str:
    code, output = watcher.finish(timeout=240)
    assert code == 0, output[-4000:]
    return output


@pytest.mark.parametrize("victim", ["t-worker-1", "t-main"])
def test_an_elastic_run_goes_on_when_a_node_is_killed(tmp_path, launcher_home, victim):
    # a round starts the next one's spare once it has trained LAUNCHER_SPARE_AFTER seconds: not this one
    run_id, watcher = start(tmp_path, 3, ELASTIC, env=[{"name": "LAUNCHER_SPARE_AFTER", "value": "60"}])
    watcher.wait_for(r"rank 0: epoch 8\b", timeout=180)
    os.kill(node_pid(launcher_home, run_id, victim), signal.SIGKILL)
    output = finish(watcher)
    assert f"node {victim} lost: node process killed by SIGKILL" in output
    assert "(min 2, max 3), restart 1 of 3" in output and "resuming after epoch 0" in output
    resumed = [int(line.rsplit(" ", 1)[1]) for line in output.splitlines() if "resuming after epoch" in line]
    assert max(resumed) >= 7  # training went on from the checkpoint, not from the start
    assert torch.allclose(final_weights(tmp_path, run_id), torch.full((4,), EXPECTED), atol=1e-5)
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "succeeded" and status["rounds"]["restarts"] >= 1
    assert any(f"node {victim}: node process killed by SIGKILL" in line for line in status["rounds"]["history"])
    events = json.loads(run_cli("timeline", run_id, "--json").stdout)["events"]
    survivor = "t-worker-0"  # round 0 trained under 60 s: no spare was started for round 1
    details = [e.get("detail") for e in events if e["phase"] == "torchrun" and e["node"] == survivor]
    # round 0 took the spare started with the node, its imports done or not (a loaded machine imports slowly)
    assert details[0] in ("a spare, its imports done", "a spare, still importing") and details[1:] == [""], events


def test_an_elastic_run_goes_on_when_one_training_process_is_killed(tmp_path, launcher_home):
    run_id, watcher = start(tmp_path, 3, ELASTIC)
    watcher.wait_for(r"rank 0: epoch 8\b", timeout=180)
    os.kill(training_pid(tmp_path, run_id, "t-worker-0"), signal.SIGKILL)
    output = finish(watcher)
    assert "node t-worker-0: rank 1's training process was killed (SIGKILL" in output  # the node itself is not lost
    assert "node t-worker-0 lost" not in output
    assert torch.allclose(final_weights(tmp_path, run_id), torch.full((4,), EXPECTED), atol=1e-5)


def test_a_frozen_node_is_named_by_its_peers_and_killed_by_its_supervisor_and_the_run_goes_on(tmp_path, launcher_home):
    """SIGSTOP of a worker's node process and every process under it: frozen, not dead. Its peers' hang watch names
    it (its status stopped), the round ends on that, and its supervisor kills it once it used no CPU and wrote no
    status for 30 s, so that nothing of it is left and the run ends."""
    from clirun import processes_started_with
    from launcher.node.health.procfs import TreeReader

    cluster = {**ELASTIC, "hangTimeout": 10, "recovery": {"retryOn": ["lost", "failure"]}}
    run_id, watcher = start(tmp_path, 3, cluster)
    watcher.wait_for(r"rank 0: epoch 4\b", timeout=180)
    for pid in TreeReader(node_pid(launcher_home, run_id, "t-worker-1")).read():
        os.kill(pid, signal.SIGSTOP)
    output = finish(watcher)
    assert re.search(r"waited 10s in a collective for t-worker-1 \(no status for \d+s\): a node that trains writes "
                     r"its status every 10s, so it is frozen, or cut off from the work dir", output), output[-4000:]
    events = json.loads(run_cli("timeline", run_id, "--json").stdout)["events"]
    death = next(event for event in events if event["phase"] == "death" and event["node"] == "t-worker-1")
    assert "node process frozen: it used no CPU time and wrote no status for" in death["detail"], death
    assert torch.allclose(final_weights(tmp_path, run_id), torch.full((4,), EXPECTED), atol=1e-5)
    assert processes_started_with(LAUNCHER_RUN_ID=run_id) == {}


def test_a_static_run_with_restarts_resumes_from_its_checkpoint(tmp_path, launcher_home):
    run_id, watcher = start(tmp_path, 2, {"recovery": {"maxRestarts": 2}})
    watcher.wait_for(r"rank 0: epoch 6\b", timeout=180)
    os.kill(node_pid(launcher_home, run_id, "t-worker-0"), signal.SIGKILL)
    output = finish(watcher)
    assert "continuing with 2 nodes, restart 1 of 2" in output  # no elastic bounds: every node, always
    second_attempt = [line for line in output.splitlines() if "rank 1 of 2: resuming after epoch" in line][-1]

    assert int(second_attempt.rsplit(" ", 1)[1]) >= 5  # its first epoch is not 1
    assert torch.allclose(final_weights(tmp_path, run_id), torch.full((4,), EXPECTED), atol=1e-5)
    events = json.loads(run_cli("timeline", run_id, "--json").stdout)["events"]  # the recovery, as the timeline has it
    death = next(e for e in events if e["phase"] == "death" and e["node"] == "t-worker-0")
    replaced = next(e for e in events if e["phase"] == "started" and e["node"] == "t-worker-0" and e["incarnation"])
    again = next(e for e in events if e["phase"] == "training-again")
    assert (death["round"], again["round"]) == (0, 1) and death["at"] <= replaced["at"] < again["at"]
    survivors_torchrun = next(e for e in events if e["phase"] == "torchrun" and e["node"] == "t-main" and e["round"] == 1)
    assert survivors_torchrun["detail"].startswith("a spare, ")  # started while round 0 trained
    # where the recovery's seconds went: each phase after the death, up to the optimizer's first step of every rank
    [recovery] = json.loads(run_cli("timeline", run_id, "--json").stdout)["recoveries"]
    phases = {phase["phase"]: phase for phase in recovery["phases"]}
    assert (recovery["round"], recovery["kind"], recovery["node"]) == (1, "lost", "t-worker-0"), recovery
    after = [phases[name]["after_s"] for name in ("registered", "round-decided", "torchrun", "rank-started",
                                                  "first-step")]
    assert None not in after and after == sorted(after) and after[0] >= 0, recovery
    assert phases["first-step"]["at"] == again["at"]  # training again is the last rank's first step
    assert "recovery (round 1): death seen at" in run_cli("timeline", run_id).stdout
    assert json.loads(run_cli("status", run_id, "--json").stdout)["recoveries"] == [recovery]


@pytest.mark.parametrize("recovery, said", [
    ({"maxRestarts": 2, "retryOn": ["failure"]}, "gave up after 2 of 2 restarts: node t-worker-0: rank 1: "
                                                 "ValueError: bad batch at epoch 3"),
    ({"maxRestarts": 2}, "not retried (exit status 1 is not in recovery.retryOn): node t-worker-0: rank 1: "
                         "ValueError: bad batch at epoch 3"),
])
def test_a_failure_that_happens_every_time_is_not_retried_forever(tmp_path, launcher_home, monkeypatch, recovery,
                                                                  said):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # where the nodes' temporary outputs directories go
    (tmp_path / "tmp").mkdir()
    spec = write_spec(tmp_path, JOB, nodes=2, extra_cluster={"recovery": recovery},
                      env=[{"name": "FAIL_AT", "value": "3"}])
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=240)
    assert done.returncode == 1, done.stdout[-3000:]
    # Every file of the outputs the nodes stopped with is in the work dir: nothing is left behind, empty or not
    assert not (tmp_path / "tmp" / "launcher" / run_id_from(done.stdout)).exists()
    summary = done.stdout[done.stdout.rindex("\nrun "):]
    assert said in summary, summary
    # The headline names the node whose failure stopped the run, not the node that stopped on it; the cause is
    # said once, and every round with it
    assert f"run {run_id_from(done.stdout)} failed: node t-worker-0 exited with status 1\n" in summary, summary
    assert summary.count("ValueError: bad batch at epoch 3") == 1, summary
    rounds = "rounds 0, 1 and 2" if "failure" in recovery.get("retryOn", []) else "round 0"
    assert f"\n  {rounds}: the same cause" in summary, summary



def test_a_node_recorded_by_its_supervisor_has_its_cause_before_its_failed_status(tmp_path):
    """A reader (watch) reads the statuses, then the failure markers: it must never see a node failed and find no
    cause. The supervisor writes the marker first, as a node does for itself."""
    from launcher.protocol.control import failure_key
    from launcher.protocol.status import status_key
    from launcher.protocol.store import WorkDir
    from launcher.runs.supervision import record_on_behalf

    class Watched(WorkDir):
        def put(self, key: str, data: bytes) -> None:
            if key == status_key("t-main"):
                assert self.get(failure_key("t-main")) is not None, "the failed status came before the failure marker"
            super().put(key, data)

    console = tmp_path / "t-main.log"
    console.write_text("last words\n")
    run = Watched(str(tmp_path / "run"))
    record_on_behalf(run, "t-main", {"node": "t-main", "state": "running", "rank": 0}, 137,
                     "node process killed by SIGKILL", str(console))
    assert json.loads(run.get(failure_key("t-main")))["reason"].startswith("node process killed by SIGKILL")


def _round_two(tmp_path, *, predecessor_lost: bool):
    """A run's work dir whose round 2 was decided with m and w-1; w-1 was lost in it (its supervisor starting a
    replacement) where ``predecessor_lost``."""
    from launcher.protocol.recovery import LOST, RoundEnd
    from launcher.protocol.rendezvous import Decision
    from launcher.protocol.rounds import Round, Rounds, decision_key
    from launcher.protocol.store import WorkDir

    run = WorkDir(str(tmp_path / "run"))
    run.put(decision_key(2), Round(2, Decision("m", "127.0.0.1", 1, {"m": 0, "w-1": 1})).to_bytes())
    if predecessor_lost:
        Rounds.end_for(run, 2, RoundEnd("w-1", LOST, "node process killed by SIGKILL", 137, 100.0, replaced=True))
    console = tmp_path / "w-1.log"
    console.write_text("starting\n")
    return run, str(console)


@pytest.mark.parametrize("another", [True, False])
def test_a_replacement_killed_while_it_joins_is_lost_not_the_runs_failure(tmp_path, another):
    """Found by the chaos soak: a replacement killed before its status named a round failed the whole run."""
    from launcher.protocol.control import failure_key
    from launcher.protocol.status import status_key
    from launcher.runs.supervision import record_on_behalf

    run, console = _round_two(tmp_path, predecessor_lost=True)
    replaced = record_on_behalf(run, "w-1", {"node": "w-1", "state": "registering"}, 137,
                                "node process killed by SIGKILL", console, at=101.0,
                                wants_replacement=lambda: another, recovering=True)
    assert replaced is another
    assert run.get(failure_key("w-1")) is None
    assert json.loads(run.get(status_key("w-1")))["state"] == "lost"
    end = json.loads(run.get("rounds/00002/end/w-1.lost.json"))
    # its predecessor's death stays as recorded; the survivors wait for a replacement only while one comes
    assert (end["at"], end["replaced"]) == (100.0, another)


def test_a_node_decided_in_a_round_that_dies_before_its_status_says_so_ends_that_round(tmp_path):
    from launcher.protocol.control import failure_key
    from launcher.runs.supervision import record_on_behalf

    run, console = _round_two(tmp_path, predecessor_lost=False)
    assert record_on_behalf(run, "w-1", {"node": "w-1", "state": "waiting"}, 137, "node process killed by SIGKILL",
                            console, at=101.0, wants_replacement=lambda: True, recovering=True)
    end = json.loads(run.get("rounds/00002/end/w-1.lost.json"))
    assert (end["at"], end["replaced"]) == (101.0, True) and run.get(failure_key("w-1")) is None


def test_a_node_of_a_run_that_does_not_recover_that_dies_before_its_round_fails_the_run(tmp_path):
    from launcher.protocol.control import failure_key
    from launcher.runs.supervision import record_on_behalf

    run, console = _round_two(tmp_path, predecessor_lost=False)
    assert not record_on_behalf(run, "w-1", {"node": "w-1", "state": "waiting"}, 137,
                                "node process killed by SIGKILL", console, wants_replacement=lambda: False)
    assert run.get(failure_key("w-1")) is not None


STUBBORN = """
import os, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # outlives torchrun's SIGTERM; torch starts it in a session of its own
print(f"rank pid {os.getpid()}", flush=True)
signal.pause()
"""


def test_a_killed_node_leaves_no_training_process_behind(tmp_path, launcher_home):
    spec = write_spec(tmp_path, STUBBORN, nodes=1)
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, dict(os.environ))
    rank_pid = int(watcher.wait_for(r"rank pid \d+").rsplit(" ", 1)[1])
    os.kill(node_pid(launcher_home, run_id, "t-main"), signal.SIGKILL)
    code, output = watcher.finish(timeout=120)
    assert code != 0 and "cause: node process killed by SIGKILL" in output, output[-3000:]
    # The supervisor stops the ranks before it records the node's end, which watch reported: gone or a zombie.
    assert wait_until(lambda: not Path(f"/proc/{rank_pid}").exists()
                      or Path(f"/proc/{rank_pid}/stat").read_text().split(")")[1].split()[0] == "Z", 10), \
        Path(f"/proc/{rank_pid}/cmdline").read_bytes()


def test_a_run_whose_restarts_are_used_up_fails_at_once_naming_the_node_lost_in_each_round(tmp_path, launcher_home):
    """maxRestarts 1 and a worker killed twice: the second loss cannot be retried, so the survivors stop at once
    (not at the rendezvous timeout, 600 s by default) and every view names the node lost in each round."""
    run_id, watcher = start(tmp_path, 3, {"recovery": {"maxRestarts": 1}})
    watcher.wait_for(r"rank 0: epoch 3\b", timeout=180)
    os.kill(node_pid(launcher_home, run_id, "t-worker-0"), signal.SIGKILL)
    resumed = watcher.wait_for(r"restart 1 of 1", timeout=120)
    watcher.wait_for(r"rank 0: epoch \d+", timeout=120, since=watcher.lines.index(resumed))  # round 1 trains
    os.kill(node_pid(launcher_home, run_id, "t-worker-0"), signal.SIGKILL)
    killed = time.monotonic()
    code, output = watcher.finish(timeout=120)
    assert code == 1 and time.monotonic() - killed < 30, output[-4000:]
    summary = output[output.rindex("\nrun "):]
    assert "cause: gave up after 1 of 1 restarts: node t-worker-0: node process killed by SIGKILL" in summary, summary
    assert summary.endswith("\n  rounds 0 and 1: the same cause"), summary  # each round's loss, said once
    assert "rendezvous timed out" not in output
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "failed" and status["rounds"]["restarts"] == 1
    assert [line.split(":")[0] for line in status["rounds"]["history"]] == ["round 0", "round 1"], status["rounds"]
    assert {status["nodes"][name]["state"] for name in ("t-main", "t-worker-1")} == {"failed"}
    assert status["nodes"]["t-worker-0"]["state"] == "lost"
    text = run_cli("status", run_id).stdout
    assert "round 2: not started: the run stopped; 1 restart\n  rounds 0 and 1: node t-worker-0: node process killed" \
        in text and "cause: gave up after 1 of 1 restarts: node t-worker-0" in text, text
    timeline = run_cli("timeline", run_id).stdout
    stopped = next(line for line in timeline.splitlines() if line.startswith("run stopped (round 2)"))
    assert "gave up after 1 of 1 restarts: node t-worker-0" in stopped, timeline
    assert "round 1 ended" in timeline, timeline
