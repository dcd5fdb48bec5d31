"""The docker backend, `launcher build` and the compose file, on a real engine, registry and docker-compose.

The engine, the node base image and the registry come from the session fixtures in conftest
(see dockerenv.py). One project is built once per module; each test runs its own cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from clirun import Watcher, info_of, init_project, interruptible, run_id_from, wait_until
from conftest import run_cli

pytestmark = pytest.mark.slow


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def run_containers(run_id: str) -> list[str]:
    return docker("ps", "-aq", "--filter", f"label=launcher.run-id={run_id}").stdout.split()


def run_networks(run_id: str) -> list[str]:
    return docker("network", "ls", "-q", "--filter", f"label=launcher.run-id={run_id}").stdout.split()


@pytest.fixture(scope="module")
def project(tmp_path_factory, node_base_image):
    """An init'ed example project with credentials and data beside the code, built once: (spec, env)."""
    root = tmp_path_factory.mktemp("docker-project")
    spec = init_project(root / "proj", workers=1, epochs=3)
    (spec.parent / ".oci").mkdir()
    (spec.parent / ".oci" / "config").write_text("[DEFAULT]\nkey_file=secret\n")
    (spec.parent / "work_dir" / "old-run").mkdir(parents=True)
    (spec.parent / ".dockerignore").write_text("*.log\n")
    (spec.parent / "debug.log").write_text("not for the image\n")
    env = {**os.environ, "LAUNCHER_HOME": str(root / "home")}
    done = run_cli("build", "-f", str(spec), "--build-arg", f"BASE_IMAGE={node_base_image}", env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return spec, env


def recorded_image(env: dict, spec: Path | None = None) -> dict:
    """What `launcher build` recorded for ``spec`` (default: the project's train.yaml)."""
    records = [json.loads(path.read_text()) for path in (Path(env["LAUNCHER_HOME"]) / "images").glob("*.json")]
    [record] = [r for r in records if spec is None and r["spec_file"].endswith("/proj/train.yaml")
                or r["spec_file"] == str(spec)]
    return record


def test_build_records_the_image_and_keeps_data_and_secrets_out(project):
    spec, env = project
    record = recorded_image(env)
    assert record["spec_file"] == str(spec) and record["tag"].startswith("launcher/pytorch-ddp:")
    listing = docker("run", "--rm", "--entrypoint", "ls", record["tag"], "-a", "/code", "/opt/launcher").stdout
    assert "train.py" in listing and "node_entry.py" in listing and "launcher" in listing
    for kept_out in (".oci", "work_dir", "debug.log"):
        assert kept_out not in listing.split(), listing
    again = run_cli("build", "-f", str(spec), "--build-arg", f"BASE_IMAGE={record['build_args']['BASE_IMAGE']}",
                    env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert re.search(r"(\d+) of 12 steps from cache", again.stdout).group(1) == "10"  # all but FROM and ARG
    assert recorded_image(env)["image_id"] == record["image_id"]
    dry = run_cli("run", "-f", str(spec), "--backend", "docker", "--dry-run", "--output", "json", env=env)
    assert {node["image"] for node in json.loads(dry.stdout)["nodes"]} == {record["tag"]}


def test_a_failing_build_step_is_quoted_and_records_nothing(tmp_path, node_base_image, launcher_home):
    spec = init_project(tmp_path / "proj", workers=1, epochs=1)
    done = run_cli("build", "-f", str(spec), "--build-arg", f"BASE_IMAGE={node_base_image}",
                   # a wheel that is not in the image: pip fails at once (a name to look up would wait on an index
                   # the build container cannot reach, about a minute of retries)
                   "--build-arg", "TORCH_SPEC=/wheels/no-such-package-anywhere-0.0-py3-none-any.whl", timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert re.search(r"image build failed at Step \d+/12 : RUN python -m pip install", done.stderr)
    assert "no-such-package-anywhere" in done.stderr and "returned a non-zero code" in done.stderr
    assert not (launcher_home / "images").exists()


def test_no_engine_is_a_clear_error(tmp_path, launcher_home):
    spec = init_project(tmp_path / "proj", workers=1, epochs=1)
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    for argv in (["build", "-f", str(spec)], ["run", "-f", str(spec), "--backend", "docker"]):
        done = run_cli(*argv, env=env)
        assert done.returncode == 3, done.stderr
        assert f"cannot reach the Docker engine at unix://{tmp_path}/no-engine.sock" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (launcher_home / "runs").exists()


def test_run_before_build_says_so_and_starts_nothing(tmp_path, docker_engine, launcher_home):
    spec = init_project(tmp_path / "proj", workers=1, epochs=1)
    done = run_cli("run", "-f", str(spec), "--backend", "docker", "--run-id", "never-built-1")
    assert done.returncode == 2, done.stderr
    assert '("@image") has not been built yet' in done.stderr and "launcher build -f" in done.stderr
    assert run_containers("never-built-1") == [] and not (launcher_home / "runs").exists()


def test_a_refused_push_records_the_build_not_a_push(project):
    spec, env = project
    base = recorded_image(env)["build_args"]["BASE_IMAGE"]
    refused = run_cli("build", "-f", str(spec), "--tag", "127.0.0.1:9/launcher-test/train:v1", "--push",
                      "--build-arg", f"BASE_IMAGE={base}", env=env, timeout=300)
    assert refused.returncode == 3 and "push of 127.0.0.1:9/launcher-test/train:v1 refused" in refused.stderr
    record = recorded_image(env)
    assert record["tag"] == "127.0.0.1:9/launcher-test/train:v1" and record["pushed"] is None


def test_two_node_run_trains_shows_both_nodes_and_leaves_no_container(project):
    spec, env = project
    done = run_cli("run", "-f", str(spec), "--backend", "docker", env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    assert f"run {run_id} succeeded" in done.stdout
    watched = run_cli("watch", run_id, "--no-follow", env=env)
    for node in ("pytorch-ddp-main", "pytorch-ddp-worker-0"):
        assert re.search(rf"\[{node}\s+r\d\] rank \d: epoch 3/3", watched.stdout), watched.stdout
    assert (spec.parent / "work_dir" / run_id / "outputs" / "pytorch-ddp-main" / "model.pt").is_file()
    status = json.loads(run_cli("status", run_id, "--json", env=env).stdout)
    assert status["result"] == "succeeded"
    info = info_of(Path(env["LAUNCHER_HOME"]), run_id)
    assert info["backend"] == "docker" and set(info["backend_ids"]["containers"]) == set(info["nodes"])
    assert run_containers(run_id) == [] and run_networks(run_id) == []  # `run` returned after the clean-up


@pytest.mark.parametrize("how", [["kill"], ["rm", "-f"]])
def test_docker_kill_of_a_node_fails_the_run_fast_and_names_it(project, how):
    """docker kill, or docker rm -f (the container is gone before the supervisor can read it)."""
    spec, env = project
    started = run_cli("run", "-f", str(spec), "--backend", "docker", "--detach", "--", "--epochs", "500", env=env)
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    watcher = Watcher(run_id, env)
    watcher.wait_for(r"\[pytorch-ddp-worker-0\s+r\d\] rank \d: epoch 1/500", timeout=180)
    killed_at = time.monotonic()
    assert docker(*how, f"{run_id}-pytorch-ddp-worker-0").returncode == 0
    code, output = watcher.finish(timeout=60)
    assert code == 1, output
    assert time.monotonic() - killed_at < 10 + 5, "the run must end within 10 s of the kill (+ watch's poll)"
    status = json.loads(run_cli("status", run_id, "--json", env=env).stdout)
    assert status["result"] == "failed"
    assert status["first_failure"]["node"] == "pytorch-ddp-worker-0" and status["first_failure"]["exit_code"] == 137
    assert wait_until(lambda: not run_containers(run_id), 30)


def test_cancel_leaves_no_container(project):
    spec, env = project
    started = run_cli("run", "-f", str(spec), "--backend", "docker", "--detach", "--", "--epochs", "500", env=env)
    run_id = run_id_from(started.stdout)
    Watcher(run_id, env).wait_for(r"rank \d: epoch 1/500", timeout=180)
    done = run_cli("cancel", run_id, "--grace", "10", env=env)
    assert done.returncode == 0, done.stderr
    assert run_containers(run_id) == [] and run_networks(run_id) == []
    assert json.loads(run_cli("status", run_id, "--json", env=env).stdout)["result"] == "cancelled"


HOSTILE_ARGS = ["it's \"quoted\"", "$(touch /tmp/pwned) `id` $HOME", "two\nlines", "naïve ☃ 日本", "--flag=a b",
                ""]


def test_hostile_args_reach_the_script_byte_for_byte(project, tmp_path):
    spec, env = project
    (spec.parent / "echo_args.py").write_text(
        "import json, sys\nprint('ARGV ' + json.dumps(sys.argv[1:]), flush=True)\n")
    spec_text = spec.read_text().replace("entryPoint: train.py", "entryPoint: echo_args.py")
    echo_spec = spec.parent / "echo.yaml"
    echo_spec.write_text(spec_text)
    built = run_cli("build", "-f", str(echo_spec), "--build-arg",
                    f"BASE_IMAGE={recorded_image(env)['build_args']['BASE_IMAGE']}", env=env, timeout=300)
    assert built.returncode == 0, built.stderr
    done = run_cli("run", "-f", str(echo_spec), "--backend", "docker", "--keep", "--", *HOSTILE_ARGS, env=env,
                   timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [json.loads(line.split("ARGV ", 1)[1]) for line in done.stdout.splitlines() if "ARGV " in line]
    assert seen == [HOSTILE_ARGS, HOSTILE_ARGS]  # one per node
    run_id = run_id_from(done.stdout)
    kept = run_containers(run_id)  # --keep: the supervisor leaves them for docker logs / inspect
    assert len(kept) == 2 and "ARGV" in docker("logs", kept[0]).stdout
    assert f"remove them with: launcher clean {run_id}" in done.stdout
    cleaned = run_cli("clean", run_id, env=env)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert f"container {run_id}-pytorch-ddp-main" in cleaned.stdout and f"network launcher-{run_id}" in cleaned.stdout
    assert run_containers(run_id) == [] and run_networks(run_id) == []


def test_s3_work_dir_on_the_host_network(project, moto, tmp_path):
    """An object-store work dir reached over the network: the nodes get this machine's S3 settings, and no
    ~/.aws is made where there is none."""
    spec, env = project
    moto.make_bucket("docker-s3-run")
    s3_spec = spec.parent / "s3.yaml"
    s3_spec.write_text(spec.read_text()
                       .replace("workDir: ./work_dir", "workDir: s3://docker-s3-run/runs")
                       .replace("image: \"@image\"", f"image: {recorded_image(env)['tag']}")
                       .replace("    type: local\n", "    type: docker\n    spec:\n      network: host\n"))
    home = tmp_path / "home-without-aws"
    home.mkdir()
    done = run_cli("run", "-f", str(s3_spec), env={**env, **moto.env(), "HOME": str(home)}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(home.iterdir()) == []
    assert "work dir s3://docker-s3-run/runs/" in done.stdout
    run_id = run_id_from(done.stdout)
    assert "MASTER_ADDR=127.0.0.1" in done.stdout
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=moto.endpoint, skip_instance_cache=True)
    assert fs.exists(f"docker-s3-run/runs/{run_id}/outputs/pytorch-ddp-main/model.pt")
    assert not (spec.parent / "work_dir" / run_id).exists()


@pytest.mark.parametrize("delay", [0.4, 0.8, 1.4])
def test_ctrl_c_during_docker_submission_leaves_no_container(project, delay):
    import signal
    import sys

    spec, env = project
    run_id = f"docker-interrupted-{int(delay * 10)}"
    client = subprocess.Popen([sys.executable, "-m", "launcher", "run", "-f", str(spec), "--backend", "docker",
                               "--run-id", run_id, "--", "--epochs", "500"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=interruptible)
    time.sleep(delay)  # the interrupt is meant to land at an arbitrary point of submission
    client.send_signal(signal.SIGINT)
    output = client.communicate(timeout=120)[0]
    assert client.returncode in (0, 1, 130, -signal.SIGINT), output
    assert "Traceback" not in output
    if (Path(env["LAUNCHER_HOME"]) / "runs" / run_id / "info.yaml").exists():  # recorded: it ends, and is listed
        cancel = run_cli("cancel", run_id, "--grace", "5", env=env, timeout=120)
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        assert json.loads(run_cli("status", run_id, "--json", env=env).stdout)["result"] in ("cancelled", "failed")
    assert wait_until(lambda: not run_containers(run_id) and not run_networks(run_id), 30), output


def test_stopping_a_container_that_ended_meanwhile_is_not_an_error(node_base_image):
    """cancel's race: a node exits between the grace running out and the kill (the engine answers 409)."""
    from launcher.backends.docker import _kill, _wait
    from launcher.dockerengine import connect

    client = connect()
    container = client.containers.run(node_base_image, ["true"], detach=True)
    try:
        container.wait(timeout=60)
        assert _kill(container) is False
        assert _wait(container, 0.1) is True
    finally:
        container.remove(force=True)
    assert _kill(container) is False and _wait(container, 0.1) is True  # removed: the same answers


def copy_project(spec: Path, target: Path, env: dict, files: dict[str, str] | None = None) -> Path:
    """The project in a new directory (its own spec file, so its own image record), with ``files`` (name: text)
    written into it, built; no run data."""
    import shutil

    shutil.copytree(spec.parent, target, ignore=shutil.ignore_patterns("work_dir"))
    for name, text in (files or {}).items():
        (target / name).write_text(text)
    copy = target / spec.name
    base = f"BASE_IMAGE={recorded_image(env)['build_args']['BASE_IMAGE']}"  # never a registry's default image
    built = run_cli("build", "-f", str(copy), "--build-arg", base, env=env, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    return copy


NEVER_IN_THE_IMAGE = (".env", ".env.local", ".aws", "server.pem", ".git", ".oci", "work_dir", "compose.yaml")


def test_dockerignore_lines_never_put_secrets_or_run_data_into_the_image(project, tmp_path):
    spec, env = project
    spec = copy_project(spec, tmp_path / "dockerignored", env)
    root = spec.parent
    for path in (".env", ".env.local", ".aws/credentials", "server.pem", ".git/config",
                 "work_dir/run-1/outputs/model.pt"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("secret\n")
    assert run_cli("compose", "-f", str(spec), "-o", str(root / "compose.yaml"), env=env,
                   timeout=300).returncode == 0
    base = f"BASE_IMAGE={recorded_image(env)['build_args']['BASE_IMAGE']}"
    for dockerignore in ("!.env\n!.aws\n!server.pem\n!.git\n!work_dir\n!compose.yaml\n",  # re-include
                         "*\n!train.py\n!train.yaml\n"):  # an allow-list
        (root / ".dockerignore").write_text(dockerignore)
        done = run_cli("build", "-f", str(spec), "--build-arg", base, env=env, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        files = docker("run", "--rm", "--entrypoint", "find", recorded_image(env, spec)["tag"], "/code").stdout
        found = {line.removeprefix("/code/").split("/")[0] for line in files.split()}
        assert "train.py" in found and not found & set(NEVER_IN_THE_IMAGE), files
    assert "never sent, whatever .dockerignore says: .aws, .env, .git, server.pem" not in done.stdout  # allow-list


def test_the_image_that_was_pushed_is_the_one_that_runs(project, registry, tmp_path):
    """After `build --push`, "@image" is the pushed digest: pulled when the engine no longer has it."""
    spec, env = project
    spec = copy_project(spec, tmp_path / "pushed", env)
    base = recorded_image(env)["build_args"]["BASE_IMAGE"]
    tag = f"{registry.address}/launcher-test/pushed:v1"
    done = run_cli("build", "-f", str(spec), "--tag", tag, "--push", "--build-arg", f"BASE_IMAGE={base}",
                   env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    pushed = recorded_image(env, spec)["pushed"]
    assert re.fullmatch(rf"{re.escape(registry.address)}/launcher-test/pushed@sha256:[0-9a-f]{{64}}", pushed)
    assert docker("rmi", tag).returncode == 0
    docker("rmi", pushed)  # the digest reference too, if the engine kept one: nothing of it is left locally
    assert docker("image", "inspect", pushed).returncode != 0
    dry = run_cli("run", "-f", str(spec), "--backend", "docker", "--dry-run", "--output", "json", env=env)
    assert {node["image"] for node in json.loads(dry.stdout)["nodes"]} == {pushed}
    ran = run_cli("run", "-f", str(spec), "--backend", "docker", env=env, timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert docker("image", "inspect", pushed).returncode == 0


def test_a_container_that_dies_before_reporting_shows_why(project):
    """A node that cannot even start (its command is not found): the summary quotes its last lines."""
    spec, env = project
    done = run_cli("run", "-f", str(spec), "--backend", "docker", "--env", "PATH=/nowhere", env=env, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = done.stdout[done.stdout.rindex("\nrun "):]
    assert "without reporting" in summary and "its console log is" in summary, summary
    assert "exec python failed: No such file or directory" in summary, summary
    run_id = run_id_from(done.stdout)
    status = run_cli("status", run_id, env=env)
    assert "exec python failed: No such file or directory" in status.stdout, status.stdout


def test_a_dead_supervisors_duties_are_taken_over_by_the_next_command(project):
    """kill -9 of the supervisor, then docker kill of a worker: `status` records the worker's death with the
    engine's time (the worker is the cause, not the main it stopped), and removes what is left once all ended."""
    import signal

    spec, env = project
    started = run_cli("run", "-f", str(spec), "--backend", "docker", "--detach", "--", "--epochs", "500", env=env)
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    Watcher(run_id, env).wait_for(r"\[pytorch-ddp-worker-0\s+r\d\] rank \d: epoch 1/500", timeout=180)
    supervisor = json.loads((Path(env["LAUNCHER_HOME"]) / "runs" / run_id / "supervisor.json").read_text())
    os.kill(supervisor["supervisor"]["pid"], signal.SIGKILL)
    assert docker("kill", f"{run_id}-pytorch-ddp-worker-0").returncode == 0

    def ended() -> dict | None:
        status = json.loads(run_cli("status", run_id, "--json", env=env).stdout)
        return status if status["result"] == "failed" and not run_containers(run_id) else None

    assert wait_until(ended, 90), run_cli("status", run_id, env=env).stdout
    status = ended()
    assert status["first_failure"]["node"] == "pytorch-ddp-worker-0" and status["first_failure"]["exit_code"] == 137
    assert run_networks(run_id) == []
    cancel = run_cli("cancel", run_id, env=env)
    assert cancel.returncode == 0 and "already ended: failed" in cancel.stdout


def test_compose_runs_the_current_code_once_built_and_launcher_sees_the_run(project, docker_compose_bin, tmp_path):
    spec, env = project
    spec = copy_project(spec, tmp_path / "composed", env)
    (spec.parent / "train.py").write_text((spec.parent / "train.py").read_text()
                                          + "\nprint('edited after the first build', flush=True)\n")
    out = spec.parent / "docker-compose.yaml"
    done = run_cli("compose", "-f", str(spec), "-o", str(out), env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert '"@image" is older than the code: building it first' in done.stderr  # compose itself never builds
    document = yaml.safe_load(out.read_text())
    assert all("build" not in service for service in document["services"].values())
    assert {service["image"] for service in document["services"].values()} == {recorded_image(env, spec)["tag"]}
    run_id = document["services"]["pytorch-ddp-main"]["environment"]["LAUNCHER_RUN_ID"]
    pending = json.loads(run_cli("status", run_id, "--json", env=env).stdout)
    assert pending["result"] == "pending"  # recorded when the file was written
    up = subprocess.run([docker_compose_bin, "-f", str(out), "up", "--abort-on-container-exit", "-t", "120"],
                        capture_output=True, text=True, timeout=600, cwd=spec.parent)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "edited after the first build" in up.stdout + up.stderr
        assert json.loads(run_cli("status", run_id, "--json", env=env).stdout)["result"] == "succeeded"
        watched = run_cli("watch", run_id, "--no-follow", env=env)
        assert re.search(r"\[pytorch-ddp-worker-0\s+r\d\] rank \d: epoch 3/3", watched.stdout), watched.stdout
        again = subprocess.run([docker_compose_bin, "-f", str(out), "up", "--abort-on-container-exit"],
                               capture_output=True, text=True, timeout=300, cwd=spec.parent)
        assert again.returncode != 0 and "its run id was used before" in again.stdout + again.stderr
    finally:
        subprocess.run([docker_compose_bin, "-f", str(out), "down", "-t", "1"], capture_output=True, timeout=120)


def test_a_node_killed_under_compose_is_recorded_by_the_next_command(project, docker_compose_bin, tmp_path):
    spec, env = project
    spec = copy_project(spec, tmp_path / "composed-kill", env)
    spec.write_text(spec.read_text().replace("        - 3\n", "        - 500\n"))
    out = spec.parent / "docker-compose.yaml"
    done = run_cli("compose", "-f", str(spec), "-o", str(out), env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    run_id = yaml.safe_load(out.read_text())["services"]["pytorch-ddp-main"]["environment"]["LAUNCHER_RUN_ID"]
    up = subprocess.Popen([docker_compose_bin, "-f", str(out), "up", "--abort-on-container-exit", "-t", "30"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=spec.parent)
    try:
        Watcher(run_id, env).wait_for(r"\[pytorch-ddp-worker-0\s+r\d\] rank \d: epoch 1/500", timeout=180)
        assert docker("kill", f"{run_id}-pytorch-ddp-worker-0").returncode == 0
        status = run_cli("status", run_id, "--json", env=env)
        first = json.loads(status.stdout)["first_failure"]
        assert first["node"] == "pytorch-ddp-worker-0" and first["exit_code"] == 137, status.stdout
        up.wait(timeout=120)
    finally:
        up.kill()
        subprocess.run([docker_compose_bin, "-f", str(out), "down", "-t", "1"], capture_output=True, timeout=120)
    cleaned = run_cli("clean", run_id, env=env)
    assert cleaned.returncode == 0 and not (Path(env["LAUNCHER_HOME"]) / "runs" / run_id).exists()


def test_the_training_processes_of_containers_on_one_engine_start_warm_with_their_share_of_threads(project, tmp_path):
    from launcher.node.threads import usable_cores
    from test_warm_start import PROBE, facts_of

    spec, env = project
    probing = spec.read_text().replace("entryPoint: train.py", "entryPoint: probe.py")
    spec = copy_project(spec, tmp_path / "probe", env, files={"probe.py": PROBE, spec.name: probing})
    done = run_cli("run", "-f", str(spec), "--backend", "docker", env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_from(done.stdout)
    facts = facts_of(spec.parent / "work_dir" / run_id)
    assert sorted(facts) == [0, 1] and all(said["warm"] for said in facts.values()), facts
    cores = usable_cores()  # the containers have no CPU limit: the engine's machine is this one
    share = max(1, cores // 2)
    assert all(said["threads"] == int(said["omp"]) == share for said in facts.values()), facts
    watched = run_cli("watch", run_id, "-v", "--no-follow", env=env).stdout
    assert watched.count(f"per process ({cores} core{'s' if cores > 1 else ''} / 2 processes)") == 2, watched
    assert "afresh" not in watched, watched
