"""Agreement: under random start orders and delays every node learns the same main and distinct ranks 0..N-1."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.protocol.rendezvous import (Decision, PollPolicy, Registration, RendezvousError, RendezvousTimeout,
                                      await_decision,
                                      decide_static, parse_node_key)
from launcher.protocol.store import WorkDir


def run_nodes(url: str, names: list[str], delays: list[float], timeout: float = 60.0,
              expected: list[str] | None = None) -> dict[str, object]:
    """Start one thread per node after its delay; each has its own store client, like a separate machine."""
    results: dict[str, object] = {}
    expected = expected or names

    def node(name: str, delay: float, port: int) -> None:
        time.sleep(delay)  # the start delay under test, not synchronisation
        store = WorkDir(url, fresh_instance=True)
        policy = PollPolicy.for_store(store)
        policy.rng = random.Random(port)
        try:
            results[name] = await_decision(store, Registration(name, "10.0.0.%d" % port, 20000 + port), expected,
                                           timeout=timeout, policy=policy)
        except Exception as exc:  # recorded and asserted on by the caller
            results[name] = exc

    threads = [threading.Thread(target=node, args=(n, d, i)) for i, (n, d) in enumerate(zip(names, delays))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 30)
    return results


def assert_agreement(results: dict[str, object], names: list[str]) -> Decision:
    decisions = list(results.values())
    assert all(isinstance(d, Decision) for d in decisions), decisions
    first = decisions[0]
    assert all(d == first for d in decisions)
    assert first.ranks == {name: rank for rank, name in enumerate(names)}  # the spec's order, whoever came first
    assert first.main == names[0]
    main_index = names.index(first.main)
    assert (first.master_addr, first.master_port) == ("10.0.0.%d" % main_index, 20000 + main_index)
    return first


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(min_value=1, max_value=32), seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_agreement_on_a_local_directory(tmp_path_factory, n, seed):
    rng = random.Random(seed)
    names = [f"node-{i}" for i in range(n)]
    rng.shuffle(names)
    delays = [rng.choice([0.0, rng.uniform(0, 0.05), rng.uniform(0, 1.0)]) for _ in names]
    url = str(tmp_path_factory.mktemp("wd") / "run")
    assert_agreement(run_nodes(url, names, delays), names)


@pytest.mark.parametrize("n,seed", [(2, 1), (5, 2), (8, 3), (16, 4), (32, 5), (32, 6)])
def test_agreement_on_s3(s3_bucket, n, seed):
    rng = random.Random(seed)
    names = [f"w{i}" for i in range(n)]
    rng.shuffle(names)
    delays = [rng.uniform(0, 1.5) for _ in names]
    assert_agreement(run_nodes(f"s3://{s3_bucket}/wd/run-{seed}", names, delays), names)


def test_ranks_follow_the_spec_whatever_the_start_order(tmp_path):
    names = ["job-main", "job-worker-0", "job-worker-1"]
    for trial, delays in enumerate([[0.3, 0.1, 0], [0, 0.2, 0.1], [0.1, 0, 0.3], [0, 0, 0]]):
        decision = assert_agreement(run_nodes(str(tmp_path / f"r{trial}"), names, delays), names)
        assert decision.main == "job-main" and decision.ranks["job-worker-1"] == 2


def test_decision_is_a_pure_function_of_the_registrations():
    order = ["x", "y", "z.dotted-name"]
    keys = [Registration(name, f"10.1.1.{i}", 100 + i, 4, nonce=nonce).key.split("/")[1]
            for i, (name, nonce) in enumerate([("x", "00ff"), ("y", "0001"), ("z.dotted-name", "a000")])]
    registered = {listed.name: listed for listed in map(parse_node_key, keys)}
    decision = decide_static(registered, order)
    assert decision == Decision(main="x", master_addr="10.1.1.0", master_port=100,
                                ranks={"x": 0, "y": 1, "z.dotted-name": 2}, processes_per_node=4,
                                nonces={"x": "00ff", "y": "0001", "z.dotted-name": "a000"})
    assert decision.to_bytes() == decide_static(dict(reversed(registered.items())), order).to_bytes()
    assert parse_node_key("0001~99~::1~2~ipv6-node.json").address == "::1"
    assert parse_node_key("0001~99~::1~2~ipv6-node.json").processes == 2
    assert parse_node_key("stray.json") is None and parse_node_key(".0001~1~a~1~b.json.x.tmp") is None


def test_nodes_that_would_start_different_process_counts_fail_alike():
    registered = {name: parse_node_key(Registration(name, "10.0.0.1", 1, count).key.split("/")[1])
                  for name, count in (("a", 8), ("b", 4))}
    with pytest.raises(RendezvousError, match=r"different numbers of training processes \(a: 8, b: 4\)"):
        decide_static(registered, ["a", "b"])


def test_timeout_names_the_missing_nodes(tmp_path):
    started = time.monotonic()
    results = run_nodes(str(tmp_path / "run"), ["a", "b"], [0, 0.3], timeout=1.0, expected=["a", "b", "c", "d"])
    for result in results.values():
        assert isinstance(result, RendezvousTimeout)
        assert result.missing == ["c", "d"]
        assert "2/4 nodes registered; missing: c, d" in str(result)
    assert time.monotonic() - started < 10


def test_another_runs_files_never_affect_a_new_run(tmp_path):
    """A crashed earlier run left registrations, a decision, a cancel and failure markers: the new run ignores them."""
    work_dir = tmp_path / "wd"
    old = WorkDir(str(work_dir / "old-run"))
    old.put("nodes/0000000000000000~1~9.9.9.9~1~a.json", json.dumps({"address": "9.9.9.9", "port": 1}).encode())
    old.put("rendezvous.json", Decision("a", "9.9.9.9", 1, {"a": 0, "b": 1}).to_bytes())
    old.put("control/cancel", b"{}")
    old.put("control/failed.b.json", b"{}")
    names = ["a", "b"]
    decision = assert_agreement(run_nodes(str(work_dir / "new-run"), names, [0.2, 0]), names)
    assert decision.master_addr != "9.9.9.9"


def test_transient_s3_errors_are_retried(moto, s3_bucket, monkeypatch):
    from s3server import FaultyProxy

    proxy = FaultyProxy(moto.port, failure_rate=0.3, seed=7)
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", proxy.endpoint)
    import fsspec.config

    fsspec.config.conf.clear()
    fsspec.config.set_conf_env(fsspec.config.conf)
    try:
        names = [f"n{i}" for i in range(8)]
        assert_agreement(run_nodes(f"s3://{s3_bucket}/wd/faulty", names, [i * 0.05 for i in range(8)]), names)
    finally:
        proxy.stop()
    assert proxy.failed > 10 and proxy.forwarded > 10, (proxy.failed, proxy.forwarded)


def test_a_decision_without_this_nodes_registration_is_refused(tmp_path):
    """An earlier attempt with the same run id left its decision: a new node must not use it."""
    store = WorkDir(str(tmp_path / "run"))
    store.put("rendezvous.json", Decision("a", "10.0.0.9", 9, {"a": 0, "b": 1}, nonces={"a": "1", "b": "2"}).to_bytes())
    with pytest.raises(RendezvousError, match="made without this node's registration"):
        await_decision(store, Registration("b", "10.0.0.2", 2), ["a", "b"], timeout=10)
