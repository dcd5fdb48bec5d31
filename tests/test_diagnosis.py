"""When a run fails, the summary names the first failure and its cause; logs stay readable (issue 9).

All through the real CLI with real torchrun: an exception on one rank, a rank killed by a signal,
a real out-of-memory kill (a memory cgroup), a rank hanging in a collective while its peer dies,
a cancelled run, a progress bar; plus the waiting line and masking.
"""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import pytest

from clirun import Watcher, run_failing, run_id_from
from cluster import write_spec
from conftest import run_cli
from launcher.commands.watch import LogFollower
from launcher.protocol import rendezvous
from launcher.protocol.control import node_label
from launcher.protocol.logship import LogShipper
from launcher.protocol.store import WorkDir
from launcher.runs.state import RunInfo
from launcher.secrets_mask import MASK, mask_argv

RAISES = """
import os
def load_batch(step):
    if os.environ["RANK"] == "1" and step == 2:
        raise ValueError(f"corrupt batch at step {step}")
for step in range(5):
    load_batch(step)
"""

KILLED = """
import os, signal
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
"""

OOM = """
import os
if os.environ["RANK"] == "1":
    with open(os.path.join(os.environ["TEST_CGROUP"], "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
    hoard = []
    while True:
        hoard.append(bytearray(8 << 20))
"""

HANGS_WHILE_PEER_DIES = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    print("rank 1 giving up", flush=True)
    sys.exit(3)
print("rank 0 entering all_reduce", flush=True)
dist.all_reduce(torch.ones(1))  # never completes: its peer is gone
"""

PROGRESS = """
import sys, time
for i in range(25):
    sys.stderr.write(f"\\rstep {i + 1}/25"); sys.stderr.flush(); time.sleep(0.1)
sys.stderr.write("\\n")
print("done", flush=True)
"""


def test_an_exception_on_one_rank_is_the_summary(tmp_path, launcher_home):
    output, summary = run_failing(tmp_path, RAISES)
    assert "failed: node t-worker-0 exited with status 1" in summary
    assert "cause: rank 1: ValueError: corrupt batch at step 2" in summary
    assert "job.py:5 in load_batch: raise ValueError" in summary
    assert "stopped because of it: node t-main\n" in summary
    # The user's own traceback is shown once; torchrun's report and launcher's frames are not.
    assert output.count("Traceback (most recent call last)") == 1
    for noise in ("ChildFailedError", 'torchrun_shim.py"', "launcher/node/", "Root Cause"):
        assert noise not in output, noise
    run_id = run_id_from(output)
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    cause = status["first_failure"]["cause"]
    assert cause["rank"] == 1 and cause["exception"] == "ValueError: corrupt batch at step 2"
    assert status["stopped_because_of_it"] == ["t-main"]
    assert "cause: rank 1: ValueError" in run_cli("status", run_id).stdout
    verbose = run_cli("watch", run_id, "-v")
    assert "[torchrun]" in verbose.stdout  # torchrun's own report is kept, shown on request


def test_a_rank_killed_by_a_signal(tmp_path, launcher_home):
    _, summary = run_failing(tmp_path, KILLED)
    assert "failed: node t-worker-0 exited with status 137" in summary
    assert "cause: rank 1 killed by SIGKILL (often the out-of-memory killer)" in summary


def _memory_cgroup(tmp_name: str) -> Path:
    root = Path("/sys/fs/cgroup/memory")
    group = root / tmp_name
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(96 << 20))
    except OSError as exc:
        pytest.skip(f"no writable memory cgroup (v1) here to cause a real out-of-memory kill: {exc}")
    return group


def test_a_real_out_of_memory_kill(tmp_path, launcher_home):
    group = _memory_cgroup(f"launcher-test-{os.getpid()}")
    try:
        _, summary = run_failing(tmp_path, OOM, env=[{"name": "TEST_CGROUP", "value": str(group)}])
    finally:
        group.rmdir()
    assert "cause: rank 1 killed by SIGKILL (often the out-of-memory killer)" in summary


def test_the_rank_hung_in_a_collective_is_a_victim_not_the_cause(tmp_path, launcher_home):
    output, summary = run_failing(tmp_path, HANGS_WHILE_PEER_DIES)
    assert "failed: node t-worker-0 exited with status 3" in summary
    assert "stopped because of it: node t-main" in summary
    status = json.loads(run_cli("status", run_id_from(output), "--json").stdout)
    assert status["first_failure"]["node"] == "t-worker-0"


def test_a_cancelled_run_shows_no_tracebacks(tmp_path, launcher_home):
    spec = write_spec(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(120)\n", nodes=2)
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, os.environ.copy())
    watcher.wait_for("started")
    assert run_cli("cancel", run_id, timeout=120).returncode == 0
    code, output = watcher.finish()
    assert code == 1 and f"run {run_id} cancelled" in output
    assert "Traceback" not in output and "SignalException" not in output


def test_progress_bars_are_shown_as_they_happen_and_kept_without_flooding(tmp_path, launcher_home):
    spec = write_spec(tmp_path, PROGRESS, nodes=1)
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    records = []
    for chunk in sorted((tmp_path / "wd" / run_id / "logs" / "t-main").iterdir()):
        records += [json.loads(line) for line in chunk.read_text().splitlines()]
    progress = [r["m"] for r in records if r["s"] == "progress"]
    assert 1 <= len(progress) <= 5, progress  # 25 updates in 2.5 s: at most one a second is kept
    assert all(text.startswith("step ") for text in progress)
    assert [r["m"] for r in records if r["s"] == "out"] == ["step 25/25", "done"]  # the final state, as a line
    info = RunInfo(run_id=run_id, backend="local", work_dir=str(tmp_path / "wd"), nodes=["t-main"],
                   spec_file="", spec_digest="", created_at=0)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    LogFollower(info, screen).poll()
    assert "\r" in screen.getvalue() and "\x1b[K" in screen.getvalue()  # updated in place


def test_waiting_nodes_say_who_is_missing_periodically(tmp_path, monkeypatch):
    """Said at a listing of the registrations (never from a stale one): when it changed, else every
    PROGRESS_EVERY_SECONDS; here the listings come every ~0.2 s."""
    monkeypatch.setattr(rendezvous, "PROGRESS_EVERY_SECONDS", 0.3)
    policy = rendezvous.PollPolicy(initial=0.02, cap=0.05, list_every=0.2)
    said: list[tuple[list[str], list[str], float]] = []
    store = WorkDir(str(tmp_path / "run"))
    done = threading.Event()

    def wait() -> None:
        try:
            rendezvous.await_decision(store, rendezvous.Registration("a", "10.0.0.1", 1), ["a", "b"], timeout=1.5,
                                      policy=policy, progress=lambda *args: said.append(args))
        except rendezvous.RendezvousTimeout:
            done.set()

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join(30)
    assert done.is_set()
    assert len(said) >= 3 and all(missing == ["b"] for _, missing, _ in said)
    waited = [seconds for _, _, seconds in said]
    assert waited == sorted(waited) and waited[-1] >= 0.9


def test_secret_looking_arguments_are_masked_in_the_dry_run(tmp_path):
    assert mask_argv(["--hf-token", "abc", "--password=xyz", "--lr", "0.1", "--api-key", "k", "--monkey", "m"]) == [
        "--hf-token", MASK, f"--password={MASK}", "--lr", "0.1", "--api-key", MASK, "--monkey", "m"]
    spec = write_spec(tmp_path, "pass", nodes=2, args=["--hf-token", "hf_secret_value", "--password=hunter2"])
    for fmt in ("text", "json"):
        printed = run_cli("run", "-f", str(spec), "--dry-run", "--output", fmt).stdout
        assert "hf_secret_value" not in printed and "hunter2" not in printed and MASK in printed


def test_small_wording():
    assert node_label("w-1") == "node w-1"


def test_log_records_carry_the_rank_of_the_process_that_wrote_them(tmp_path):
    store = WorkDir(str(tmp_path / "run"))
    shipper = LogShipper(store, "n")
    shipper.add_many([("out", "x", 3), ("node", "y", None)])
    shipper.flush()
    (chunk,) = store.find("logs/n")
    lines = [json.loads(line) for line in store.get(f"logs/n/{chunk}").decode().splitlines()]
    assert [(r["s"], r["m"], r.get("r")) for r in lines] == [("out", "x", 3), ("node", "y", None)]
