"""Work dirs that cannot be used, and object stores whose listings a follower must not trust from cache.

Regressions of issue 7, items 1, 2, 12 and 14: each of these hung, lost lines or showed a
traceback before.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from clirun import run_id_from
from cluster import write_spec
from conftest import SEED_004, run_cli
from launcher.backends.local import LocalBackend
from launcher.commands.watch import LogFollower
from launcher.protocol.logship import LogShipper
from launcher.protocol.store import StoreError, WorkDir
from launcher.runs import state
from launcher.runs.state import RunInfo
from launcher.spec import load_spec

COUNTING = """
import sys, time
for i in range(20):
    print(f"line {i:02d} of 20", flush=True)
    time.sleep(0.05)
"""


def _info(work_dir: str, run_id: str, nodes: list[str]) -> RunInfo:
    return RunInfo(run_id=run_id, backend="local", work_dir=work_dir, nodes=nodes, spec_file="", spec_digest="",
                   created_at=time.time())


def test_follower_sees_chunks_written_after_it_first_listed_them(s3_bucket):
    """s3fs caches listings of logs/<node>/: a follower that trusted them missed every later chunk."""
    info = _info(f"s3://{s3_bucket}/runs", "r1", ["a"])
    shipper = LogShipper(WorkDir(info.run_url, fresh_instance=True), "a")
    out = io.StringIO()
    follower = LogFollower(info, out)
    shipper.add("out", "first")
    shipper.flush()
    assert follower.poll() == 1
    for second in ("second", "third"):
        shipper.add("out", second)
        shipper.flush()
    assert follower.poll() == 2
    assert [line.split("] ", 1)[1] for line in out.getvalue().splitlines()] == ["first", "second", "third"]


def test_run_and_a_live_watch_on_s3_print_every_line(tmp_path, launcher_home, s3_bucket):
    spec = write_spec(tmp_path, COUNTING, nodes=2, work_dir=f"s3://{s3_bucket}/runs")
    started = run_cli("run", "-f", str(spec), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    live = run_cli("watch", run_id, timeout=180)  # started at once: it follows the run as it happens
    assert live.returncode == 0, live.stdout + live.stderr
    for node in ("t-main", "t-worker-0"):
        printed = [line for line in live.stdout.splitlines() if line.startswith(f"[{node}") and "of 20" in line]
        assert len(printed) == 20, live.stdout
    followed = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=180)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert followed.stdout.count("of 20") == 40, followed.stdout
    assert "line 19 of 20" in followed.stdout.splitlines()[-4] + "".join(followed.stdout.splitlines()[-12:])


def _refused(result: subprocess.CompletedProcess, launcher_home: Path, *needles: str) -> None:
    assert result.returncode == 3, result.stdout + result.stderr
    assert "nothing was started" in result.stderr and "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert not (launcher_home / "runs").exists() or not any((launcher_home / "runs").iterdir())


def test_unwritable_local_work_dir_is_refused_before_anything_starts(tmp_path, launcher_home):
    spec = write_spec(tmp_path, COUNTING, nodes=2, work_dir="/proc/launcher-wd")
    _refused(run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=30), launcher_home, "/proc/launcher-wd")


def test_missing_bucket_is_refused_at_once(tmp_path, launcher_home, moto, monkeypatch):
    for key, value in moto.env().items():
        monkeypatch.setenv(key, value)
    spec = write_spec(tmp_path, COUNTING, nodes=2, work_dir="s3://no-such-bucket-here/runs")
    started = time.monotonic()
    result = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=60)
    _refused(result, launcher_home, "no-such-bucket-here")
    assert "after" not in result.stderr.split("\n")[0], "a missing bucket is permanent: no retries"
    assert time.monotonic() - started < 20


def test_missing_credentials_are_refused_without_retries(tmp_path, launcher_home, moto, monkeypatch):
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", moto.endpoint)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    spec = write_spec(tmp_path, COUNTING, nodes=2, work_dir="s3://some-bucket/runs")
    _refused(run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=60), launcher_home, "NoCredentialsError")


def test_unreachable_endpoint_fails_in_seconds_with_the_cause(tmp_path, launcher_home, monkeypatch):
    from s3server import S3_ENV, free_port

    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    spec = write_spec(tmp_path, COUNTING, nodes=2, work_dir="s3://some-bucket/runs")
    result = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120)
    _refused(result, launcher_home, "Could not connect", "--set spec.cluster.spec.workDir=./work_dir")


def test_node_that_cannot_reach_its_work_dir_fails_in_seconds_with_the_stores_message(tmp_path):
    spec = write_spec(tmp_path, COUNTING, nodes=1)
    node = LocalBackend().plan(load_spec(spec))[0].nodes[0]
    env = {**os.environ, **node.env, "LAUNCHER_WORK_DIR": "/proc/launcher-wd"}
    done = subprocess.run(list(node.command), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "/proc/launcher-wd" in done.stderr and "No such file or directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_unsupported_work_dir_schemes_are_spec_errors(tmp_path):
    spec = write_spec(tmp_path, COUNTING, nodes=2, work_dir="gs://bucket/runs")
    result = run_cli("validate", "-f", str(spec))
    assert result.returncode == 2
    assert "workDir: must be a directory, s3://bucket/prefix or oci://bucket@namespace/prefix" in result.stderr


def test_oci_work_dir_without_ocifs_names_the_package_to_install(tmp_path, launcher_home):
    spec = write_spec(tmp_path, COUNTING, nodes=2, work_dir="oci://bucket@namespace/runs")
    hide = tmp_path / "no-ocifs"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['ocifs'] = None  # as if not installed\n")
    result = run_cli("run", "-f", str(spec), cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(hide)})
    assert result.returncode == 3, result.stderr
    assert "ocifs" in result.stderr and "pip install 'launcher[oci]'" in result.stderr
    assert "unexpected" not in result.stderr


def test_read_only_launcher_home_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_HOME", "/proc/launcher-home")
    spec = write_spec(tmp_path, COUNTING, nodes=1)
    result = run_cli("run", "-f", str(spec), cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "cannot write the run record" in result.stderr and "LAUNCHER_HOME" in result.stderr
    assert "unexpected" not in result.stderr


def test_init_into_a_file_is_bad_input(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("x")
    result = run_cli("init", "--framework", "pytorch", "--dir", str(target))
    assert result.returncode == 2, result.stderr
    assert "is not a directory" in result.stderr and "unexpected" not in result.stderr


def test_records_written_by_a_broken_node_do_not_break_the_readers(tmp_path, launcher_home):
    info = _info(str(tmp_path / "wd"), "broken-1", ["a", "b"])
    run = WorkDir(info.run_url)
    run.put("status/a.json", b"{not json")
    run.put("status/b.json", json.dumps(["a", "list"]).encode())
    run.put("rendezvous.json", b"\xff\xfe")
    run.put("control/failed.a.json", b"")
    run.put("logs/a/000000~1.000.jsonl", b'{"t": 1, "s": "out", "m": "kept"}\nnot json\n{"t": "x"}\n')
    state.save(info)
    status = run_cli("status", "broken-1", "--json")
    assert status.returncode in (0, 1) and "Traceback" not in status.stderr, status.stderr
    assert json.loads(status.stdout)["result"] == "pending"
    watched = run_cli("watch", "broken-1", "--no-follow")
    assert watched.returncode == 0 and "kept" in watched.stdout, watched.stderr
    (launcher_home / "runs" / "broken-1" / "info.yaml").write_text(yaml.safe_dump({"run_id": ["x"]}))
    listed = run_cli("list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    shown = run_cli("status", str(launcher_home / "runs" / "broken-1" / "info.yaml"))
    assert shown.returncode == 2 and "not a launcher info.yaml" in shown.stderr


def test_a_store_that_never_answers_ends_in_a_clear_failure_not_a_hang(tmp_path, launcher_home, monkeypatch):
    """Nodes and the client give up on a stalled store within their documented bounds."""
    from s3server import S3_ENV, StallingEndpoint

    stalled = StallingEndpoint()
    try:
        for key, value in {**S3_ENV, "FSSPEC_S3_ENDPOINT_URL": stalled.endpoint}.items():
            monkeypatch.setenv(key, value)
        spec = write_spec(tmp_path, COUNTING, nodes=2, work_dir="s3://stalled-bucket/runs")
        started = time.monotonic()
        result = run_cli("run", "-f", str(spec), cwd=tmp_path, timeout=120)
        client_seconds = time.monotonic() - started
        _refused(result, launcher_home, "FSTimeoutError")
        assert client_seconds < 40, client_seconds  # 10 s of retries plus one 10 s request timeout, and start-up

        node = LocalBackend().plan(load_spec(spec))[0].nodes[0]
        env = {**os.environ, **node.env, "LAUNCHER_STORE_TIMEOUT": "1", "LAUNCHER_STORE_DEADLINE": "5"}
        started = time.monotonic()
        done = subprocess.run(list(node.command), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        node_seconds = time.monotonic() - started
    finally:
        stalled.stop()
    assert done.returncode == 3, done.stderr
    assert "stalled-bucket" in done.stderr and "unreachable for" in done.stderr and "Traceback" not in done.stderr
    assert "limit 5s, LAUNCHER_STORE_DEADLINE" in done.stderr, done.stderr
    assert node_seconds < 60, node_seconds
    assert stalled.accepted > 2


def test_an_unreachable_endpoint_whose_port_contains_412_is_not_an_existing_object(tmp_path, monkeypatch):
    """The create-if-absent once read the digits of a port in an error message as HTTP 412."""
    from s3server import S3_ENV

    for key, value in {**S3_ENV, "FSSPEC_S3_ENDPOINT_URL": "http://127.0.0.1:41299"}.items():
        monkeypatch.setenv(key, value)
    from conftest import _reset_fsspec_config

    _reset_fsspec_config()
    # One try everywhere, so the connection error itself (its message holds the URL) is what comes back.
    store = WorkDir("s3://some-bucket/runs/r1", attempts=1, fresh_instance=True, request_timeout=60,
                    storage_options={"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 5}})
    store.fs.retries = 1
    with pytest.raises(StoreError, match="Could not connect"):
        store.create("run.json", b"{}")


def test_permanent_errors_are_told_by_type_and_code_not_by_words_in_a_url():
    import botocore.exceptions

    from launcher.protocol.store import is_permanent

    wrapped = OSError(5, "denied")
    wrapped.__cause__ = botocore.exceptions.ClientError({"Error": {"Code": "InvalidAccessKeyId"}}, "PutObject")
    assert is_permanent(wrapped) and is_permanent(botocore.exceptions.NoCredentialsError())
    assert not is_permanent(OSError(5, "cannot reach s3://bucket/AccessDeniedTests/NoSuchBucket/r1"))


def _timed_cli(args: tuple[str, ...], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = run_cli(*args, env=env, timeout=60)
    return time.monotonic() - started, done


def _oci_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    """A valid OCI API-key config, its service at ``endpoint``."""
    from ocisim import OciSim

    (tmp_path / "oci").mkdir()
    sim = OciSim(tmp_path / "oci")
    sim.stop()
    return {"OCI_CLI_CONFIG_FILE": str(sim.write_config(tmp_path / "oci")), "LAUNCHER_OCI_ENDPOINT": endpoint}


def test_read_verbs_give_up_on_a_store_that_is_down_within_the_stated_limit(tmp_path, launcher_home):
    """Issue 15: `status` was silent for 52 s on an unreachable S3 endpoint, `list` 80 s per such run.

    Every read verb says at once that the work dir is unreachable and gives up once it has been for
    LAUNCHER_STORE_DEADLINE (here 3 s; issue 28: they ride out shorter outages), whether the endpoint refuses
    (nothing listens) or never answers, S3 or OCI; `list` reads its runs at once, each with its quick bounds."""
    from s3server import S3_ENV, StallingEndpoint, free_port

    refused = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for index in range(6):
        state.save(_info("s3://down-bucket/runs", f"down-{index}", ["a", "b"]))
    base = {**os.environ, **S3_ENV, "LAUNCHER_HOME": str(launcher_home), "FSSPEC_S3_ENDPOINT_URL": refused,
            "LAUNCHER_STORE_DEADLINE": "3"}
    stalled = StallingEndpoint()
    calls = {
        "status": ("status", "down-0"),
        "show-config": ("show-config", "down-1"),
        "watch": ("watch", "down-2"),
        "cancel": ("cancel", "down-3"),
        "status URL": ("status", "s3://down-bucket/runs/elsewhere-1"),
        "status, stalled": ("status", "down-0"),
        "list, stalled": ("list",),
        "status, OCI": ("status", "oci://runs@ns/launcher/r1"),
    }
    stalling = {**base, "FSSPEC_S3_ENDPOINT_URL": stalled.endpoint}
    envs = {"status, stalled": stalling, "list, stalled": stalling, "status, OCI": {**base, **_oci_env(tmp_path, refused)}}
    try:
        with ThreadPoolExecutor(len(calls)) as pool:  # at once: the bound is per command, not per test
            futures = {verb: pool.submit(_timed_cli, args, envs.get(verb, base)) for verb, args in calls.items()}
            ended = {verb: future.result() for verb, future in futures.items()}
    finally:
        stalled.stop()
    for verb, (seconds, done) in ended.items():
        # Each ends in 11 to 12 s with 8 CLIs starting at once on 2 cores (the 3 s limit, or a stalled store's 10 s
        # request timeout, and their start-up); up to 27 s with another test session beside them. Read one by one,
        # the 6 stalled runs of `list` take a minute (before issue 15: 80 s for each).
        assert seconds < 40, (verb, seconds)
        assert "Traceback" not in done.stderr and "unexpected" not in done.stderr, (verb, done.stderr)
        if verb != "list, stalled":
            assert done.returncode == 3 and done.stderr.startswith("note: work dir "), (verb, done)
            assert "is unreachable since" in done.stderr and "\nerror: work dir " in done.stderr, (verb, done)
            assert "limit 3s, LAUNCHER_STORE_DEADLINE" in done.stderr, (verb, done.stderr)
    errors = {verb: done.stderr for verb, (_, done) in ended.items()}
    # the refused store's error names the refusal; on a machine too busy to see even the refusal within the request
    # timeout (2 s; seen with stress-ng beside the suite), the timeout: either way the cause, within the limit
    assert ("Could not connect" in errors["status"] or "FSTimeoutError" in errors["status"]) \
        and "s3://down-bucket/runs/down-0" in errors["status"], errors["status"]
    assert "FSTimeoutError" in errors["status, stalled"]
    assert "oci://runs@ns/launcher/r1" in errors["status, OCI"] and "Connection refused" in errors["status, OCI"]
    listed = ended["list, stalled"][1].stdout.splitlines()[1:]
    assert len(listed) == 6 and all("unknown (work dir s3://down-bucket/runs/down-" in row and "FSTimeoutError"
                                    in row for row in listed), listed


def test_a_local_run_on_a_store_it_cannot_use_says_how_to_run_it_with_a_local_work_dir(tmp_path, launcher_home):
    """Issue 15: seed 004 (an oci:// work dir) run locally without OCI credentials said only that it cannot."""
    spec = tmp_path / "seed004.yaml"
    spec.write_text(SEED_004.read_text())
    (tmp_path / "train.py").write_text("print('trained')\n")
    env = {**os.environ, "OCI_CLI_CONFIG_FILE": str(tmp_path / "no-oci-config")}
    refused = run_cli("run", "-f", str(spec), "--backend", "local", cwd=tmp_path, env=env)
    assert refused.returncode == 3, refused.stderr
    assert "no OCI credentials" in refused.stderr
    hint = "add: --set spec.cluster.spec.workDir=./work_dir"
    assert hint in refused.stderr, refused.stderr
    planned = run_cli("run", "-f", str(spec), "--backend", "local", "--dry-run", "--output", "json",
                      *hint.split(": ", 1)[1].split(), cwd=tmp_path, env=env)  # what the hint says works
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["work_dir"] == str(tmp_path / "work_dir")
