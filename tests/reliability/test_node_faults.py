"""kill -9 of a node in each phase of a run through the real CLI: the run ends, `status` names the
node, and what the node printed before the kill is kept in the work dir (issue 7, faults class).

Training is covered in test_local_backend.py and the supervisor in test_run_lifecycle.py; here:
a node killed while it waits for its peers, one killed while it syncs its outputs, and one sent
SIGTERM while it syncs after training succeeded, or while its torchrun exits after the main's succeeded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

from clirun import Watcher, info_of, run_id_from
from cluster import write_spec
from conftest import run_cli

GATE = """
import os
gate = os.environ.pop("TEST_START_GATE", None)  # popped: the node's own children start freely
if gate:
    with open(gate) as fifo:  # blocks until the test opens the gate
        fifo.read()
"""

WRITE_THEN_KILL_NODE_DURING_SYNC = """
import os, pathlib, signal, sys
out = pathlib.Path(os.environ["LAUNCHER_OUTPUTS_DIR"])
if os.environ["LAUNCHER_NODE_NAME"] == "t-worker-0":
    for i in range(3000):
        (out / f"part-{i:04d}.txt").write_text(f"shard {i}")
    torchrun = os.getppid()
    node = int(open(f"/proc/{torchrun}/stat").read().rsplit(")", 1)[1].split()[1])
    if os.fork() == 0:  # a killer outside the training group: waits for torchrun's exit, then kills the node
        os.setsid()
        fd = os.pidfd_open(torchrun)
        import select
        select.select([fd], [], [])
        os.kill(node, signal.SIGNAL)  # the node is now syncing 3000 files
        os._exit(0)
print("wrote outputs", flush=True)
"""

# The worker's torchrun, as it exits after its exit barrier (every node's ranks succeeded; launcher's torchrun ends
# with os._exit): it waits for the main's success in the work dir, then does what `docker-compose up
# --abort-on-container-exit` does once the main's container exits (SIGTERM to the worker's node), and takes 2 s more
# to exit (a slow teardown under load).
SLOW_TORCHRUN_EXIT = """
import json, os, signal, sys, time

exit_now = os._exit


def exit_slowly_after_the_main_succeeded(code):
    if "--nnodes" in sys.argv and "LOCAL_RANK" not in os.environ:  # torchrun only, not the node or a rank
        main = os.path.join(os.environ["LAUNCHER_WORK_DIR"], os.environ["LAUNCHER_RUN_ID"], "status", "t-main.json")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the work dir offers no notification: poll it
            try:
                if json.load(open(main))["state"] == "succeeded":
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(2)
    exit_now(code)


os._exit = exit_slowly_after_the_main_succeeded
"""


def test_node_killed_while_waiting_for_its_peers(tmp_path, launcher_home):
    (tmp_path / "gate").mkdir()
    (tmp_path / "gate" / "sitecustomize.py").write_text(GATE)
    fifo = tmp_path / "start-gate"
    os.mkfifo(fifo)
    spec = write_spec(tmp_path, "print('trained')", nodes=2, extra_cluster={
        "rendezvousTimeout": 300,
        "worker": {"replicas": 1, "config": {"env": [{"name": "PYTHONPATH", "value": str(tmp_path / "gate")},
                                                      {"name": "TEST_START_GATE", "value": str(fifo)}]}}})
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, os.environ.copy())
    watcher.wait_for(r"1/2 nodes registered, waiting for t-worker-0")
    main_pid = info_of(launcher_home, run_id)["backend_ids"]["nodes"]["t-main"]["pid"]
    os.kill(main_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    with open(fifo, "w") as gate:  # now let the worker start: it must not wait for a dead main
        gate.write("go")
    code, output = watcher.finish(timeout=120)
    assert code == 1, output
    assert time.monotonic() - killed_at < 30, "the run did not end within 30 s of the kill"
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["first_failure"]["node"] == "t-main" and status["first_failure"]["exit_code"] == 137
    worker = status["nodes"]["t-worker-0"]
    assert worker["state"] == "failed" and "stopped because node t-main" in worker["reason"]
    assert "while waiting for nodes" in worker["reason"]
    console = tmp_path / "wd" / run_id / "console" / "t-main.log"
    assert "waiting for t-worker-0" in console.read_text()


def test_node_killed_while_syncing_outputs_loses_no_output(tmp_path, launcher_home):
    spec = write_spec(tmp_path, WRITE_THEN_KILL_NODE_DURING_SYNC.replace("SIGNAL", "SIGKILL"), nodes=2)
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    dead = status["nodes"]["t-worker-0"]
    assert dead["state"] == "failed" and dead["exit_code"] == 137 and "SIGKILL" in dead["reason"]
    assert status["first_failure"]["node"] == "t-worker-0"
    synced = list((tmp_path / "wd" / run_id / "outputs" / "t-worker-0").glob("part-*.txt"))
    assert len(synced) == 3000, "outputs written before the kill were lost"
    # Its last line is in the work dir: in the console saved for it, or in its rank's saved output.
    saved = tmp_path / "wd" / run_id / "console"
    texts = [path.read_text() for path in [saved / "t-worker-0.log", *(saved / "t-worker-0").rglob("stdout.log")]]
    assert any("wrote outputs" in text for text in texts)


def test_sigterm_after_training_succeeded_finishes_the_sync_and_reports_success(tmp_path, launcher_home):
    """What `docker-compose up --abort-on-container-exit` does to a node still saving its outputs
    when a peer has exited: the node completes the sync, and its training's success stands."""
    spec = write_spec(tmp_path, WRITE_THEN_KILL_NODE_DURING_SYNC.replace("SIGNAL", "SIGTERM"), nodes=2)
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    worker = json.loads(run_cli("status", run_id, "--json").stdout)["nodes"]["t-worker-0"]
    assert worker["state"] == "succeeded" and worker["exit_code"] == 0
    synced = list((tmp_path / "wd" / run_id / "outputs" / "t-worker-0").glob("part-*.txt"))
    assert len(synced) == 3000


def test_sigterm_while_torchrun_exits_after_the_main_succeeded_keeps_the_success(tmp_path, launcher_home):
    """docker-compose stops the worker once the main's container exits; torchrun on the worker has passed its exit
    barrier (its ranks succeeded) and is only exiting: the node lets it, and the run succeeds (CI saw "cancelled")."""
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "sitecustomize.py").write_text(SLOW_TORCHRUN_EXIT)
    spec = write_spec(tmp_path, "print('trained', flush=True)", nodes=2, extra_cluster={
        "worker": {"replicas": 1, "config": {"env": [{"name": "PYTHONPATH", "value": str(tmp_path / "hooks")}]}}})
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert status["result"] == "succeeded", status
    assert status["nodes"]["t-worker-0"]["state"] == "succeeded" and status["nodes"]["t-worker-0"]["exit_code"] == 0
    watched = run_cli("watch", run_id, "--no-follow").stdout
    # its ranks had ended (their pipes closed): torchrun is let exit
    assert re.search(r"received SIGTERM.*let exit", watched), watched[-3000:]
