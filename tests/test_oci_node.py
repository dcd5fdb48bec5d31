"""The OCI pieces that need no training run: how a node names itself and finds its address, image references,
exit codes, the default port, Logging searches and create-if-absent on an ``oci://`` work dir (through the real
SDK and ocifs against tests/ocisim.py)."""

from __future__ import annotations

import datetime
import json
import threading
import time
import urllib.parse

import pytest

from conftest import SEED_004, run_cli
from launcher.backends.oci import logs
from launcher.backends.oci.bodies import image_problem, ocir_reference
from launcher.backends.oci.service import exit_code
from launcher.node.identity import IdentityError, candidates, claim, first_choice
from launcher.node.address import use_interface
from launcher.node.netutil import NodeAddress, holder, in_network
from launcher.node.engines.ocicluster import ClusterAddressError, choose, metadata_address
from launcher.protocol.store import WorkDir

NAMES = ["m", "w-0", "w-1"]


def test_a_node_group_s_candidates_are_the_nodes_of_the_spec_groups_it_holds():
    groups = [("m", 1), ("w", 2)]
    assert candidates(groups, ["m", "w"]) == NAMES
    assert candidates(groups, ["w"]) == ["w-0", "w-1"]
    assert candidates([("m", 2), ("w", 1)], ["m"]) == ["m-0", "m-1"]
    with pytest.raises(IdentityError, match="names x"):
        candidates(groups, ["x"])
    assert first_choice(NAMES, {"NODE_RANK": "2"}) == "w-1"
    assert first_choice(NAMES, {"NODE_RANK": "3"}) is None and first_choice(NAMES, {}) is None


def test_a_claim_takes_the_rank_s_name_when_free_and_never_a_taken_one(tmp_path):
    store = WorkDir(str(tmp_path / "run"))
    assert claim(store, NAMES, "w-1", {}) == ("w-1", 0)
    assert claim(store, NAMES, "w-1", {}).name in ("m", "w-0")  # two nodes with one rank: the second gets a free name
    assert claim(store, NAMES, None, {}).name not in ("w-1",)
    assert sorted(store.list("slots")) == [f"{name}.json" for name in NAMES]
    with pytest.raises(IdentityError, match="more nodes started than the group has"):
        claim(store, NAMES, None, {})


def test_nodes_claiming_at_once_get_distinct_names(tmp_path):
    names = [f"w-{i}" for i in range(12)]
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(claim(WorkDir(str(tmp_path / "run")), names, None, {}).name))
               for _ in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == sorted(names)


def replica(rank: int, job_run: str = "ocid1.datasciencejobrun.oc1..a") -> dict[str, str]:
    return {"NODE_RANK": str(rank), "JOB_RUN_OCID": job_run}


def test_a_restarted_replica_gets_its_own_name_back_as_its_next_incarnation(tmp_path):
    """Every name claimed: the replica with the job run and NODE_RANK of a claim is that claim's holder, restarted."""
    store = WorkDir(str(tmp_path / "run"))
    assert [claim(store, NAMES, name, replica(rank)) for rank, name in enumerate(NAMES)] == \
        [(name, 0) for name in NAMES]
    assert claim(store, NAMES, "w-0", replica(1)) == ("w-0", 1)
    assert claim(store, NAMES, "w-0", replica(1)) == ("w-0", 2)  # and again after a second restart
    with pytest.raises(IdentityError, match="none of them has ended"):  # another job run's replica 1 is no restart
        claim(store, NAMES, "w-0", replica(1, "ocid1.datasciencejobrun.oc1..b"))


def test_a_slot_freed_by_a_node_that_ended_is_taken_once(tmp_path):
    """A new attempt's replica (another job run) takes the name of a node that was lost after it claimed it; of two
    such replicas at once only one gets it; a node's end from before the claim does not free it."""
    store = WorkDir(str(tmp_path / "run"))
    for rank, name in enumerate(NAMES):
        claim(store, NAMES, name, replica(rank))
    store.put("status/w-1.json", json.dumps({"state": "lost", "ended_at": time.time()}).encode())
    store.put("status/m.json", json.dumps({"state": "succeeded", "ended_at": time.time()}).encode())
    got: list = []
    errors: list = []

    def take(rank: int) -> None:
        try:
            got.append(claim(WorkDir(str(tmp_path / "run")), NAMES, None,
                             replica(rank, "ocid1.datasciencejobrun.oc1..b")))
        except IdentityError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=take, args=(rank,)) for rank in (5, 6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == [("w-1", 1)] and len(errors) == 1, (got, errors)
    with pytest.raises(IdentityError):  # w-1's lost status predates the claim of incarnation 1: still held
        claim(store, NAMES, None, replica(7, "ocid1.datasciencejobrun.oc1..c"))


ROUTE_CARD = {"lo": "127.0.0.1", "eth0": "10.0.0.5", "rdma0": "192.168.7.2"}  # the default route leaves by eth0


def test_the_address_is_the_rank_s_entry_held_by_an_interface_here():
    entries = {0: "192.168.7.1", 1: "192.168.7.2", 2: "192.168.7.3"}
    assert choose(entries, 1, 3, ROUTE_CARD) == "192.168.7.2" and holder("192.168.7.2", ROUTE_CARD) == "rdma0"
    assert choose({1: "192.168.7.2"}, 1, 3, ROUTE_CARD) == "192.168.7.2"  # its own entry is enough


def test_ranks_counted_some_other_way_fall_back_to_the_entry_held_here():
    """Per-group numbering: NODE_RANK 0 names another node's address; once every node is listed, the
    address an interface of this node holds is its own."""
    assert choose({0: "192.168.7.1"}, 0, 3, ROUTE_CARD) is None  # not complete: wait
    assert choose({0: "192.168.7.1", 1: "192.168.7.2", 2: "192.168.7.3"}, 0, 3, ROUTE_CARD) == "192.168.7.2"
    assert choose({0: "192.168.7.1", 1: "192.168.7.9"}, 1, 2, ROUTE_CARD) == "192.168.7.9"  # as ADS would
    with pytest.raises(ClusterAddressError, match="none of the 2 addresses"):
        choose({0: "192.168.7.1", 1: "192.168.7.9"}, None, 2, ROUTE_CARD)


def test_a_metadata_file_that_appears_late_is_waited_for(tmp_path):
    path = tmp_path / "nodes.json"
    env = {"CLUSTER_NODES_METADATA_FILE": str(path), "NODE_RANK": "1", "INITIAL_CLUSTER_SIZE": "2"}
    said: list[str] = []
    writes = iter([json.dumps([{"Rank": 0, "IPAddress": "192.168.7.1"}]),
                   json.dumps([{"Rank": 0, "IPAddress": "192.168.7.1"}, {"Rank": 1, "IPAddress": "192.168.7.2"}])])
    chosen = metadata_address(env, lambda: ROUTE_CARD, timeout=60, say=said.append,
                              sleep=lambda seconds: path.write_text(next(writes)))
    assert chosen == NodeAddress("192.168.7.2", "rdma0", "CLUSTER_NODES_METADATA_FILE, NODE_RANK 1")
    assert "is missing or not valid JSON; reading it again in 20s" in said[0] and "lists 1 of 2 nodes" in said[1]
    with pytest.raises(ClusterAddressError, match="lists 1 of 2 nodes after 0s"):
        path.write_text(json.dumps([{"Rank": 0, "IPAddress": "192.168.7.1"}]))
        metadata_address(env, lambda: ROUTE_CARD, timeout=0, say=said.append)


def test_the_interface_in_the_subnet_and_the_socket_variables():
    assert in_network("192.168.7.0/24", ROUTE_CARD) == ("rdma0", "192.168.7.2")
    assert in_network("172.16.0.0/12", ROUTE_CARD) is None
    env = {"NCCL_SOCKET_IFNAME": "ib0"}  # the user's choice stands
    assert use_interface("rdma0", env) == "; GLOO_SOCKET_IFNAME set to rdma0"
    assert env == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "rdma0"}


@pytest.mark.parametrize("image, problem", [
    ("iad.ocir.io/ns/train:1", None),
    ("us-ashburn-1.ocir.io/ns/team/train:v1.2@sha256:" + "a" * 64, None),
    ("iad.ocir.io/ns/train@sha256:" + "b" * 64, None),
    ("iad.ocir.io/ns/train", "names no tag or digest"),
    ("docker.io/library/python:3.11", "is not in OCI Container Registry"),
    ("ghcr.io/org/train:1", "is not in OCI Container Registry"),
    ("train:1", "is not in OCI Container Registry"),
])
def test_images_must_be_in_ocir_with_a_tag_or_digest(image, problem):
    found = image_problem(image)
    assert (found is None) if problem is None else (problem in found)


def test_a_pushed_image_is_named_by_tag_and_digest():
    digest = "sha256:" + "c" * 64
    assert ocir_reference("iad.ocir.io/ns/train:1", f"iad.ocir.io/ns/train@{digest}") == \
        f"iad.ocir.io/ns/train:1@{digest}"
    assert ocir_reference("iad.ocir.io/ns/train:1", None) == "iad.ocir.io/ns/train:1"


def test_exit_codes_are_read_from_lifecycle_details():
    assert exit_code("Job run artifact execution failed with exit code 21.") == 21
    assert exit_code("canceled by the user") is None and exit_code(None) is None


@pytest.mark.parametrize("port, expected", [(None, "29400"), ("0", "0"), ("12345", "12345")])
def test_the_main_s_port_is_29400_on_oci_unless_the_spec_sets_one(port, expected):
    extra = ["--set", f"spec.cluster.spec.port={port}"] if port else []
    done = run_cli("run", "-f", str(SEED_004), "--dry-run", "--output", "json", *extra)
    assert done.returncode == 0, done.stderr
    assert {node["env"]["LAUNCHER_MASTER_PORT"] for node in json.loads(done.stdout)["nodes"]} == {expected}


# -- Logging, through the SDK against the simulation ------------------------------------------------------------
NOW = datetime.datetime.now(datetime.timezone.utc)


@pytest.fixture
def logging_sim(tmp_path):
    """The simulation with one job run whose node wrote 10 lines over 20 days, and a client for its Logging."""
    import oci
    from ocisim import JobRun, Node, OciSim

    sim = OciSim(tmp_path)
    run = JobRun("ocid1.datasciencejobrun.oc1.iad.logs", {"id": "job"}, {},
                 log={"logGroupId": "ocid1.loggroup.g", "logId": "ocid1.log.l"})
    node = Node("n", 0, "", {})
    node.output = [((NOW - datetime.timedelta(days=20 - 2 * i)).timestamp(), f"line {i}") for i in range(10)]
    run.nodes.append(node)
    sim.runs[run.id] = run
    config = oci.config.from_file(str(sim.write_config(tmp_path)))
    client = oci.loggingsearch.LogSearchClient(config, service_endpoint=sim.endpoint,
                                               retry_strategy=oci.retry.NoneRetryStrategy())
    yield sim, run, client
    sim.stop()


def job_run(run_id: str, finished: datetime.datetime, logged: bool = True):
    from oci.data_science.models import JobRun, JobRunLogDetails

    return JobRun(id=run_id, time_accepted=NOW - datetime.timedelta(days=21),
                  time_started=NOW - datetime.timedelta(days=21), time_finished=finished,
                  log_details=JobRunLogDetails(log_group_id="ocid1.loggroup.g", log_id="ocid1.log.l") if logged
                  else None)


def test_searches_stay_within_14_days_page_and_split_what_is_too_large(logging_sim):
    sim, run, client = logging_sim
    sim.search_page, sim.search_too_large = 2, 3
    lines = logs.search(client, "c/ocid1.loggroup.g/ocid1.log.l", run.id, NOW - datetime.timedelta(days=21), NOW)
    assert lines == [f"line {i}" for i in range(10)]
    assert any(refusal[2] == 400 for refusal in sim.refusals)  # "too large" answers, each split in two
    windows = [datetime.datetime.fromisoformat(body["timeEnd"]) - datetime.datetime.fromisoformat(body["timeStart"])
               for method, path, body in sim.requests if path == "/20190909/search"]
    assert max(windows) <= datetime.timedelta(days=14)


def test_lines_that_arrive_late_are_waited_for(logging_sim):
    """A run that just ended: Logging is asked again until its lines stop coming (no wall time: a test clock)."""
    sim, run, client = logging_sim
    arriving = iter([(NOW.timestamp(), "late 1"), (NOW.timestamp(), "late 2")])
    clock = [NOW]

    def sleep(seconds: float) -> None:
        clock[0] += datetime.timedelta(seconds=seconds)
        run.nodes[0].output.append(next(arriving, (0.0, "")))

    run.nodes[0].output.clear()
    found = logs.run_output(client, "c", job_run(run.id, NOW), now=lambda: clock[0], sleep=sleep)
    assert found.lines == ("late 1", "late 2")


def test_when_logging_has_nothing_the_reason_is_given(logging_sim):
    sim, run, client = logging_sim
    long_ago = NOW - datetime.timedelta(hours=1)
    assert "not set up for this job (set logGroupId" in logs.run_output(
        client, "c", job_run(run.id, long_ago, logged=False), now=lambda: NOW).note
    assert "returned no lines for job run ocid1.other" in logs.run_output(
        client, "c", job_run("ocid1.other", long_ago), now=lambda: NOW).note
    sim.fail("POST", r"/20190909/search", 404, "NotAuthorizedOrNotFound", "log group not found or not authorized")
    assert logs.run_output(client, "c", job_run(run.id, long_ago), now=lambda: NOW).note == \
        "OCI Logging could not be searched: 404 NotAuthorizedOrNotFound: log group not found or not authorized"


def test_a_node_that_claims_a_name_again_starts_as_its_next_incarnation(tmp_path):
    """The settings carry the claim's incarnation: the node then continues the name (its records, the next round)
    instead of refusing a name that already has a status."""
    from launcher.node.settings import from_env

    env = {"LAUNCHER_RUN_ID": "r1", "LAUNCHER_WORK_DIR": str(tmp_path), "LAUNCHER_ENTRYPOINT": "train.py",
           "LAUNCHER_NODE_GROUPS": json.dumps([["m", 1], ["w", 2]]), "LAUNCHER_NODE_GROUP": json.dumps(["m", "w"])}
    first = from_env({**env, **replica(2)})
    assert (first.node, first.incarnation) == ("w-1", 0)
    again = from_env({**env, **replica(2)})
    assert (again.node, again.incarnation) == ("w-1", 1)


# -- create-if-absent on an oci:// work dir, through ocifs against the simulation ------------------------------------
@pytest.fixture
def oci_work_dir(tmp_path, monkeypatch):
    """The simulation, and a function that opens ``oci://runs@simns/wd/r`` as a fresh client (a separate machine)."""
    from ocisim import OciSim

    sim = OciSim(tmp_path)
    monkeypatch.setenv("LAUNCHER_OCI_ENDPOINT", sim.endpoint)
    monkeypatch.setenv("OCI_CLI_CONFIG_FILE", str(sim.write_config(tmp_path)))
    monkeypatch.delenv("OCI_RESOURCE_PRINCIPAL_VERSION", raising=False)
    yield sim, lambda: WorkDir("oci://runs@simns/wd/r", fresh_instance=True, attempts=2)
    sim.stop()


def test_two_creates_of_one_key_at_once_on_oci_exactly_one_wins(oci_work_dir):
    """Both PUTs reach Object Storage before either is answered (the simulation holds each until the other has
    arrived): a create that checked, then wrote, would see the key absent twice and both would win. With
    ``if-none-match: *`` the store decides: one is written, the other refused with 412, and its node reads the
    winner's bytes. As a round's decision is made (rounds/{r}.json, docs/protocol.md "Recovery")."""
    sim, open_work_dir = oci_work_dir
    served = sim._object
    arrived = threading.Barrier(2, timeout=20)

    def both_in_flight(method, namespace, bucket, name, *rest):
        if method == "PUT" and name.endswith("rounds/00001.json"):
            arrived.wait()
        return served(method, namespace, bucket, name, *rest)

    sim._object = both_in_flight
    stores = {node: open_work_dir() for node in ("m", "w-0")}
    created: dict[str, bool] = {}
    threads = [threading.Thread(target=lambda node=node, store=store: created.__setitem__(
        node, store.create("rounds/00001.json", f"members chosen by {node}".encode()))) for node, store in stores.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(created.values()) == [False, True], created
    [winner] = [node for node, won in created.items() if won]
    for store in stores.values():
        assert store.get("rounds/00001.json") == f"members chosen by {winner}".encode()
    def the_key(path: str) -> bool:
        return urllib.parse.unquote(path.split("?")[0]).endswith("/wd/r/rounds/00001.json")

    refused = [(method, status, code) for method, path, status, code in sim.refusals if the_key(path)]
    assert refused == [("PUT", 412, "IfNoneMatchFailed")], sim.refusals
    asked = [method for method, path, _ in sim.requests if the_key(path)]
    assert asked[:2] == ["PUT", "PUT"], asked  # no look before the write: the store alone decides


def test_a_create_of_a_key_that_exists_on_oci_is_refused_and_keeps_the_first_bytes(oci_work_dir):
    sim, open_work_dir = oci_work_dir
    store = open_work_dir()
    assert store.create("attempts/2.json", b"first") is True
    assert open_work_dir().create("attempts/2.json", b"second") is False
    assert store.get("attempts/2.json") == b"first"
    store.put("attempts/2.json", b"replaced")  # a plain put still replaces (no header)
    assert store.get("attempts/2.json") == b"replaced"
