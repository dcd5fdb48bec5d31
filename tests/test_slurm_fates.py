"""How the Slurm backend reads a recovering run's nodes from the controller's answer and the work dir, without a
cluster: the controller's answer is given (engine.jobs), the work dir is a real local one."""

from __future__ import annotations

import json
import time

import pytest

from launcher.backends.base import NodeFate
from launcher.backends.slurm import INCARNATIONS, Scope, SlurmBackend, engine
from launcher.backends.slurm.engine import Job
from launcher.protocol.status import status_key
from launcher.protocol.store import WorkDir
from launcher.runs import incarnations
from launcher.runs.incarnations import Incarnation
from launcher.runs.state import RunInfo

NODES = ["t-main", "t-worker-0", "t-worker-1"]
RECOVERY = {"maxRestarts": 2, "minNodes": 2, "maxNodes": 3}


@pytest.fixture
def lost_and_started_again(tmp_path, monkeypatch):
    """t-worker-1 was lost in the run's job 13 and started again as job 14, which Slurm started within the same
    whole second as the loss was recorded (its start time has whole seconds); the replacement has not written
    its status yet, so the status is still its predecessor's "lost"."""
    run = WorkDir(str(tmp_path / "wd" / "r"))
    now = time.time()
    for name in NODES:
        run.put(status_key(name), json.dumps({"node": name, "incarnation": 0, "state": "running", "round": 0}).encode())
    lost_at = float(int(now)) + 0.6
    run.put(status_key("t-worker-1"), json.dumps({"node": "t-worker-1", "incarnation": 0, "state": "lost", "round": 0,
                                                  "ended_at": lost_at}).encode())
    run.put(incarnations.key(INCARNATIONS, "t-worker-1", 1),
            Incarnation("t-worker-1", 1, True, started="14", lost="13", at=lost_at).to_bytes())
    answer = {"13": Job("13", "RUNNING", "None", "n[1-2]", None, None, start_time=now - 60),
              "14": Job("14", "RUNNING", "None", "n3", None, None, start_time=float(int(now)))}
    monkeypatch.setattr(engine, "jobs", lambda ids: {i: answer[i] for i in ids if i in answer})
    monkeypatch.setattr(engine, "hostnames", lambda nodes: ["n1", "n2"] if nodes == "n[1-2]" else ["n3"])
    # no restarts left: a node read as lost is recorded (its next incarnation claimed), not started again
    info = RunInfo("r", "slurm", str(tmp_path / "wd"), NODES, "", "", now - 60,
                   backend_ids={"job_id": "13", "recovery": None})
    return info, Scope({name: "13" for name in NODES}, run, now - 60), run


def test_a_replacement_is_running_while_its_status_is_still_its_predecessors_lost(lost_and_started_again):
    info, scope, run = lost_and_started_again
    fates = SlurmBackend().attempt_fates(info, scope)
    assert fates["t-worker-1"].running, fates["t-worker-1"]
    assert run.get(incarnations.key(INCARNATIONS, "t-worker-1", 2)) is None


def test_a_replacement_lost_in_its_own_job_is_lost(lost_and_started_again):
    info, scope, run = lost_and_started_again
    status = run.get_record(status_key("t-worker-1"))
    run.put(status_key("t-worker-1"), json.dumps({**status, "incarnation": 1, "reason": "node process killed by "
                                                  "SIGKILL", "exit_code": 137}).encode())
    fates = SlurmBackend().attempt_fates(info, scope)
    assert not fates["t-worker-1"].running and "SIGKILL" in fates["t-worker-1"].reason
    assert json.loads(run.get(incarnations.key(INCARNATIONS, "t-worker-1", 2)))["lost"] == "14"


def test_a_machine_slurm_took_out_of_the_running_job_is_named_with_a_reason_that_says_something(tmp_path, monkeypatch):
    """With sbatch --no-kill, a machine marked down leaves the job, which goes on: its node is lost. Slurm's reason
    is often "None", which says nothing."""
    run = WorkDir(str(tmp_path / "wd" / "r"))
    for name in NODES:
        run.put(status_key(name), json.dumps({"node": name, "incarnation": 0, "state": "running", "round": 0}).encode())
    state_dir = tmp_path / "home" / "runs" / "r"
    state_dir.mkdir(parents=True)
    (state_dir / "slurm-13.nodes.json").write_text(json.dumps({"nodes": "n[1-3]", "hosts": ["n1", "n2", "n3"]}))
    now = time.time()
    monkeypatch.setattr(engine, "jobs", lambda ids: {"13": Job("13", "RUNNING", "None", "n[1-2]", None, None,
                                                               start_time=now - 60)})
    monkeypatch.setattr(engine, "hostnames", lambda nodes: {"n[1-2]": ["n1", "n2"]}[nodes])
    info = RunInfo("r", "slurm", str(tmp_path / "wd"), NODES, "", "", now - 60, path=str(state_dir / "info.yaml"),
                   backend_ids={"job_id": "13", "recovery": None})
    fates = SlurmBackend().attempt_fates(info, Scope({name: "13" for name in NODES}, run, now - 60))
    assert [name for name, fate in fates.items() if not fate.running] == ["t-worker-1"], fates
    assert fates["t-worker-1"].reason == "Slurm took n3 out of job 13 (down)"


def test_a_replacement_the_engine_refuses_is_no_longer_waited_for(tmp_path):
    """The lost record first says a replacement is coming (the next round waits for it); once sbatch refuses it,
    the record says none is, and the survivors' round goes on without waiting out recovery.replacementWait."""
    run = WorkDir(str(tmp_path / "wd" / "r"))
    for name in NODES:
        run.put(status_key(name), json.dumps({"node": name, "incarnation": 0, "state": "running", "round": 0}).encode())
    fates = {name: NodeFate(True) for name in NODES}
    fates["t-worker-1"] = NodeFate(False, 137, "Slurm took n3 out of job 13", ended_at=time.time())
    said = []

    def refuse(claim: Incarnation) -> tuple[str | None, str | None]:
        said.append(run.get_record("rounds/00000/end/t-worker-1.lost.json")["replaced"])  # as the survivors see it
        return None, "sbatch: error: QOSMaxSubmitJobPerUserLimit"

    result = incarnations.recover(run, INCARNATIONS, RECOVERY, {name: "13" for name in NODES}, fates, {},
                                  engine="Slurm", unit="Slurm job", start=refuse)
    assert said == [True]
    assert run.get_record("rounds/00000/end/t-worker-1.lost.json")["replaced"] is False
    assert "its replacement was refused: sbatch: error: QOSMaxSubmitJobPerUserLimit" in result["t-worker-1"].reason


def test_a_job_that_failed_because_a_node_was_lost_in_it_says_the_run_went_on(lost_and_started_again, monkeypatch):
    """The batch job of a run that recovered ends FAILED (the lost node's task ended 137) while the run succeeds:
    its line says which node was lost there, so that it does not read as the run's end."""
    info, _, _ = lost_and_started_again
    info = RunInfo(info.run_id, info.backend, info.work_dir, info.nodes, "", "", info.created_at,
                   backend_ids={**info.backend_ids, "recovery": RECOVERY})
    answer = {"13": Job("13", "FAILED", "NonZeroExitCode", "n[1-2]", None, None, start_time=time.time() - 60),
              "14": Job("14", "COMPLETED", "None", "n3", None, None, start_time=time.time() - 30)}
    monkeypatch.setattr(engine, "jobs", lambda ids: {i: answer[i] for i in ids if i in answer})
    assert SlurmBackend().engine_state(info) == (
        "Slurm job 13: FAILED on n[1-2] (NonZeroExitCode), where t-worker-1 was lost and the run went on; "
        "Slurm job 14: COMPLETED on n3 (t-worker-1, started again)")


@pytest.mark.parametrize("state, reason, never", [
    ("PENDING", "PartitionNodeLimit", True), ("PENDING", "PartitionConfig", True), ("PENDING", "InvalidQOS", True),
    ("PENDING", "Resources", False), ("PENDING", "ReqNodeNotAvail", False), ("PENDING", "JobHeldUser", False),
    ("RUNNING", "PartitionConfig", False),  # it started after all (a configuration changed for it)
])
def test_only_a_pending_reason_that_cannot_clear_means_the_job_never_starts(state, reason, never):
    assert Job("7", state, reason, "", None, None).never_starts is never
