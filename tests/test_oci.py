"""The OCI backend through the real `oci` SDK and ocifs, against tests/ocisim.py (the services at the wire).

OCI cannot be reached from here. The simulation checks signatures and request shapes as the
service would, gives the nodes only the env that independent sources document (NODE_RANK and the
cluster metadata file, no group name, no interface variables) and really runs them, so these runs
train the example to completion on an `oci://` work dir it serves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from clirun import Watcher, info_of, init_project, run_id_from, wait_until
from conftest import SEED_004, require, run_cli

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
    # Main and workers differ only in name: one node group, as ADS makes it; NODE_RANK 0 is the main.
    groups = sent[0][1]["jobNodeConfigurationDetails"]["jobNodeGroupConfigurationDetailsList"]
    assert [(group["name"], group["replicas"]) for group in groups] == [("PyTorch-Distributed", 3)]
    [run] = sim.runs.values()
    names = {node.rank: node.env.get("LAUNCHER_NODE_NAME") for node in run.nodes}
    assert names == {0: None, 1: None, 2: None} and not any("NODE_GROUP_NAME" in node.env for node in run.nodes)
    assert status["nodes"]["PyTorch-Distributed-main"]["rank"] == 0
    # Each node took its address from the metadata file and named the interface holding it.
    assert {(record["address"], record["interface"]) for record in status["nodes"].values()} == {("127.0.0.1", "lo")}
    assert "127.0.0.1 (lo)" in run_cli("status", "seed-1", env=env).stdout
    config = run_cli("show-config", "seed-1", env=env)
    assert re.search(r"MASTER_ADDR:\s+127.0.0.1", config.stdout) and re.search(r"MASTER_PORT:\s+29400", config.stdout)
    listed = run_cli("list", env=env).stdout
    assert re.search(r"seed-1\s.*oci", listed), listed
    assert any(name.startswith("launcher/seed-1/outputs/PyTorch-Distributed-main/")
                                     for (_, _, name) in sim.objects)
    assert sim.runs[job_run].state == "SUCCEEDED"


def test_a_refused_job_run_is_cleaned_up_and_reported(project, sim):
    spec, env = project
    sim.fail("POST", r"/jobRuns$", 400, "LimitExceeded", "Quota exceeded for shape VM.GPU2.1 in this compartment")
    done = run_cli("run", "-f", str(spec), "--run-id", "quota-1", *EPOCHS, env=env, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "400 LimitExceeded: Quota exceeded for shape VM.GPU2.1" in done.stderr
    assert "what was created was cancelled and deleted" in done.stderr
    assert [job["lifecycleState"] for job in sim.jobs.values()] == ["DELETED"] and not sim.runs
    assert info_of(Path(env["LAUNCHER_HOME"]), "quota-1")["submission"] == "failed"


def refuse_second_run(sim, message: str) -> None:
    """The second create_job_run is refused once the first run is IN_PROGRESS (so its cleanup has to cancel it)."""
    original = sim._create_run
    calls = []

    def second_refused(body):
        calls.append(body)
        if len(calls) == 2:
            from ocisim import Refused
            assert wait_until(lambda: [run.state for run in sim.runs.values()] == ["IN_PROGRESS"], 30)
            raise Refused(400, "InvalidParameter", message)
        return original(body)

    sim._create_run = second_refused


def test_per_node_partial_failure_cancels_the_runs_already_started(project, sim):
    """The service deletes no job while its runs are in progress: cleanup cancels, waits for CANCELED, deletes."""
    spec, env = project
    refuse_second_run(sim, "subnet ocid1.subnet.oc1..x not found")
    done = run_cli("run", "-f", str(spec), "--set", "spec.infrastructure.spec.launchMode=perNode", *EPOCHS,
                   env=env, timeout=120)
    assert done.returncode == 3 and "subnet ocid1.subnet.oc1..x not found" in done.stderr, done.stderr
    assert "what was created was cancelled and deleted" in done.stderr
    [run] = sim.runs.values()
    assert run.state == "DELETED" and all(node.process.poll() is not None for node in run.nodes)
    seen = [state for run_id, state in sim.served_states if run_id == run.id]
    assert seen[0] == "IN_PROGRESS" and "CANCELING" in seen and seen[-1] == "CANCELED", seen
    assert seen.index("CANCELING") < len(seen) - 1
    deletes = [path for method, path, _ in sim.requests if method == "DELETE" and "/jobs/" in path]
    assert len(deletes) == 1 and not [r for r in sim.refusals if r[0] == "DELETE"], sim.refusals


def test_cleanup_that_cannot_finish_says_what_is_left(project, sim):
    spec, env = project
    sim.cancel_seconds = 120  # the cancelled run stays CANCELING past the cleanup's wait
    refuse_second_run(sim, "quota exceeded")
    done = run_cli("run", "-f", str(spec), "--set", "spec.infrastructure.spec.launchMode=perNode", *EPOCHS,
                   env={**env, "LAUNCHER_OCI_CANCEL_WAIT": "2"}, timeout=120)
    assert done.returncode == 3, done.stderr
    [job_id], [run_id] = sim.jobs, sim.runs
    assert f"job run(s) {run_id} (CANCELING) had not ended 2s after being cancelled" in done.stderr, done.stderr
    assert f"left: job {job_id}, job run(s) {run_id}" in done.stderr
    assert sim.jobs[job_id]["lifecycleState"] == "ACTIVE" and not [r for r in sim.refusals if r[0] == "DELETE"]


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


def with_late_logging(spec: Path, sim) -> None:
    """Logging set up with logGroupId alone (the service creates the log), its lines arriving late and a few per
    page."""
    spec.write_text(spec.read_text().replace("      logId: oci.xxx.<log_ocid>\n", ""))
    sim.log_delay, sim.search_page = 2.0, 3


def assert_logging_searched(sim) -> None:
    logs = {run.log["logId"] for run in sim.runs.values()}
    assert all(log.startswith("ocid1.log.oc1.iad.simauto") for log in logs)  # made by the service: logDetails
    searches = [body["searchQuery"] for method, path, body in sim.requests if path == "/20190909/search"]
    assert searches and all(any(log in query for log in logs) for query in searches)
    assert len(searches) > 2  # pages of 3 lines, and again while the lines were still arriving


def test_a_dying_node_fails_the_run_and_is_named(project, sim):
    """Per-node: its own job run fails first, with its exit code in lifecycleDetails, and its last lines come
    from Logging. (Native runs: tests/test_recovery_oci.py, where the dead replica's run is retried.)"""
    spec, env = project
    with_late_logging(spec, sim)
    sim.dying["PyTorch-Distributed-worker-1"] = "dies"
    done = run_cli("run", "-f", str(spec), "--run-id", "dies-1", "--set", "spec.infrastructure.spec.launchMode=perNode",
                   "--", "--epochs", "200", env=env, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    output = done.stdout
    status = json.loads(run_cli("status", "dies-1", "--json", env=env).stdout)
    assert status["result"] == "failed"
    assert_logging_searched(sim)
    root = status["first_failure"]
    assert root["node"] == "PyTorch-Distributed-worker-1" and root["exit_code"] == 137, root
    assert "OCI: job run failed: Job run artifact execution failed with exit code 137" in root["reason"]
    assert "exited with status 137" in output
    # its last lines come from OCI Logging: it could not write them to the work dir
    assert any("rank 2" in line for line in root["last_output"]), root
    assert "its last lines, as the backend logged them:\n  | " in output


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
    assert "is not in OCI Container Registry" in done.stdout  # the seed's placeholder image
    for image, problem in (("docker.io/library/python:3.11", "is not in OCI Container Registry"),
                           ("iad.ocir.io/ns/train", "names no tag or digest")):
        done = run_cli("run", "-f", str(SEED_004), "--dry-run", "--set", f"spec.cluster.spec.image={image}")
        assert problem in done.stdout, done.stdout
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


def test_two_node_groups_with_late_metadata_claim_their_names_and_meet(project, sim):
    """Main and workers differ in env: a node group each. NODE_RANK counts per group here (how it counts across
    groups is documented nowhere). The metadata file is missing when the nodes start, then lists one node:
    they wait (re-reading every 2 s here, 20 s by default: the same wait, shorter), claim distinct names in
    the work dir, meet and train. The file is written as the nodes report what they saw, not on a timer."""
    spec, env = project
    spec.write_text(spec.read_text().replace("        replicas: 1\n", "        replicas: 1\n        config:\n"
                                             "          env:\n            - {name: ROLE, value: main}\n"))
    sim.metadata_held = True
    sim.node_env = {"LAUNCHER_OCI_METADATA_POLL": "2"}

    def said(text: str) -> bool:
        return any(text in line for run in list(sim.runs.values()) for node in run.nodes for _, line in node.output)

    def publish_late() -> None:
        if wait_until(lambda: said("is missing or not valid JSON"), 120):
            [run] = sim.runs.values()
            sim.write_metadata(run, 1)
            if wait_until(lambda: said("lists 1 of 3 nodes"), 60):
                sim.write_metadata(run)

    threading.Thread(target=publish_late, daemon=True).start()
    done = run_cli("run", "-f", str(spec), "--run-id", "groups-1", *EPOCHS, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    job = next(body for method, path, body in sim.requests if path == "/20190101/jobs" and method == "POST")
    groups = job["jobNodeConfigurationDetails"]["jobNodeGroupConfigurationDetailsList"]
    assert [(group["name"], group["jobConfigurationDetails"]["environmentVariables"]["LAUNCHER_NODE_GROUP"])
            for group in groups] == [("PyTorch-Distributed-main", '["PyTorch-Distributed-main"]'),
                                     ("PyTorch-Distributed-worker", '["PyTorch-Distributed-worker"]')]
    [run] = sim.runs.values()
    assert sorted(node.env["NODE_RANK"] for node in run.nodes) == ["0", "0", "1"]
    claims = sorted(name.rsplit("/", 1)[1] for (_, _, name) in sim.objects if "/groups-1/slots/" in name)
    assert claims == ["PyTorch-Distributed-worker-0.json", "PyTorch-Distributed-worker-1.json"]
    status = json.loads(run_cli("status", "groups-1", "--json", env=env).stdout)
    assert status["result"] == "succeeded" and len(status["nodes"]) == 3


# The cluster network of a node, made real: a network namespace whose default route leaves through
# wrong0 (127.1.0.1) while the nodes' cluster addresses are on clu0 (127.2.0.1). Loopback addresses
# only, and no link out of the namespace: nothing can leave it.
IN_NETNS = "LAUNCHER_TEST_IN_NETNS"
NETNS_SETUP = ("echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet && ip link set lo up"
               " && ip link add wrong0 type bridge && ip link set wrong0 up && ip addr add 127.1.0.1/32 dev wrong0"
               " && ip link add clu0 type bridge && ip link set clu0 up && ip addr add 127.2.0.1/32 dev clu0"
               " && ip route add default dev wrong0 src 127.1.0.1")
PROBE = """import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
print(f"rank {dist.get_rank()}: sum {int(total.item())} over {os.environ['GLOO_SOCKET_IFNAME']} "
      f"{os.environ['NCCL_SOCKET_IFNAME']} {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
dist.destroy_process_group()
"""


def rerun_in_a_network_namespace(nodeid: str) -> None:
    require(os.geteuid() == 0 and bool(shutil.which("unshare")) and bool(shutil.which("ip")),
            "a network namespace needs root, unshare and ip")
    probe = subprocess.run(["unshare", "-n", "sh", "-c", NETNS_SETUP], capture_output=True, text=True)
    require(probe.returncode == 0, f"cannot make a network namespace with two bridges: {probe.stderr.strip()}")
    done = subprocess.run(["unshare", "-n", "sh", "-c", f'{NETNS_SETUP} && exec "$@"', "netns", sys.executable,
                           "-m", "pytest", "-q", "-p", "no:cacheprovider", nodeid],
                          env={**os.environ, IN_NETNS: "1"}, capture_output=True, text=True, timeout=500,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


@pytest.mark.parametrize("mode, source", [("native", "CLUSTER_NODES_METADATA_FILE"), ("perNode", "subnet")])
def test_nodes_use_the_cluster_interface_not_the_default_route(project, sim, request, mode, source):
    """Native runs take the address from the metadata file, per-node runs from the subnet's CIDR; either way
    NCCL and gloo are pointed at that interface, and the main listens on 29400 as ADS's do."""
    if os.environ.get(IN_NETNS) != "1":
        rerun_in_a_network_namespace(request.node.nodeid)
        return
    from launcher.node.address import route_address

    assert route_address() == "127.1.0.1"  # the default route's card, which is the wrong one
    spec, env = project
    (spec.parent / "probe.py").write_text(PROBE)
    spec.write_text(spec.read_text().replace('entryPoint: "train.py"', 'entryPoint: "probe.py"'))
    sim.node_address, sim.subnet_cidr = "127.2.0.1", "127.2.0.0/16"
    done = run_cli("run", "-f", str(spec), "--run-id", "net-1", "--set", f"spec.infrastructure.spec.launchMode={mode}",
                   env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(run_cli("status", "net-1", "--json", env=env).stdout)
    assert {(node["address"], node["interface"]) for node in status["nodes"].values()} == {("127.2.0.1", "clu0")}
    for rank in range(3):
        assert f"rank {rank}: sum 3 over clu0 clu0 127.2.0.1:29400" in done.stdout, done.stdout
    output = "\n".join(line for run in sim.runs.values() for node in run.nodes for _, line in node.output)
    assert f"address 127.2.0.1 on clu0 (from {source}" in output
