"""run --dry-run: exactly the requests a run sends, secrets masked, and no side effects of any kind."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
import yaml

from conftest import REPO, SEED_004, SPECS, run_cli
from launcher.backends import backend_for
from launcher.spec import load_spec

# Never on the dry-run path: backend SDKs, torch, templates, and jsonschema with its dependencies (a valid
# spec passes launcher.spec.conforms; jsonschema only words the problems of an invalid one).
HEAVY = ("oci", "ocifs", "docker", "torch", "s3fs", "jinja2", "botocore",
         "jsonschema", "jsonschema_specifications", "referencing", "rpds", "attr", "attrs")
# Modules the three dry-runs below may import beyond those already loaded (191 now): a budget that fails when
# a heavy dependency creeps onto the path (jsonschema alone brought 56), rather than a timing; launcher's own
# small modules may grow it a little.
MODULE_BUDGET = 200

SPEC_WITH_SECRETS = """\
kind: distributed
apiVersion: v1.0
spec:
  infrastructure: {kind: infrastructure, type: local}
  cluster:
    kind: pytorch
    spec:
      workDir: ./wd
      config:
        env:
          - {name: DB_PASSWORD, value: hunter2}
          - {name: HF_TOKEN, value: hf_abc}
          - {name: AWS_SECRET_ACCESS_KEY, value: wJalr}
          - {name: PLAIN, value: visible}
      worker: {replicas: 1}
  runtime:
    kind: python
    spec: {entryPoint: train.py}
"""


@pytest.mark.parametrize("backend", ["oci", "docker", "local"])
def test_dry_run_outputs_parse_and_agree(backend, tmp_path):
    results = {}
    for fmt in ("json", "yaml"):
        done = run_cli("run", "-f", str(SEED_004), "--dry-run", "--backend", backend, "--output", fmt)
        assert done.returncode == 0, done.stderr
        results[fmt] = json.loads(done.stdout) if fmt == "json" else yaml.safe_load(done.stdout)
    for data in results.values():
        data.pop("run_id")
        for node in data["nodes"]:
            node["env"].pop("LAUNCHER_RUN_ID")
    assert results["json"]["nodes"] == results["yaml"]["nodes"]
    assert [n["name"] for n in results["json"]["nodes"]] == [
        "PyTorch-Distributed-main", "PyTorch-Distributed-worker-0", "PyTorch-Distributed-worker-1"]


def test_ads_documentation_example_dry_runs_unchanged():
    done = run_cli("run", "-f", str(SPECS / "ads_docs_pytorch.yaml"), "--dry-run", "--output", "json")
    assert done.returncode == 0, done.stderr
    assert [r["operation"] for r in json.loads(done.stdout)["requests"]] == ["create_job", "create_job_run"]


def test_oci_native_dry_run_has_one_job_whose_node_group_holds_the_cluster():
    done = run_cli("run", "-f", str(SEED_004), "--dry-run", "--output", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [r["operation"] for r in data["requests"]] == ["create_job", "create_job_run"]
    nodes = data["requests"][0]["body"]["jobNodeConfigurationDetails"]
    assert nodes["jobNetworkConfiguration"] == {"jobNetworkType": "CUSTOM_NETWORK",
                                                "subnetId": "oci.xxxx.<subnet-ocid>"}
    groups = nodes["jobNodeGroupConfigurationDetailsList"]
    # main and workers differ only in their names: one node group, as ADS makes it (NODE_RANK 0 is the main)
    assert [(g["name"], g["replicas"], g["minimumSuccessReplicas"]) for g in groups] == [("PyTorch-Distributed", 3, 3)]
    for group in groups:  # one env per group: each node works out its name from LAUNCHER_NODE_GROUP and NODE_RANK
        env = group["jobConfigurationDetails"]["environmentVariables"]
        assert "LAUNCHER_NODE_NAME" not in env and env["LAUNCHER_RUN_ID"] == data["run_id"]
        assert json.loads(env["LAUNCHER_NODE_GROUP"]) == ["PyTorch-Distributed-main", "PyTorch-Distributed-worker"]
        assert group["jobInfrastructureConfigurationDetails"]["jobInfrastructureType"] == "MULTI_NODE"
    assert "launch mode native" in " ".join(data["notes"])


def test_oci_dry_run_has_one_create_job_and_one_job_run_per_node():
    done = run_cli("run", "-f", str(SEED_004), "--dry-run", "--output", "json",
                   "--set", "spec.infrastructure.spec.launchMode=perNode")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["image_build"] is None  # seed 004 names its image: nothing to build
    ops = [r["operation"] for r in data["requests"]]
    assert ops == ["create_job", "create_job_run", "create_job_run", "create_job_run"]
    job = data["requests"][0]["body"]
    assert job["jobInfrastructureConfigurationDetails"] == {
        "jobInfrastructureType": "STANDALONE", "shapeName": "VM.GPU2.1", "blockStorageSizeInGBs": 50,
        "subnetId": "oci.xxxx.<subnet-ocid>"}
    assert job["jobEnvironmentConfigurationDetails"]["image"] == "<region.ocir.io/my-tenancy/image-name>"
    for request, node in zip(data["requests"][1:], data["nodes"]):
        env = request["body"]["jobConfigurationOverrideDetails"]["environmentVariables"]
        assert env == node["env"]
        assert env["LAUNCHER_NODE_NAME"] == node["name"]
        assert env["LAUNCHER_RUN_ID"] == data["run_id"]
        assert env["NCCL_ASYNC_ERROR_HANDLING"] == "1"  # the ADS spec unchanged; the node renames it for torch
        assert json.loads(env["LAUNCHER_ARGS"]) == ["--data-dir", "/home/datascience/data", "--output-dir",
                                                    "/home/datascience/outputs", "--timeout", "5"]


@pytest.mark.parametrize("fmt", ["text", "json", "yaml"])
def test_secrets_are_masked_in_every_format_but_sent_unmasked(tmp_path, fmt):
    spec_file = tmp_path / "train.yaml"
    spec_file.write_text(SPEC_WITH_SECRETS)
    done = run_cli("run", "-f", str(spec_file), "--dry-run", "--output", fmt)
    assert done.returncode == 0, done.stderr
    for secret in ("hunter2", "hf_abc", "wJalr"):
        assert secret not in done.stdout
    assert "visible" in done.stdout and "********" in done.stdout
    sent = backend_for(None, "local").dryrun(load_spec(spec_file)).to_dict()
    assert sent["nodes"][0]["env"]["DB_PASSWORD"] == "hunter2"


def test_dry_run_has_no_side_effects_and_imports_no_backend_sdk(tmp_path):
    """No files anywhere, no network, no heavy imports: checked inside the CLI's own process."""
    home, work = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), work.mkdir()
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "train.yaml").write_text(SEED_004.read_text().replace(
        'workDir: "oci://my-bucket@my-namespace/path/to/dir/"', "workDir: ./work_dir"))
    probe = textwrap.dedent(f"""
        import json, socket, sys
        def refuse(*args, **kwargs):
            raise AssertionError("network used during --dry-run")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        before = set(sys.modules)
        from launcher.cli import main
        codes = [main(["run", "-f", {str(spec_dir / 'train.yaml')!r}, "--dry-run", "--backend", b, "--output", "json"])
                 for b in ("oci", "docker", "local")]
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print("RESULT", json.dumps({{"codes": codes, "heavy": heavy, "imported": sorted(set(sys.modules) - before)}}),
              file=sys.stderr)
    """)
    env = {**os.environ, "HOME": str(home), "OCI_CONFIG_FILE": str(home / "missing"),
           "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    before = {p: sorted(p.rglob("*")) for p in (home, work, spec_dir)}
    import subprocess

    done = subprocess.run([sys.executable, "-c", probe], cwd=work, env=env, capture_output=True, text=True,
                          timeout=60)
    result = json.loads(done.stderr.split("RESULT ", 1)[1])
    assert (result["codes"], result["heavy"]) == ([0, 0, 0], []), done.stderr
    assert len(result["imported"]) <= MODULE_BUDGET, f"{len(result['imported'])} modules: {result['imported']}"
    assert {p: sorted(p.rglob("*")) for p in (home, work, spec_dir)} == before


def test_arguments_and_env_reach_the_plan_byte_for_byte(tmp_path):
    tricky = ["$(touch /tmp/pwned)", "`id`", "a b", "quote's \"double\"", "line1\nline2", "naïve ✓", "--x=$HOME"]
    spec_file = tmp_path / "train.yaml"
    spec_file.write_text(yaml.safe_dump({
        "kind": "distributed", "apiVersion": "v1.0",
        "spec": {"infrastructure": {"kind": "infrastructure", "type": "local"},
                 "cluster": {"kind": "pytorch", "spec": {"config": {"env": [{"name": "TRICKY", "value": tricky[0]}]}}},
                 "runtime": {"kind": "python", "spec": {"entryPoint": "train.py", "args": tricky}}}}))
    done = run_cli("run", "-f", str(spec_file), "--dry-run", "--output", "json")
    node = json.loads(done.stdout)["nodes"][0]
    assert json.loads(node["env"]["LAUNCHER_ARGS"]) == tricky
    assert node["env"]["TRICKY"] == tricky[0]


def test_dry_run_speed_path_does_not_need_credentials(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "OCI_CONFIG_FILE": str(tmp_path / "none")}
    done = run_cli("run", "-f", str(SEED_004), "--dry-run", env=env)
    assert done.returncode == 0 and "create_job" in done.stdout


def test_bad_spec_exits_2_and_missing_work_dir_for_oci_is_bad_input(tmp_path):
    spec_file = tmp_path / "train.yaml"
    spec_file.write_text(SEED_004.read_text().replace('      workDir: "oci://my-bucket@my-namespace/path/to/dir/"\n',
                                                      ""))
    done = run_cli("run", "-f", str(spec_file), "--dry-run")
    assert done.returncode == 2
    assert "spec.cluster.spec.workDir is required for the oci backend" in done.stderr


@pytest.mark.parametrize("backend", ["local", "slurm"])
def test_backends_that_run_the_code_directory_plan_no_image(tmp_path, backend):
    assert run_cli("init", "--framework", "pytorch", "--dir", str(tmp_path)).returncode == 0
    spec = str(tmp_path / "train.yaml")
    data = json.loads(run_cli("run", "-f", spec, "--dry-run", "--backend", backend, "--output", "json").stdout)
    assert data["image_build"] is None and {node["image"] for node in data["nodes"]} == {None}
    shown = run_cli("run", "-f", spec, "--dry-run", "--backend", backend).stdout
    assert "docker build" not in shown and "image" not in shown.split("--- node", 1)[1], shown


def test_image_build_is_planned_for_the_built_image(tmp_path):
    assert run_cli("init", "--framework", "pytorch", "--dir", str(tmp_path)).returncode == 0
    done = run_cli("run", "-f", str(tmp_path / "train.yaml"), "--dry-run", "--backend", "docker", "--output", "json")
    data = json.loads(done.stdout)
    build = data["image_build"]
    assert build["dockerfile"] == "artifacts/pytorch/v1/Dockerfile" and build["context"] == str(tmp_path)
    assert {node["image"] for node in data["nodes"]} == {build["tag"]}
    network, *containers = data["requests"]
    run_id = data["run_id"]
    # every engine call, exactly as sent: the run's network first, then one container per node
    assert (network["operation"], network["body"]) == (
        "networks.create", {"name": f"launcher-{run_id}", "driver": "bridge", "labels": {"launcher.run-id": run_id}})
    assert [r["operation"] for r in containers] == ["containers.create"] * len(data["nodes"])
    assert all(r["body"]["image"] == build["tag"] and r["body"]["network"] == network["body"]["name"]
               and "detach" not in r["body"] for r in containers)
