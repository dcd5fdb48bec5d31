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
