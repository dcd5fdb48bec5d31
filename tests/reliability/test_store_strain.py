"""The work dir under strain (issue 28): an outage of the store, a store gone for good, a full or read-only disk.

Against real stores only: a moto_server each test starts for itself and stops with SIGSTOP (its port stays open,
so requests are accepted and never answered, the hardest outage), and a 400 KiB tmpfs mounted for the test
(skipped, with the reason, where this machine does not let the tests mount one).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from clirun import LiveCli, run_id_from
from cluster import write_spec
from conftest import require, run_cli
from launcher.backends.local.processes import read_processes
from launcher.protocol.store import StoreError, WorkDir
from launcher.runs.supervision import wait_for_exit

# The job prints a step every 0.2 s until the test creates its release file: the run lasts as long as the test
# needs, whatever the store does, and ends when the test says (no sleep stands for an event).
STEPPING = """
import os, pathlib, sys, time
checkpoint = pathlib.Path(os.environ["LAUNCHER_CHECKPOINT_DIR"], "ck.pt")
checkpoint.write_bytes(os.urandom(int(sys.argv[2])))
release = pathlib.Path(sys.argv[1])
step = 0
while not release.exists():
    print(f"step {step}", flush=True)
    step += 1
    time.sleep(0.2)
print("released", flush=True)
"""

OLD_READER_LIMIT = 10.0  # before issue 28 a read verb gave up after 10 s of an outage; these outages last longer
# Every process of a run ends within LAUNCHER_STORE_DEADLINE plus this; measured 7-8 s over the limit on the 2-core
# machine: up to one listing period (2 s) before a node's first failed request, training's stop (its grace is 5 s),
# and the 5 s the supervisor gives the records of the nodes that gave up on their work dir.
END_SLACK_SECONDS = 20.0


@pytest.fixture
def own_moto(monkeypatch):
    """A moto_server of this test's own, that the test may pause: never the session's, which other tests use."""
    from conftest import _reset_fsspec_config
    from s3server import MotoServer

    server = MotoServer()
    server.make_bucket("strain")
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    _reset_fsspec_config()
    yield server
    server.stop()
    _reset_fsspec_config()


@pytest.fixture
def small_fs(tmp_path):
    """A 400 KiB tmpfs: a work dir that fills up after a few hundred KiB."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)],
                             capture_output=True, text=True)
    require(mounted.returncode == 0, "the full-disk tests mount a 400 KiB tmpfs, which this machine does not allow "
            f"(needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _env(launcher_home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "LAUNCHER_HOME": str(launcher_home), **extra}


def _stepping_spec(tmp_path: Path, work_dir: str, checkpoint_bytes: int = 1000) -> tuple[Path, Path]:
    release = tmp_path / "release"
    spec = write_spec(tmp_path, STEPPING, nodes=2, args=[str(release), str(checkpoint_bytes)], work_dir=work_dir)
    return spec, release


def _warm_up(store: WorkDir) -> None:
    """A first object, written with the default request timeout: a fresh client's first request (its session, the
    server's first answer) may take longer than the short timeouts these tests then use."""
    WorkDir(store.url, fresh_instance=True).put("a.json", b"{}")
    store.get("a.json")


def _temporary_outputs(run_id: str) -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / "launcher" / run_id


def test_run_rides_out_an_outage_of_the_store_and_reports_the_success(tmp_path, launcher_home, own_moto):
    """Issue 28: `launcher run` following a run gave up 10 s into a 25 s outage and said the run failed (exit 3),
    while its nodes trained through it and succeeded."""
    spec, release = _stepping_spec(tmp_path, "s3://strain/runs")
    live = LiveCli(["run", "-f", str(spec)], _env(launcher_home, LAUNCHER_STORE_DEADLINE="90",
                                                  LAUNCHER_STORE_TIMEOUT="5"), cwd=tmp_path)
    try:
        live.wait_for(r"\] step 3\b")
        own_moto.pause()
        paused = time.monotonic()
        try:
            live.wait_for("is unreachable since", timeout=60)
            time.sleep(max(0.0, OLD_READER_LIMIT + 5 - (time.monotonic() - paused)))  # the outage's length itself
        finally:
            own_moto.resume()
        live.wait_for("answers again")
        release.touch()
        code, out = live.finish(timeout=180)
    finally:
        release.touch()
        if live.proc.poll() is None:
            live.proc.kill()
    assert time.monotonic() - paused > OLD_READER_LIMIT
    assert code == 0, out
    notes = [line for line in out.splitlines() if line.startswith("note: work dir")]
    assert len(notes) == 2 and "is unreachable since" in notes[0] and "answers again" in notes[1], out  # once each
    for node in ("t-main", "t-worker-0"):  # the nodes' own logs say it too, once the store has them again
        assert re.search(rf"\[{node} *\] \[launcher\] work dir .* answers again, after \d+s unreachable", out), out
    assert "error:" not in out and "Traceback" not in out, out
    assert out.splitlines()[-1].startswith(f"run {run_id_from(out)} succeeded"), out
    for node in ("t-main", "t-worker-0"):
        assert f"[{node:<10} r" in out and "released" in out
    status = run_cli("status", run_id_from(out), "--json", env=_env(launcher_home))
    assert status.returncode == 0, status.stderr
    assert {name: node["exit_code"] for name, node in json.loads(status.stdout)["nodes"].items()} == \
        {"t-main": 0, "t-worker-0": 0}


def test_every_process_ends_within_the_deadline_when_the_store_is_gone_for_good(tmp_path, launcher_home,
                                                                                 own_moto, record_property):
    """Issue 28: with the store gone, nodes ended 3.5 and 7 minutes after training and the supervisor retried for
    8 more; now each ends within LAUNCHER_STORE_DEADLINE (plus the slack above), saying where its outputs stay."""
    deadline = 8.0
    spec, release = _stepping_spec(tmp_path, "s3://strain/runs")
    live = LiveCli(["run", "-f", str(spec)], _env(launcher_home, LAUNCHER_STORE_DEADLINE=str(deadline),
                                                  LAUNCHER_STORE_TIMEOUT="3"), cwd=tmp_path)
    run_id = None
    try:
        live.wait_for(r"\] step 3\b")
        run_id = run_id_from("\n".join(live.lines))
        supervisor, nodes = read_processes(launcher_home / "runs" / run_id)
        assert supervisor is not None and len(nodes) == 2
        own_moto.pause()
        paused = time.monotonic()
        code, out = live.finish(timeout=deadline + END_SLACK_SECONDS + 30)
        reader_ended = time.monotonic() - paused
        left = wait_for_exit([supervisor, *nodes.values()], timeout=deadline + END_SLACK_SECONDS + 30)
        every_process_ended = time.monotonic() - paused
    finally:
        own_moto.resume()
        release.touch()
        if live.proc.poll() is None:
            live.proc.kill()
        if run_id:
            shutil.rmtree(_temporary_outputs(run_id), ignore_errors=True)
    record_property("every_process_ended_s", round(every_process_ended, 1))  # for docs/reliability.md (--junitxml)
    record_property("reader_ended_s", round(reader_ended, 1))
    assert not left, f"still running {deadline + END_SLACK_SECONDS + 30:.0f}s after the store went: {left}"
    assert every_process_ended < deadline + END_SLACK_SECONDS, every_process_ended
    assert reader_ended < deadline + END_SLACK_SECONDS, reader_ended
    assert code == 3, out
    assert "is unreachable since" in out and f"unreachable for {deadline:.0f}s" in out, out
    assert "LAUNCHER_STORE_DEADLINE" in out and "Traceback" not in out, out
    where = "; ".join(f"node {node}: {_temporary_outputs(run_id) / node / 'outputs'}" for node in sorted(nodes))
    assert f"note: outputs the work dir did not get stay where the nodes wrote them ({where})" in out, out  # P3
    for node in nodes:
        console = (launcher_home / "runs" / run_id / "nodes" / f"{node}.log").read_text()
        kept = _temporary_outputs(run_id) / node / "outputs"
        assert f"stopping training: the work dir s3://strain/runs/{run_id} was unreachable for" in console, console
        assert f"the work dir did not get 1 output file; they stay in {kept}: checkpoints/ck.pt" in console, console
        exit_record = json.loads((launcher_home / "runs" / run_id / "nodes" / f"{node}.exit.json").read_text())
        assert exit_record["exit_code"] == 3 and "failed to record its end" in exit_record["reason"], exit_record


def test_one_outage_is_one_limit_for_every_operation_of_a_process(tmp_path, own_moto):
    """Counted per operation, a process writing its logs, status and outputs waited the deadline for each; the
    clock is per store client now, and a client that has given up tries no more requests."""
    store = WorkDir("s3://strain/runs/r1", fresh_instance=True, deadline=4, request_timeout=2)
    _warm_up(store)
    own_moto.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"unreachable for \d+s \(since .*limit 4s, this step's own bound"):
            store.put("b.json", b"{}")
        first = time.monotonic() - started
        requests = store.requests
        with pytest.raises(StoreError, match="not tried"):
            store.get("a.json")
        assert store.requests == requests and store.gone
    finally:
        own_moto.resume()
    assert 4 <= first < 4 + 2 + 1, first  # the limit, the request under way when it passed (cut to what is left)


def test_an_outage_shorter_than_the_limit_is_ridden_out_and_said_once(own_moto):
    said: list[str] = []
    from launcher.protocol.outage import Outage

    store = WorkDir("s3://strain/runs/r2", fresh_instance=True, request_timeout=2, outage=Outage(60, said.append))
    _warm_up(store)
    said.clear()
    own_moto.pause()
    try:  # a second client on the same clock, trying once: the outage is under way when it gives up
        with pytest.raises(StoreError, match="failed after 1 attempt"):
            WorkDir("s3://strain/runs/r2", fresh_instance=True, request_timeout=2, attempts=1,
                    outage=store.outage).get("a.json")
    finally:
        own_moto.resume()
    assert store.get("a.json") == b"{}"
    assert len(said) == 2 and "is unreachable since" in said[0] and "answers again" in said[1], said


def test_a_request_the_store_never_answers_is_said_unreachable_while_it_waits(own_moto):
    """P1 (issue 28): a request to a store that accepts it and never answers (paused) said nothing until it timed out
    (60 s for a node), so an outage shorter than that was never said. Now a request silent for half the limit (at
    most 5 s) begins the outage, said while that same request still waits; it is said to end when it is answered."""
    from launcher.protocol.outage import Outage

    said: list[str] = []
    heard = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        heard.set()

    store = WorkDir("s3://strain/runs/r4", fresh_instance=True, request_timeout=60, outage=Outage(30, say))
    _warm_up(store)
    own_moto.pause()
    try:
        writer = threading.Thread(target=store.put, args=("b.json", b"{}"))
        writer.start()
        assert heard.wait(60), "nothing said while the request waited"
    finally:
        own_moto.resume()
    writer.join(60)
    assert store.get("b.json") == b"{}" and store.retries == 0  # said while its first request waited, not after it
    assert len(said) == 2 and re.search(r"is unreachable since .*no answer to put b\.json for \d+s", said[0]), said
    assert "answers again" in said[1], said


SHORT_OUTAGE_SECONDS = 12.0


def test_a_node_says_a_short_outage_in_its_log(tmp_path, launcher_home, own_moto):
    """P1 (issue 28): a node that trained through an outage shorter than its requests' read timeout never said the
    work dir was unreachable; now its log says when it stopped answering (a request silent for 5 s) and when it
    answered again."""
    spec, release = _stepping_spec(tmp_path, "s3://strain/runs")
    live = LiveCli(["run", "-f", str(spec)], _env(launcher_home, LAUNCHER_STORE_DEADLINE="60"), cwd=tmp_path)
    try:
        live.wait_for(r"\] step 3\b")
        console = launcher_home / "runs" / run_id_from("\n".join(live.lines)) / "nodes" / "t-main.log"
        own_moto.pause()
        try:  # shorter than s3fs's read timeout (15 s), which was the only thing that made a node say it
            deadline = time.monotonic() + SHORT_OUTAGE_SECONDS
            while not (said := "is unreachable since" in console.read_text()) and time.monotonic() < deadline:
                time.sleep(0.2)  # the node's console is a file: look at it again
        finally:
            own_moto.resume()
        assert said, console.read_text()
        live.wait_for(r"\[t-main *\] \[launcher\] work dir .* answers again, after \d+s unreachable")
        release.touch()
        code, out = live.finish(timeout=180)
    finally:
        release.touch()
        if live.proc.poll() is None:
            live.proc.kill()
    assert code == 0, out
    assert re.search(r"\[t-main *\] \[launcher\] work dir .* is unreachable since .*no answer to", out), out


def test_the_ends_of_nodes_that_gave_up_get_one_short_bound_in_every_backend(tmp_path, own_moto):
    """What watches nodes (the local and Docker supervisors, Slurm's task keeper; shared code) records the end of a
    node that gave up on the work dir (exit 3) on one clock of 5 s for all such nodes, not a whole
    LAUNCHER_STORE_DEADLINE each (the Docker supervisor and Slurm's keeper waited it out for every node)."""
    from launcher.node.main import EXIT_STORE
    from launcher.runs.supervision import EndRecorder, record_on_behalf

    console = tmp_path / "console.log"
    console.write_text("[launcher a] stopping training: the work dir was unreachable\n")
    run = WorkDir("s3://strain/runs/r5", fresh_instance=True, deadline=600)
    _warm_up(run)
    ends = EndRecorder(run)
    assert ends.store_for(0) is run  # a node that ended otherwise: the watcher's own clock
    own_moto.pause()
    try:
        with pytest.raises(StoreError, match=r"unreachable for \d+s .*limit 5s"):
            record_on_behalf(ends.store_for(EXIT_STORE), "a", {}, EXIT_STORE, "exit 3", str(console))
        requests = ends.store_for(EXIT_STORE).requests
        with pytest.raises(StoreError, match="not tried"):  # the next node's end: at once, the bound is spent
            record_on_behalf(ends.store_for(EXIT_STORE), "b", {}, EXIT_STORE, "exit 3", str(console))
        assert ends.store_for(EXIT_STORE).requests == requests
    finally:
        own_moto.resume()


def test_a_permanent_error_ends_a_read_at_once_however_long_the_limit(tmp_path, launcher_home, own_moto):
    """Retrying cannot bring credentials: a read verb says so at once, not after the outage limit."""
    from launcher.runs import state
    from launcher.runs.state import RunInfo

    state.save(RunInfo(run_id="r-1", backend="local", work_dir="s3://strain/runs", nodes=["a"], spec_file="",
                       spec_digest="", created_at=time.time()))
    env = {name: value for name, value in _env(launcher_home, LAUNCHER_STORE_DEADLINE="300").items()
           if name not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    started = time.monotonic()
    done = run_cli("status", "r-1", env=env, timeout=120)
    assert time.monotonic() - started < 20
    assert done.returncode == 3 and "NoCredentialsError" in done.stderr, done.stderr
    assert "unreachable" not in done.stderr, done.stderr


def test_clean_gives_a_dead_store_one_short_bound_and_says_what_it_cannot_read(tmp_path, launcher_home, own_moto):
    """P5 (issue 28): `launcher clean --dry-run` waited out LAUNCHER_STORE_DEADLINE for every run on a dead store.
    Now one bound of 10 s for the store, for all its runs, each named as kept because its work dir cannot be read."""
    from launcher.runs import state
    from launcher.runs.state import RunInfo

    for run_id in ("r-1", "r-2"):
        state.save(RunInfo(run_id=run_id, backend="local", work_dir="s3://strain/runs", nodes=["a"], spec_file="",
                           spec_digest="", created_at=time.time() - 3600))
    own_moto.pause()
    try:
        done = run_cli("clean", "--older-than", "60", "--work-dir", "--dry-run", env=_env(
            launcher_home, LAUNCHER_STORE_DEADLINE="600"), timeout=120)
    finally:
        own_moto.resume()
    assert done.returncode == 3, done.stdout + done.stderr
    for run_id in ("r-1", "r-2"):
        assert re.search(rf"^kept {run_id}: cannot read its work dir \(.*unreachable for \d+s .*limit 10s, "
                         r"clean's own bound", done.stdout, re.M), done.stdout
    assert "would remove" not in done.stdout.replace("would remove 0 runs", ""), done.stdout


def test_a_bad_deadline_is_named(tmp_path, launcher_home):
    from launcher.runs import state
    from launcher.runs.state import RunInfo

    state.save(RunInfo(run_id="r-1", backend="local", work_dir=str(tmp_path / "wd"), nodes=["a"], spec_file="",
                       spec_digest="", created_at=time.time()))
    done = run_cli("status", "r-1", env=_env(launcher_home, LAUNCHER_STORE_DEADLINE="soon"))
    assert done.returncode == 2 and "LAUNCHER_STORE_DEADLINE='soon'" in done.stderr, done.stderr


def test_a_full_work_dir_fails_the_run_naming_the_file_and_where_it_stays(tmp_path, launcher_home, small_fs):
    """Issue 28: each rank saved a 1.6 MB checkpoint into a 400 KiB work dir; `run` said only that a failure
    marker could not be written (exit 3), status records stayed `running`, `status` and `watch` failed the
    same way, and 17 temporary files were left behind, eating the space the marker needed."""
    spec, release = _stepping_spec(tmp_path, str(small_fs), checkpoint_bytes=1600 * 1024)
    release.touch()  # the job saves its checkpoint and ends at once
    done = run_cli("run", "-f", str(spec), cwd=tmp_path, env=_env(launcher_home), timeout=180)
    run_id = run_id_from(done.stdout)
    try:
        assert done.returncode == 1, done.stdout + done.stderr
        closing = done.stdout[done.stdout.rindex(f"\nrun {run_id} failed"):]
        kept = _temporary_outputs(run_id)
        # P6: the cause once, the same words for both nodes, so no 'also failed' line repeats it with another path
        assert re.search(rf"\n  cause: outputs sync of checkpoints/ck.pt: No space left on device in {small_fs}/"
                         rf"{run_id}\n", closing), closing
        assert "also failed" not in closing, closing
        for node in ("t-main", "t-worker-0"):  # P3: each node's files, and where they stay
            line = f"\n  node {node}: not in the work dir, kept in {kept}/{node}/outputs: checkpoints/ck.pt"
            assert line in closing, closing
            assert (kept / node / "outputs" / "checkpoints" / "ck.pt").stat().st_size == 1600 * 1024
        assert not [p for p in small_fs.rglob(".*") if p.name.endswith(".tmp")], list(small_fs.rglob("*"))
        for verb in (("status", run_id), ("watch", run_id)):
            read = run_cli(*verb, env=_env(launcher_home))
            assert read.returncode == 1, read.stdout + read.stderr
            assert "No space left on device" in read.stdout and "error:" not in read.stderr, read.stdout + read.stderr
        nodes = json.loads(run_cli("status", run_id, "--json", env=_env(launcher_home)).stdout)["nodes"]
        assert {node["state"] for node in nodes.values()} == {"failed"}, nodes
    finally:
        shutil.rmtree(_temporary_outputs(run_id), ignore_errors=True)


def test_a_work_dir_too_full_for_the_final_status_is_read_as_the_processes_ended(tmp_path, launcher_home,
                                                                                   small_fs):
    """When not even a status record fits, the node says so on its console and exits 3; readers derive the run's
    end from what the supervisor kept on this machine and never write."""
    spec, release = _stepping_spec(tmp_path, str(small_fs))
    live = LiveCli(["run", "-f", str(spec)], _env(launcher_home), cwd=tmp_path)
    try:
        live.wait_for(r"\] step 3\b")
        with open(small_fs / "filler", "wb", buffering=0) as filler:  # everything the work dir has left, then no more
            with pytest.raises(OSError, match="No space left"):
                while True:
                    filler.write(b"\0" * 4096)
                    filler.flush()
        release.touch()
        code, out = live.finish(timeout=120)
    finally:
        release.touch()
        if live.proc.poll() is None:
            live.proc.kill()
    assert code == 1, out
    closing = out[out.rindex("\nrun "):]
    cause = closing.splitlines()[2]
    assert "failed to record its end in the work dir (failed: outputs sync" in cause, closing
    assert "No space left on device" in cause and "kept in /" in cause, closing
    usage = shutil.disk_usage(small_fs)
    status = run_cli("status", run_id_from(out), env=_env(launcher_home))
    assert status.returncode == 1 and "failed to record its end" in status.stdout, status.stdout + status.stderr
    assert shutil.disk_usage(small_fs).used == usage.used  # reading wrote nothing
    assert not [p for p in small_fs.rglob(".*") if p.name.endswith(".tmp")]


def test_readers_of_a_read_only_work_dir_derive_a_lost_node_without_writing(tmp_path, launcher_home, small_fs):
    """`status` and `watch` recorded lost nodes into the work dir while reading; on a read-only one they failed."""
    spec, release = _stepping_spec(tmp_path, str(small_fs))
    live = LiveCli(["run", "-f", str(spec), "--detach"], _env(launcher_home), cwd=tmp_path)
    code, out = live.finish(timeout=60)
    assert code == 0, out
    run_id = run_id_from(out)
    try:
        watcher = LiveCli(["watch", run_id], _env(launcher_home))
        watcher.wait_for(r"\] step 3\b")
        watcher.proc.kill()
        supervisor, nodes = read_processes(launcher_home / "runs" / run_id)
        for ref in [supervisor, *nodes.values()]:  # nobody is left to record their end
            os.kill(ref.pid, 9)
        assert not wait_for_exit([supervisor, *nodes.values()], timeout=30)
        subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
        for verb in (("status", run_id), ("watch", run_id)):
            read = run_cli(*verb, env=_env(launcher_home))
            assert read.returncode == 1, read.stdout + read.stderr
            assert f"run {run_id} failed: node t-" in read.stdout and "no exit was recorded" in read.stdout, read.stdout
            assert "Read-only file system" in read.stderr and "error:" not in read.stderr, read.stderr
    finally:
        release.touch()
        shutil.rmtree(_temporary_outputs(run_id), ignore_errors=True)


def test_a_failed_write_leaves_no_temporary_file(small_fs):
    store = WorkDir(str(small_fs / "run"))
    store.put("small.json", b"{}")
    for write in (store.put, store.create):
        with pytest.raises(StoreError, match="No space left on device") as failed:
            write("big.bin", b"\0" * (600 * 1024))
        assert sorted(p.name for p in (small_fs / "run").iterdir()) == ["small.json"]
        assert failed.value.permanent and failed.value.key == "big.bin"


def test_a_commands_clock_starts_afresh_once_it_has_said_the_store_is_gone(own_moto):
    """A command's reads end with the error; a program reading many runs in one process is never stuck on it."""
    from launcher.protocol.outage import Outage

    store = WorkDir("s3://strain/runs/r3", fresh_instance=True, request_timeout=2, outage=Outage(3, for_good=False))
    _warm_up(store)
    own_moto.pause()
    try:
        with pytest.raises(StoreError, match="failed after"):
            store.get("a.json")
        tried = store.requests
        with pytest.raises(StoreError, match="failed after"):  # tried again, not "not tried"
            store.get("a.json")
        assert store.requests > tried
    finally:
        own_moto.resume()
    assert store.get("a.json") == b"{}"
