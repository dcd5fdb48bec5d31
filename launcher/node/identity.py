"""Which node this is, where a service starts every node of a group from one environment.

OCI Data Science multi-node jobs give all replicas of a node group the same env. launcher puts
into each group's env the spec groups it holds (``LAUNCHER_NODE_GROUP``, a JSON list), which
gives the node its candidate names. A group of one node needs nothing more. Otherwise the node
claims a name in the work dir, ``slots/{name}.json``, with create-if-absent (atomic on every store
the work dir uses), trying first the name its ``NODE_RANK`` points to: in a single node group,
the layout ADS uses, that is the documented numbering (rank 0 is the main) and every first try
succeeds; across several groups the numbering is documented nowhere, so the rank is only a hint
and the claim decides.

A name is claimed again, as its next incarnation (``slots/{name}/{n}.json``, create-if-absent too),
by a replica that restarted (the same job run and ``NODE_RANK`` as the claim's holder: that holder
is gone) or, once the holder's status says it ended without succeeding after its claim (lost,
failed, cancelled), by any node: a replica the service started again elsewhere, or the nodes of
a new attempt of the run. The incarnation tells the node it continues a name (see
:class:`launcher.node.settings.NodeSettings`).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import time
from typing import Any, Mapping, NamedTuple, Sequence

from launcher import node_names
from launcher.protocol.status import FINAL_STATES, status_key
from launcher.protocol.store import WorkDir

NODE_GROUP = "LAUNCHER_NODE_GROUP"
SERVICE_RANK = "NODE_RANK"
SLOTS_PREFIX = "slots"
JOB_RUN = "JOB_RUN_OCID"  # set by the service in every job run (OCI's "Job Environment Variables")


class IdentityError(Exception):
    pass


class Claim(NamedTuple):
    name: str
    incarnation: int  # 0: the name's first holder; n: its n-th holder after one that ended or restarted


def candidates(groups: Sequence[tuple[str, int]], held: Sequence[str]) -> list[str]:
    """The names of the nodes of the spec groups ``held``, in the spec's order."""
    unknown = sorted(set(held) - {name for name, _ in groups})
    if unknown or not held:
        raise IdentityError(f"{NODE_GROUP} names {', '.join(unknown) or 'no group'}; the spec's groups are "
                            f"{', '.join(name for name, _ in groups)}")
    names = node_names.expand(groups)
    owners = [name for name, replicas in groups for _ in range(replicas)]
    return [node for node, owner in zip(names, owners) if owner in held]


def first_choice(names: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The name ``NODE_RANK`` points to among ``names``, if it points to one."""
    text = env.get(SERVICE_RANK, "")
    return names[int(text)] if text.isdigit() and int(text) < len(names) else None


def slot_key(name: str, incarnation: int) -> str:
    return f"{SLOTS_PREFIX}/{name}.json" if incarnation == 0 else f"{SLOTS_PREFIX}/{name}/{incarnation}.json"


def claim(store: WorkDir, names: Sequence[str], preferred: str | None,
          env: Mapping[str, str] | None = None) -> Claim:
    """Claim the first free name, ``preferred`` first, the others from a random start (so that nodes
    without a hint rarely race for the same one); a claim whose answer was lost is recognised. A name
    held by this very replica before it restarted, or by a node that has ended without succeeding,
    is claimed again as its next incarnation."""
    env = os.environ if env is None else env
    start = random.randrange(len(names))
    order = ([preferred] if preferred else []) + [name for name in names[start:] + names[:start] if name != preferred]
    me = {"job_run": env.get(JOB_RUN, ""), "rank": env.get(SERVICE_RANK, "")}
    token = json.dumps({"nonce": secrets.token_hex(8), "host": socket.gethostname(), "pid": os.getpid(),
                        "at": time.time(), **me}).encode()
    for name in order:
        newest, holder = _newest(store, name)
        if newest is not None and holder == token:
            return Claim(name, newest)  # our own claim, whose answer was lost
        if newest is not None and not _own(holder, me) and not _ended_since(store, name, holder):
            continue
        incarnation = 0 if newest is None else newest + 1
        if store.create(slot_key(name, incarnation), token) or store.get(slot_key(name, incarnation)) == token:
            return Claim(name, incarnation)
    raise IdentityError(f"every node of this group ({', '.join(names)}) has claimed its name in {store.url}/"
                        f"{SLOTS_PREFIX}/ and none of them has ended: more nodes started than the group has (a run "
                        "id used twice?)")


def _newest(store: WorkDir, name: str) -> tuple[int | None, bytes | None]:
    """The newest incarnation claimed of ``name`` and its claim, or (None, None) while it is unclaimed."""
    first = store.get(slot_key(name, 0))
    if first is None:
        return None, None
    later = [int(key[:-5]) for key in store.list(f"{SLOTS_PREFIX}/{name}") if key.endswith(".json")
             and key[:-5].isdigit()]
    if not later:
        return 0, first
    newest = max(later)
    return newest, store.get(slot_key(name, newest))


def _record(data: bytes | None) -> dict[str, Any]:
    try:
        value = json.loads(data or b"")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _own(holder: bytes | None, me: Mapping[str, str]) -> bool:
    """The holder was this replica before it restarted: the same job run, the same NODE_RANK."""
    held = _record(holder)
    return bool(me["job_run"] and me["rank"]) and held.get("job_run") == me["job_run"] and \
        held.get("rank") == me["rank"]


def _ended_since(store: WorkDir, name: str, holder: bytes | None) -> bool:
    """The node's status says it ended without succeeding, after ``holder`` claimed it (a status from
    before is that of an earlier holder)."""
    status = store.get_record(status_key(name))
    ended = status.get("ended_at") or status.get("updated_at") or 0.0
    return status.get("state") in FINAL_STATES and status.get("state") != "succeeded" and \
        float(ended) >= float(_record(holder).get("at") or 0.0)


def service_node(env: Mapping[str, str], groups: Sequence[tuple[str, int]], run_url: str) -> Claim:
    """This node's name from ``LAUNCHER_NODE_GROUP`` (and, where needed, a claim in the work dir)."""
    try:
        held = json.loads(env[NODE_GROUP])
    except ValueError:
        held = None
    if not isinstance(held, list):
        raise IdentityError(f"{NODE_GROUP} must be a JSON list of group names, not {env[NODE_GROUP]!r}")
    names = candidates(groups, [str(name) for name in held])
    if len(names) == 1:
        return Claim(names[0], 0)
    return claim(WorkDir(run_url), names, first_choice(names, env), env)
