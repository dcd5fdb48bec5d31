"""Election and node ranks through the work dir, using only put, create-if-absent, get and list.

Layout under ``{work_dir}/{run_id}/`` (see docs/protocol.md for the reasoning):

  nodes/{nonce}~{port}~{address}~{processes}~{name}.json
                              one registration per node, written once; the key alone carries
                              what the decision needs, so deciding takes a single LIST
  rendezvous.json             the decision: main, MASTER_ADDR/PORT, rank of every node

Static mode: once all N expected names are registered, the decision is a pure function
of the N registrations and the expected order (the spec's: the main group's node is rank 0
and the main, then worker-0, worker-1, ...), so every node that computes it computes the same
bytes; the first to create ``rendezvous.json`` publishes it and the others read it.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from launcher.protocol.control import ControlWatch, StopRequest
from launcher.protocol.store import WorkDir

DECISION_KEY = "rendezvous.json"
PROGRESS_EVERY_SECONDS = 30.0  # while waiting, who is missing is said at most this often (at a listing)
NODES_PREFIX = "nodes"
LISTERS = 32  # a waiting run's nodes together list the registrations about this many times per base interval


class RendezvousError(Exception):
    pass


class RendezvousTimeout(RendezvousError):
    def __init__(self, missing: Sequence[str], registered: int, expected: int, timeout: float):
        self.missing = list(missing)
        super().__init__(f"rendezvous timed out after {timeout:g}s: {registered}/{expected} nodes registered; "
                         f"missing: {', '.join(self.missing)}")


class RendezvousStopped(RendezvousError):
    """The run was cancelled, or a peer failed, while this node waited for the others."""

    def __init__(self, request: StopRequest):
        self.request = request
        super().__init__(f"{request.reason} (while waiting for nodes)")


def node_entry(nonce: str, port: int, address: str, processes: int, name: str) -> str:
    """A registration's name in a listing (parse_node_key reads it back). "~" appears in no node name (schema),
    address or number, so it splits unambiguously."""
    return f"{nonce}~{port}~{address}~{processes}~{name}.json"


@dataclass(frozen=True)
class Registration:
    name: str
    address: str
    port: int
    processes: int = 1  # training processes this node will start (decided on the node for "auto")
    nonce: str = field(default_factory=lambda: secrets.token_hex(8))
    pid: int = field(default_factory=os.getpid)
    incarnation: int = 0  # which start of the node registers (in the body only): a newer one takes its place

    def again(self, port: int | None = None) -> "Registration":
        """The same node registering anew (a fresh nonce), on ``port`` when given."""
        return Registration(self.name, self.address, self.port if port is None else port, self.processes,
                            incarnation=self.incarnation)

    @property
    def entry(self) -> str:
        return node_entry(self.nonce, self.port, self.address, self.processes, self.name)

    @property
    def key(self) -> str:
        return f"{NODES_PREFIX}/{self.entry}"


@dataclass(frozen=True)
class Listed:
    """A registration as a listing shows it."""

    nonce: str
    port: int
    address: str
    processes: int
    name: str

    @property
    def entry(self) -> str:
        return node_entry(self.nonce, self.port, self.address, self.processes, self.name)


@dataclass(frozen=True)
class Decision:
    main: str
    master_addr: str
    master_port: int
    ranks: dict[str, int]  # node -> node rank, in the spec's order
    processes_per_node: int = 1
    nonces: dict[str, str] = field(default_factory=dict)  # whose registrations it was made from

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Decision":
        body = json.loads(data)
        body.pop("mode", None)  # written by versions that had torchrun's elastic mode
        return cls(**body)


@dataclass
class PollPolicy:
    """Waiting costs: a GET of the decision per poll, a LIST of ``control/`` every ``list_every`` seconds and a LIST
    of the registrations every :meth:`list_interval` seconds."""

    initial: float = 0.5
    factor: float = 1.5
    cap: float = 0.75
    jitter: float = 0.2
    list_every: float = 10.0
    rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def for_store(cls, store: WorkDir) -> "PollPolicy":
        """Object stores: the defaults, which bound the request rate. A local directory costs a
        system call per poll, so it is polled faster (nodes on one machine or a shared file system)."""
        return cls(initial=0.02, factor=1.5, cap=0.1, list_every=2.0) if store.is_local else cls()

    def list_interval(self, nodes: int, base: float | None = None) -> float:
        """Seconds until a waiting node of a run of ``nodes`` lists the registrations again: ``base`` (default
        ``list_every``) up to LISTERS nodes, longer in proportion beyond. Each listing reads every registration, so
        a fixed interval would make the run read N x N entries per interval; this way its nodes together make about
        LISTERS listings per ``base``, linear work in N. Jittered, so that the nodes' listings stay spread out and
        one of them lists soon after any moment (a last registrant that died before deciding is covered)."""
        base = self.list_every if base is None else base
        return base * max(1.0, nodes / LISTERS) * self.rng.uniform(1 - self.jitter, 1 + self.jitter)

    def delays(self):
        delay = self.initial
        while True:
            yield delay * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
            delay = min(self.cap, delay * self.factor)


def parse_node_key(entry: str) -> Listed | None:
    """``{nonce}~{port}~{address}~{processes}~{name}.json`` -> :class:`Listed`; None for anything else."""
    parts = entry[:-5].split("~") if entry.endswith(".json") else []
    if len(parts) != 5 or not parts[1].isdigit() or not parts[3].isdigit():
        return None
    nonce, port, address, processes, name = parts
    return Listed(nonce, int(port), address, int(processes), name)


def register(store: WorkDir, me: Registration) -> None:
    if not store.create(me.key, json.dumps(asdict(me)).encode()):
        raise RendezvousError(f"registration {me.key} already exists")  # a 64-bit nonce collision


def decide_static(registered: dict[str, Listed], order: Sequence[str]) -> Decision:
    """The pure decision: ranks in the spec's order of the nodes, so the main group's node is rank 0
    and the main. Every node must start the same number of processes (static torchrun ranks
    are NODE_RANK x LOCAL_WORLD_SIZE + local rank)."""
    ranked = [name for name in order if name in registered]
    counts = {registered[name].processes for name in ranked}
    if len(counts) > 1:
        seen = ", ".join(f"{name}: {registered[name].processes}" for name in ranked[:8])
        raise RendezvousError(f"the nodes would start different numbers of training processes ({seen}); "
                              "with processesPerNode: auto they see different numbers of GPUs: set a number")
    main = registered[ranked[0]]
    return Decision(main=main.name, master_addr=main.address, master_port=main.port,
                    ranks={name: i for i, name in enumerate(ranked)}, processes_per_node=counts.pop(),
                    nonces={name: registered[name].nonce for name in ranked})


def _accept(decision: Decision, me: Registration) -> Decision:
    """A decision this node may use: one made from its own registration."""
    if decision.nonces.get(me.name) != me.nonce:
        raise RendezvousError(f"{DECISION_KEY} in this run's work dir was made without this node's registration: "
                              "another attempt used the same run id (a second `docker-compose up` of one file, a "
                              "restarted node); start a new run")
    return decision


def await_decision(store: WorkDir, me: Registration, expected: Sequence[str], *, timeout: float,
                   policy: PollPolicy | None = None,
                   progress: Callable[[list[str], list[str], float], None] | None = None) -> Decision:
    """Register ``me`` and return the run's decision once there is one; raise on timeout or cancel.

    The registrations are listed right after registering (the last node to register decides without waiting),
    then every ``policy.list_interval(N)`` seconds; ``control/`` every ``policy.list_every`` seconds, whatever N,
    so that a cancel or a peer's failure is noticed as fast in a large run. ``progress`` hears what a listing
    showed, with the time it was made, when it changed or PROGRESS_EVERY_SECONDS after the last report."""
    policy = policy or PollPolicy.for_store(store)
    control = ControlWatch(store, me.name)
    register(store, me)
    started = time.monotonic()
    deadline = started + timeout
    next_list = next_control = started  # at once: the last node to register decides without waiting
    next_progress = started
    seen: tuple[list[str], list[str]] | None = None
    expected_set = set(expected)
    for delay in policy.delays():
        data = store.get(DECISION_KEY)
        if data is not None:
            return _accept(Decision.from_bytes(data), me)
        now = time.monotonic()
        timed_out = now >= deadline
        if now >= next_control and not timed_out:  # at the deadline, the timeout is the cause
            next_control = now + policy.list_every
            stop = control.check(force=True)
            if stop is not None:
                raise RendezvousStopped(stop)
        if now >= next_list or timed_out:
            next_list = now + policy.list_interval(len(expected))
            registered = _registered(store, expected_set)
            missing = [name for name in expected if name not in registered]
            if progress and (seen != (sorted(registered), missing) or now >= next_progress):
                seen = (sorted(registered), missing)
                next_progress = now + PROGRESS_EVERY_SECONDS
                progress(*seen, now - started)
            if len(registered) == len(expected):
                return _accept(_publish(store, registered, expected), me)
            if timed_out:
                raise RendezvousTimeout(missing, len(registered), len(expected), timeout)
        time.sleep(min(delay, max(0.0, deadline - time.monotonic()) + 0.01))
    raise AssertionError("unreachable")


def _registered(store: WorkDir, expected: set[str]) -> dict[str, Listed]:
    registered: dict[str, Listed] = {}
    for entry in store.list(NODES_PREFIX):
        listed = parse_node_key(entry)
        if listed is None or listed.name not in expected:
            continue
        if listed.name in registered:
            raise RendezvousError(f"node name {listed.name!r} registered twice in this run: two nodes were "
                                  "started with the same LAUNCHER_NODE_NAME")
        registered[listed.name] = listed
    return registered


def _publish(store: WorkDir, registered: dict[str, Listed], order: Sequence[str]) -> Decision:
    decision = decide_static(registered, order)
    if store.create(DECISION_KEY, decision.to_bytes()):
        return decision
    return Decision.from_bytes(store.get(DECISION_KEY) or decision.to_bytes())
