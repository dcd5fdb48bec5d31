"""What waiting costs as a run grows (issue 41): the nodes of a waiting run, in the first rendezvous and in a
membership round, together list the registrations about LISTERS times per base interval however many they are,
while a cancel is noticed within the base interval and the last node to register decides at once. Real local work
dirs, nodes as threads, each with its own store client."""

from __future__ import annotations

import random
import threading
import time

from launcher.protocol.control import request_cancel
from launcher.protocol.recovery import Policy
from launcher.protocol.rendezvous import (LISTERS, Decision, PollPolicy, Registration, RendezvousStopped,
                                          RendezvousTimeout, await_decision, register)
from launcher.protocol.rounds import Rounds, Timing
from launcher.protocol.store import WorkDir

N = 3 * LISTERS  # each node lists every 3 base intervals
BASE = 1.0  # the base interval under test: registrations listed every 3 s by each node, control/ every 1 s


class ListCounting(WorkDir):
    """A node's store client that counts its LISTs of the registrations (``nodes`` anywhere in the prefix)."""

    def __init__(self, url: str, listed: list[float]):
        super().__init__(url, fresh_instance=True)
        self.listed = listed

    def list(self, prefix: str) -> list[str]:
        if prefix.endswith("nodes"):
            self.listed.append(time.monotonic())
        return super().list(prefix)


def policy(seed: int) -> PollPolicy:
    return PollPolicy(initial=0.05, cap=0.1, list_every=BASE, rng=random.Random(seed))


class Waiting:
    """``count`` nodes waiting in the first rendezvous of a run of ``names``, each in a thread; ``ready`` is set once
    every one of them has made its first listing (it registered before), ``results`` holds what each returned."""

    def __init__(self, url: str, names: list[str], count: int, timeout: float):
        self.listed: list[float] = []
        self.results: dict[str, object] = {}
        self.ended_at: dict[str, float] = {}
        self._first = threading.Semaphore(0)
        self.threads = [threading.Thread(target=self._node, args=(url, names, i, timeout)) for i in range(count)]
        for thread in self.threads:
            thread.start()
        for _ in range(count):
            assert self._first.acquire(timeout=60)

    def _node(self, url: str, names: list[str], i: int, timeout: float) -> None:
        store = ListCounting(url, self.listed)
        first = threading.Event()

        def progress(registered: list[str], missing: list[str], waited: float) -> None:
            if not first.is_set():
                first.set()
                self._first.release()

        try:
            self.results[names[i]] = await_decision(store, Registration(names[i], "127.0.0.1", 20000 + i), names,
                                                    timeout=timeout, policy=policy(i), progress=progress)
        except Exception as exc:  # asserted on by the test
            self.results[names[i]] = exc
        self.ended_at[names[i]] = time.monotonic()
        if not first.is_set():
            self._first.release()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)


def test_waiting_nodes_together_list_the_registrations_a_bounded_number_of_times(tmp_path):
    names = [f"node-{i}" for i in range(N + 1)]  # one never comes: the others wait until their timeout
    waiting = Waiting(str(tmp_path / "run"), names, N, timeout=12.0)
    began, count_then = time.monotonic(), len(waiting.listed)
    waiting.join()
    assert all(isinstance(result, RendezvousTimeout) for result in waiting.results.values())
    periodic = [at for at in waiting.listed[count_then:] if at - began < 5.0]  # before any node's timeout listing
    # a fixed interval: every node every BASE, N x 5 listings; now about LISTERS per BASE, whatever N
    assert len(periodic) <= 1.25 * LISTERS * 5.0 / BASE + LISTERS, len(periodic)


def test_a_cancel_is_noticed_within_the_base_interval_though_listings_are_rarer(tmp_path):
    url = str(tmp_path / "run")
    names = [f"node-{i}" for i in range(N + 1)]
    waiting = Waiting(url, names, N, timeout=60.0)
    cancelled = time.monotonic()
    request_cancel(WorkDir(url))
    waiting.join()
    assert all(isinstance(result, RendezvousStopped) for result in waiting.results.values())
    slowest = max(waiting.ended_at.values()) - cancelled
    assert slowest < 1.25 * BASE + 1.0 < 3 * 0.8 * BASE  # within the base interval, before a node's next listing


def test_the_last_node_to_register_decides_at_once(tmp_path):
    url = str(tmp_path / "run")
    names = [f"node-{i}" for i in range(N + 1)]
    waiting = Waiting(url, names, N, timeout=60.0)
    started = time.monotonic()
    decision = await_decision(WorkDir(url), Registration(names[-1], "127.0.0.1", 30000), names, timeout=60,
                              policy=policy(N))
    assert time.monotonic() - started < 1.0  # one listing, right after registering
    waiting.join()
    assert all(result == decision for result in waiting.results.values()) and isinstance(decision, Decision)
    assert max(waiting.ended_at.values()) - started < 2.0  # the others read it at their next poll


def test_a_run_decides_when_its_last_node_dies_between_registering_and_deciding(tmp_path):
    url = str(tmp_path / "run")
    names = [f"node-{i}" for i in range(N + 1)]
    waiting = Waiting(url, names, N, timeout=60.0)
    started = time.monotonic()
    register(WorkDir(url), Registration(names[-1], "127.0.0.1", 30000))  # and nothing more: it died
    waiting.join()
    results = list(waiting.results.values())
    assert isinstance(results[0], Decision) and all(result == results[0] for result in results)
    # decided by whichever waiting node listed first (each lists every 3 s at most, the run far more often), long
    # before the timeout's listing; the margin is for a loaded machine
    assert max(waiting.ended_at.values()) - started < 1.2 * 3 * BASE + 10.0


def test_nodes_waiting_in_a_round_list_its_registrations_a_bounded_number_of_times(tmp_path):
    url = str(tmp_path / "run")
    names = [f"node-{i}" for i in range(N + 1)]
    timing = Timing(settle=2 * BASE, first_settle=2 * BASE, end_check=0.1)  # a listing every settle / 2 at most
    rounds_policy = Policy(max_restarts=0, min_nodes=len(names))  # no settling with fewer: they wait
    listed: list[float] = []
    results: dict[str, object] = {}

    def join(i: int) -> None:
        rounds = Rounds(ListCounting(url, listed), names, rounds_policy, timing)
        try:
            results[names[i]] = rounds.join(0, Registration(names[i], "127.0.0.1", 20000 + i), timeout=6.0,
                                            poll=policy(i))
        except Exception as exc:  # asserted on below
            results[names[i]] = exc

    threads = [threading.Thread(target=join, args=(i,)) for i in range(N)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(isinstance(result, RendezvousTimeout) for result in results.values()), results
    # listing at every poll (0.05 to 0.1 s) made about N x 10 a second; now about LISTERS per settle / 2
    per_second = len([at for at in listed if at - began < 5.0]) / 5.0
    assert per_second <= 1.25 * LISTERS / BASE + N / 5.0, per_second
    # and the last member to register decides at once
    started = time.monotonic()
    last = Rounds(WorkDir(url), names, rounds_policy, timing)
    decided = last.join(0, Registration(names[-1], "127.0.0.1", 30000), timeout=60, poll=policy(N))
    assert time.monotonic() - started < 1.0 and decided.members == names
