"""The OCI backend through the real `oci` SDK and ocifs, against tests/ocisim.py (the services at the wire).

OCI cannot be reached from here. The simulation checks signatures and request shapes as the
service would and really runs the nodes, so these runs train the example to completion on an
`oci://` work dir it serves.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from clirun import Watcher, info_of, init_project, run_id_from, wait_until
from conftest import SEED_004, run_cli

pytestmark = pytest.mark.slow
IMAGE = "iad.ocir.io/simns/train:1"


@pytest.fixture
def sim(tmp_path):
    from ocisim import OciSim

    (tmp_path / "sim").mkdir()
    server = OciSim(tmp_path / "sim")
    yield server
    server.stop()


@pytest.fixture
def project(tmp_path, sim):
    """The seed 004 spec (1 main + 2 workers) beside the example script, its image known to the simulation."""
    directory = init_project(tmp_path / "proj", workers=2, epochs=2).parent
    spec = directory / "seed004.yaml"
    spec.write_text(SEED_004.read_text()
                    .replace("<region.ocir.io/my-tenancy/image-name>", IMAGE)
                    .replace("oci://my-bucket@my-namespace/path/to/dir/", "oci://runs@simns/launcher"))
    sim.images[IMAGE] = directory
    (tmp_path / "oci").mkdir()
    env = {**os.environ, "LAUNCHER_HOME": str(tmp_path / "home"), "LAUNCHER_OCI_ENDPOINT": sim.endpoint,
           "OCI_CLI_CONFIG_FILE": str(sim.write_config(tmp_path / "oci"))}
    return spec, env


EPOCHS = ["--", "--epochs", "2"]


def test_seed_004_trains_to_completion_on_an_oci_work_dir(project, sim):
    spec, env = project
    dry = json.loads(run_cli("run", "-f", str(spec), "--dry-run", "--output", "json", "--run-id", "seed-1", *EPOCHS,
                             env=env).stdout)
    done = run_cli("run", "-f", str(spec), "--run-id", "seed-1", *EPOCHS, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run seed-1 succeeded" in done.stdout
    # What reached the service is what the dry-run printed, field for field (the job id filled in).
    sent = [(path, body) for method, path, body in sim.requests if method == "POST" and "/2019" in path]
    assert sent[0] == ("/20190101/jobs", dry["requests"][0]["body"])
    [job_id] = sim.jobs
    assert sent[1] == ("/20190101/jobRuns", {**dry["requests"][1]["body"], "jobId": job_id})
    info = info_of(Path(env["LAUNCHER_HOME"]), "seed-1")
    job_run = info["backend_ids"]["job_runs"]["seed-1"]
    assert info["backend_ids"]["job"] == job_id and job_run.startswith("ocid1.datasciencejobrun.")
    watched = run_cli("watch", job_run, "--no-follow", env=env)  # a job run OCID names the run too
    for node in ("PyTorch-Distributed-main", "PyTorch-Distributed-worker-0", "PyTorch-Distributed-worker-1"):
        assert re.search(rf"\[{node}\s+r\d\] rank \d: epoch 2/2", watched.stdout), watched.stdout
    status = json.loads(run_cli("status", "seed-1", "--json", env=env).stdout)
    assert status["result"] == "succeeded"
    config = run_cli("show-config", "seed-1", env=env)
    assert "MASTER_ADDR" in config.stdout and "127.0.0.1" in config.stdout
    listed = run_cli("list", env=env).stdout
    assert re.search(r"seed-1\s.*oci", listed), listed
    assert any(name.startswith("launcher/seed-1/outputs/PyTorch-Distributed-main/")
                                     for (_, _, name) in sim.objects)
    assert sim.runs[job_run].state == "SUCCEEDED"


def test_per_node_job_runs_train_too(project, sim):
    spec, env = project
    done = run_cli("run", "-f", str(spec), "--set", "spec.infrastructure.spec.launchMode=perNode",
                   "--set", "spec.infrastructure.spec.deleteJob=true", *EPOCHS, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(sim.runs) == 3 and {run.state for run in sim.runs.values()} == {"SUCCEEDED"}
    assert [job["lifecycleState"] for job in sim.jobs.values()] == ["DELETED"]  # deleteJob, once it ended
    info = info_of(Path(env["LAUNCHER_HOME"]), run_id_from(done.stdout))
    assert info["backend_ids"]["job_deleted"] is True  # recorded: a later watch does not delete again
    assert all(run.body["jobConfigurationOverrideDetails"]["environmentVariables"]["LAUNCHER_NODE_NAME"]
               for run in sim.runs.values())


def test_a_refused_job_run_is_cleaned_up_and_reported(project, sim):
    spec, env = project
    sim.fail("POST", r"/jobRuns$", 400, "LimitExceeded", "Quota exceeded for shape VM.GPU2.1 in this compartment")
    done = run_cli("run", "-f", str(spec), "--run-id", "quota-1", *EPOCHS, env=env, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "400 LimitExceeded: Quota exceeded for shape VM.GPU2.1" in done.stderr
    assert "what was created was cancelled and deleted" in done.stderr
    assert [job["lifecycleState"] for job in sim.jobs.values()] == ["DELETED"] and not sim.runs
    assert info_of(Path(env["LAUNCHER_HOME"]), "quota-1")["submission"] == "failed"


def test_per_node_partial_failure_cancels_the_runs_already_started(project, sim):
    spec, env = project
    original = sim._create_run
    calls = []

    def second_refused(body):
        calls.append(body)
        if len(calls) == 2:
            from ocisim import Refused
            raise Refused(400, "InvalidParameter", "subnet ocid1.subnet.oc1..x not found")
        return original(body)

    sim._create_run = second_refused
    done = run_cli("run", "-f", str(spec), "--set", "spec.infrastructure.spec.launchMode=perNode", *EPOCHS,
                   env=env, timeout=120)
    assert done.returncode == 3 and "subnet ocid1.subnet.oc1..x not found" in done.stderr, done.stderr
    [run] = sim.runs.values()
    assert wait_until(lambda: run.state == "CANCELED", 30), run.state
    assert all(node.process.poll() is not None for node in run.nodes)


def test_429_and_500_are_retried_with_one_retry_token(project, sim):
    """Retries never create twice: a create whose answer was lost is retried with the same token."""
    spec, env = project
    sim.fail("POST", r"/jobs$", 429, "TooManyRequests", "slow down", times=2)
    sim.lose_answer("POST", r"/jobs$")
    sim.fail("POST", r"/jobRuns$", 500, "InternalServerError", "try again")
    sim.lose_answer("POST", r"/jobRuns$")
    done = run_cli("run", "-f", str(spec), *EPOCHS, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(sim.jobs) == 1 and len(sim.runs) == 1
    creates = [path for method, path, _ in sim.requests if method == "POST" and "/2019" in path]
    assert creates == ["/20190101/jobs"] * 2 + ["/20190101/jobRuns"] * 2  # those that got past the 429/500
    assert len(sim.created_by_token) == 2


def test_a_client_error_is_not_retried(project, sim):
    spec, env = project
    sim.fail("POST", r"/jobs$", 400, "InvalidParameter", "shape VM.GPU2.1 is not available", times=5)
    done = run_cli("run", "-f", str(spec), *EPOCHS, env=env, timeout=120)
    assert done.returncode == 3 and "400 InvalidParameter: shape VM.GPU2.1 is not available" in done.stderr
    assert len([f for f in sim.faults if f[1] == r"/jobs$"]) == 1 and sim.faults[0][5] == 4, "retried a 400"


def test_a_dying_node_fails_the_run_and_is_named(project, sim):
    spec, env = project
    sim.dying["PyTorch-Distributed-worker-1"] = "dies"
    done = run_cli("run", "-f", str(spec), "--run-id", "dies-1", "--set", "spec.infrastructure.spec.launchMode=perNode",
                   "--", "--epochs", "200", env=env, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    status = json.loads(run_cli("status", "dies-1", "--json", env=env).stdout)
    assert status["result"] == "failed"
    assert status["first_failure"]["node"] == "PyTorch-Distributed-worker-1"
    assert "OCI: job run failed" in status["first_failure"]["reason"]
    # its last lines come from OCI Logging: it could not write them to the work dir
    assert any("rank 2" in line for line in status["first_failure"]["last_output"]), status["first_failure"]
    assert "its last lines, as the backend logged them:\n  | " in done.stdout


def test_a_node_that_never_starts_shows_the_services_message(project, sim):
    spec, env = project
    sim.images.clear()  # the image cannot be pulled
    done = run_cli("run", "-f", str(spec), "--run-id", "pull-1", *EPOCHS, env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    status = run_cli("status", "pull-1", env=env)
    assert f"image {IMAGE} could not be pulled" in status.stdout + status.stderr


def test_cancel_cancels_the_job_run(project, sim):
    spec, env = project
    started = run_cli("run", "-f", str(spec), "--detach", "--", "--epochs", "500", env=env, timeout=120)
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    Watcher(run_id, env).wait_for(r"rank \d: epoch 1/500", timeout=180)
    done = run_cli("cancel", run_id, "--grace", "20", env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    [run] = sim.runs.values()
    assert wait_until(lambda: run.state in ("CANCELED", "SUCCEEDED", "FAILED"), 30) and \
        all(node.process.poll() is not None for node in run.nodes)
    assert json.loads(run_cli("status", run_id, "--json", env=env).stdout)["result"] == "cancelled"


def test_unsigned_and_malformed_requests_are_refused_like_the_service(sim, tmp_path):
    """The simulation's own checks, so that a passing run means the SDK's requests would be accepted."""
    import urllib.request

    request = urllib.request.Request(f"{sim.endpoint}/20190101/jobs", data=b"{}", method="POST",
                                     headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 401
    import oci

    config = oci.config.from_file(str(sim.write_config(tmp_path)))
    client = oci.data_science.DataScienceClient(config, service_endpoint=sim.endpoint,
                                                retry_strategy=oci.retry.NoneRetryStrategy())
    for body, message in [
        ({"compartmentId": "c"}, "projectId: required"),
        ({"projectId": "p", "compartmentId": "c", "surprise": 1}, "surprise: unknown field"),
        ({"projectId": "p", "compartmentId": "c", "jobConfigurationDetails": {"jobType": "WEIRD"}}, "unknown value"),
        ({"projectId": "p", "compartmentId": "c", "jobConfigurationDetails": {
            "jobType": "DEFAULT", "environmentVariables": {"X": "y" * 20_001}}}, "over 20000"),
    ]:
        with pytest.raises(oci.exceptions.ServiceError) as caught:
            client.base_client.call_api(resource_path="/jobs", method="POST", body=body, response_type="Job",
                                        header_params={"content-type": "application/json",
                                                       "accept": "application/json"})
        assert caught.value.status == 400 and message in caught.value.message


def test_spec_checks_the_service_would_make_minutes_later(tmp_path):
    text = SEED_004.read_text()
    flex = tmp_path / "flex.yaml"
    flex.write_text(text.replace("shapeName: VM.GPU2.1", "shapeName: VM.Standard.E4.Flex"))
    done = run_cli("validate", "-f", str(flex))
    assert done.returncode == 2 and "VM.Standard.E4.Flex is a flexible shape: set shapeConfigDetails" in done.stderr
    no_subnet = tmp_path / "nosubnet.yaml"
    no_subnet.write_text(text.replace("      subnetId: oci.xxxx.<subnet-ocid>\n", "      launchMode: perNode\n"))
    done = run_cli("validate", "-f", str(no_subnet))
    assert done.returncode == 2 and "set subnetId" in done.stderr
    done = run_cli("run", "-f", str(SEED_004), "--dry-run")
    assert "is not a registry path" in done.stdout  # the seed's placeholder image
    big = run_cli("run", "-f", str(SEED_004), "--dry-run", "--env", "BIG=" + "x" * 21_000)
    assert "its environment has" in big.stdout and "allows 20000" in big.stdout
    data = yaml.safe_load(run_cli("run", "-f", str(SEED_004), "--dry-run", "--output", "yaml").stdout)
    assert data["requests"][0]["body"]["jobNodeConfigurationDetails"]["jobNodeType"] == "MULTI_NODE"


def test_auth_follows_the_oci_cli_conventions(sim, tmp_path, monkeypatch):
    """API key profile, session-token profile and the OCI_CLI_AUTH choice; each signs requests the server accepts."""
    import oci

    from launcher.errors import BackendError
    from launcher.ociauth import auth_method, sdk_auth

    assert auth_method({}) == "api_key"
    assert auth_method({"OCI_RESOURCE_PRINCIPAL_VERSION": "2.2"}) == "resource_principal"
    assert auth_method({"OCI_CLI_AUTH": "instance_principal", "OCI_RESOURCE_PRINCIPAL_VERSION": "2.2"}) == \
        "instance_principal"
    with pytest.raises(BackendError, match="OCI_CLI_AUTH='password'"):
        auth_method({"OCI_CLI_AUTH": "password"})
    api_key = {"OCI_CLI_CONFIG_FILE": str(sim.write_config(tmp_path))}
    session = {"OCI_CLI_CONFIG_FILE": str(sim.write_session_config(tmp_path)), "OCI_CLI_PROFILE": "SESSION"}
    for env, signer_type in ((api_key, type(None)), (session, oci.auth.signers.SecurityTokenSigner)):
        config, signer = sdk_auth(env)
        assert isinstance(signer, signer_type)
        client = oci.data_science.DataScienceClient(config, service_endpoint=sim.endpoint,
                                                    retry_strategy=oci.retry.NoneRetryStrategy(),
                                                    **({"signer": signer} if signer else {}))
        with pytest.raises(oci.exceptions.ServiceError) as caught:
            client.get_job("ocid1.datasciencejob.oc1.iad.none")
        assert caught.value.status == 404  # signed well enough to be answered: an unsigned call gets 401
    with pytest.raises(BackendError, match="OCI credentials"):
        sdk_auth({"OCI_CLI_CONFIG_FILE": str(tmp_path / "missing")})


def test_an_s3_work_dir_keeps_working_with_this_backend(project, sim, moto):
    """OCI Object Storage's S3-compatible endpoint, or any S3: here moto_server on loopback."""
    spec, env = project
    moto.make_bucket("oci-s3-run")
    s3_spec = spec.parent / "s3.yaml"
    s3_spec.write_text(spec.read_text().replace("oci://runs@simns/launcher", "s3://oci-s3-run/runs"))
    node_env = [f"--env={name}={value}" for name, value in moto.env().items()]
    done = run_cli("run", "-f", str(s3_spec), *node_env, *EPOCHS, env={**env, **moto.env()}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "work dir s3://oci-s3-run/runs/" in done.stdout
    assert not any(name.startswith("launcher/") for (_, _, name) in sim.objects)
