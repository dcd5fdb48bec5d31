"""launcher compose: one service per node with the plan's env; accepted by docker-compose and the Compose schema."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import SEED_004, require, run_cli

COMPOSE_SCHEMA = Path("/usr/lib/python3/dist-packages/compose/config/compose_spec.json")


def local_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "train.yaml"
    spec.write_text(SEED_004.read_text()
                    .replace('workDir: "oci://my-bucket@my-namespace/path/to/dir/"', "workDir: ./work_dir")
                    .replace("        - --timeout", "        - --note\n        - 'costs $5 $(whoami)'\n        - --timeout"))
    return spec


@pytest.fixture
def compose_file(tmp_path, launcher_home) -> Path:
    out = tmp_path / "docker-compose.yaml"
    done = run_cli("compose", "-f", str(local_spec(tmp_path)), "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


def test_one_service_per_node_with_the_plans_env_and_mounts(compose_file, tmp_path):
    doc = yaml.safe_load(compose_file.read_text())
    services = doc["services"]
    assert list(services) == ["PyTorch-Distributed-main", "PyTorch-Distributed-worker-0",
                              "PyTorch-Distributed-worker-1"]
    for name, service in services.items():
        assert service["environment"]["LAUNCHER_NODE_NAME"] == name
        assert service["environment"]["LAUNCHER_WORK_DIR"] == "/launcher/workdir"
        assert f"{tmp_path / 'work_dir'}:/launcher/workdir" in service["volumes"]  # read-write
    run_ids = {s["environment"]["LAUNCHER_RUN_ID"] for s in services.values()}
    assert len(run_ids) == 1


def test_docker_compose_accepts_it_and_keeps_dollars_literal(compose_file, docker_compose_bin):
    done = subprocess.run([docker_compose_bin, "-f", str(compose_file), "config"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "HOME": "/nonexistent"})
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    args = json.loads(resolved["services"]["PyTorch-Distributed-main"]["environment"]["LAUNCHER_ARGS"])
    # `config` prints values still escaped ($$); unescaped they are the spec's bytes, nothing interpolated.
    assert "costs $$5 $$(whoami)" in args
    assert "is not set" not in done.stderr


def test_compose_specification_schema_accepts_it(compose_file):
    require(COMPOSE_SCHEMA.exists(), "docker-compose's compose_spec.json is not installed (apt-get install docker-compose)")
    import jsonschema

    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)  # the draft compose_spec.json declares
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(compose_file.read_text()))]
    assert errors == []


def s3_spec(tmp_path: Path, bucket: str, network: str) -> Path:
    data = yaml.safe_load(local_spec(tmp_path).read_text())
    data["spec"]["infrastructure"] = {"kind": "infrastructure", "type": "docker", "apiVersion": "v1.0",
                                      "spec": {"network": network}}
    data["spec"]["cluster"]["spec"]["workDir"] = f"s3://{bucket}/runs"
    spec = tmp_path / "s3.yaml"
    spec.write_text(yaml.safe_dump(data))
    return spec


@pytest.mark.parametrize("has_aws_dir", [True, False])
def test_s3_client_settings_by_reference(
        tmp_path, s3_bucket, launcher_home, has_aws_dir):
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True) if has_aws_dir else home.mkdir()
    done = run_cli("compose", "-f", str(s3_spec(tmp_path, s3_bucket, "host")), env={**os.environ, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert ("secret" not in done.stdout.lower().replace("aws_secret_access_key", "")
            and "testing" not in done.stdout)  # no credential in the file: compose reads them at `up`
    service = yaml.safe_load(done.stdout)["services"]["PyTorch-Distributed-main"]
    assert service["volumes"] == ([f"{home / '.aws'}:/root/.aws:ro"] if has_aws_dir else [])
    assert (home / ".aws").exists() == has_aws_dir
    environment = service["environment"]
    assert environment["AWS_SECRET_ACCESS_KEY"] == "${AWS_SECRET_ACCESS_KEY}"
    assert environment["FSSPEC_S3_ENDPOINT_URL"] == "${FSSPEC_S3_ENDPOINT_URL}"
    assert environment["LAUNCHER_WORK_DIR"] == f"s3://{s3_bucket}/runs"


def test_a_loopback_s3_endpoint_on_a_bridge_network_is_refused_before_anything_is_written(
        tmp_path, s3_bucket, launcher_home):
    out = tmp_path / "docker-compose.yaml"
    done = run_cli("compose", "-f", str(s3_spec(tmp_path, s3_bucket, "bridge")), "-o", str(out))
    assert done.returncode == 2
    assert "is a loopback address of this machine" in done.stderr and "network: host" in done.stderr
    assert not out.exists() and not launcher_home.exists()


def test_compose_never_overwrites_without_force(compose_file, tmp_path):
    before = compose_file.read_text()
    again = run_cli("compose", "-f", str(local_spec(tmp_path)), "-o", str(compose_file))
    assert again.returncode == 2 and "use --force" in again.stderr
    assert compose_file.read_text() == before
    forced = run_cli("compose", "-f", str(local_spec(tmp_path)), "-o", str(compose_file), "--force")
    assert forced.returncode == 0 and compose_file.read_text() != before  # a new run id


# -- run's overrides (--set, --env, --nodes, -- ARGS), on compose too (issue 26) --------------------------------------
OVERRIDES = ["--set", "spec.cluster.spec.workDir=./wd", "--env", "MODE=test", "--env", "HF_TOKEN=hf_abc123",
             "--nodes", "2", "--", "--epochs", "1"]


def test_a_spec_whose_work_dir_needs_credentials_is_composed_for_a_local_test_without_editing_it(
        tmp_path, launcher_home):
    """The seed's work dir is oci://: compose alone refuses it (no OCI credentials here); with run's overrides it
    writes a local cluster, the file untouched, and records the run with its overrides as run does."""
    spec = tmp_path / "train.yaml"
    spec.write_text(SEED_004.read_text())
    env = {key: value for key, value in os.environ.items() if not key.startswith("OCI_")}
    env["HOME"] = str(tmp_path / "home")
    refused = run_cli("compose", "-f", str(spec), env=env)
    assert refused.returncode == 3 and "no OCI credentials" in refused.stderr, refused.stderr

    out = tmp_path / "docker-compose.yaml"
    done = run_cli("compose", "-f", str(spec), "-o", str(out), *OVERRIDES, env=env)
    assert done.returncode == 0, done.stderr
    assert spec.read_text() == SEED_004.read_text()
    text = out.read_text()
    services = yaml.safe_load(text)["services"]
    assert list(services) == ["PyTorch-Distributed-main", "PyTorch-Distributed-worker-0"]  # --nodes 2
    for service in services.values():
        environment = service["environment"]
        assert environment["MODE"] == "test" and environment["NCCL_ASYNC_ERROR_HANDLING"] == "1"  # added to the spec's
        assert json.loads(environment["LAUNCHER_ARGS"]) == ["--epochs", "1"]  # -- ARGS replaced the spec's args
        assert f"{tmp_path / 'wd'}:/launcher/workdir" in service["volumes"]
    # the file and the run record say how the spec was changed, the token masked
    assert ("# The spec's overrides: --set spec.cluster.spec.workDir=./wd --env MODE=test --env HF_TOKEN=******** "
            "--nodes 2 -- --epochs 1\n") in text
    [info] = (launcher_home / "runs").glob("*/info.yaml")
    record = yaml.safe_load(info.read_text())
    assert record["work_dir"] == str(tmp_path / "wd") and record["nodes"] == list(services)
    assert record["overrides"] == ["--set spec.cluster.spec.workDir=./wd", "--env MODE=test",
                                   "--env HF_TOKEN=********", "--nodes 2", "-- --epochs 1"]
    # the same code as run's: run --dry-run with the same options shows the same overrides and effective spec
    dry = run_cli("run", "-f", str(spec), "--backend", "docker", "--dry-run", "--output", "json", *OVERRIDES, env=env)
    assert dry.returncode == 0, dry.stderr
    shown = json.loads(dry.stdout)
    assert (shown["overrides"], shown["effective_spec"]) == (record["overrides"], record["effective_spec"])


def test_a_bad_override_on_compose_is_reported_against_the_option_and_nothing_is_written(tmp_path, launcher_home):
    out = tmp_path / "docker-compose.yaml"
    done = run_cli("compose", "-f", str(local_spec(tmp_path)), "-o", str(out), "--set",
                   "spec.cluster.spec.wroker.replicas=2")
    assert done.returncode == 2
    assert ("--set spec.cluster.spec.wroker.replicas=2: spec.cluster.spec.wroker: unknown key 'wroker'; "
            "did you mean 'worker'?") in done.stderr
    assert not out.exists() and not launcher_home.exists()
    no_nodes = run_cli("compose", "-f", str(local_spec(tmp_path)), "--nodes", "0")
    assert no_nodes.returncode == 2 and "--nodes: '0': must be at least 1" in no_nodes.stderr


def test_compose_builds_the_image_of_the_spec_as_overridden(tmp_path, monkeypatch):
    """"@image" built first by compose is built from the overridden spec: a local work dir that --set names is
    kept out of the image, and the identity compose compares is the one the build records."""
    from launcher.commands import build as build_module
    from launcher.commands.compose import ensure_current_image
    from launcher.image.identity import local_paths_kept_out
    from launcher.spec import Overrides, load_spec

    spec_file = local_spec(tmp_path)
    spec = load_spec(spec_file, Overrides(sets=("spec.cluster.spec.workDir=./scratch",)))
    built = []
    monkeypatch.setattr(build_module, "build", lambda file, **options: built.append((file, options["spec"])))
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home"))
    ensure_current_image(spec, str(spec_file))
    [(file, used)] = built
    assert file == str(spec_file) and used is spec
    assert str(tmp_path / "scratch") in local_paths_kept_out(used)
