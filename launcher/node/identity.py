"""Which node this is, where a service starts every node of a group from one environment.

OCI Data Science multi-node jobs give all replicas of a node group the same env. launcher puts
into each group's env the spec groups it holds (``LAUNCHER_NODE_GROUP``, a JSON list), which
gives the node its candidate names. A group of one node needs nothing more. Otherwise the node
claims a name in the work dir, ``slots/{name}.json``, with create-if-absent (atomic on every store
the work dir uses), trying first the name its ``NODE_RANK`` points to: in a single node group,
the layout ADS uses, that is the documented numbering (rank 0 is the main) and every first try
succeeds; across several groups the numbering is documented nowhere, so the rank is only a hint
and the claim decides.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
from typing import Mapping, Sequence

from launcher import node_names
from launcher.node.store import WorkDir

NODE_GROUP = "LAUNCHER_NODE_GROUP"
SERVICE_RANK = "NODE_RANK"
SLOTS_PREFIX = "slots"


class IdentityError(Exception):
    pass


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


def claim(store: WorkDir, names: Sequence[str], preferred: str | None) -> str:
    """Claim the first free name, ``preferred`` first, the others from a random start (so that nodes
    without a hint rarely race for the same one); a claim whose answer was lost is recognised."""
    start = random.randrange(len(names))
    order = ([preferred] if preferred else []) + [name for name in names[start:] + names[:start] if name != preferred]
    token = json.dumps({"nonce": secrets.token_hex(8), "host": socket.gethostname(), "pid": os.getpid()}).encode()
    for name in order:
        key = f"{SLOTS_PREFIX}/{name}.json"
        if store.create(key, token) or store.get(key) == token:
            return name
    raise IdentityError(f"every node of this group ({', '.join(names)}) has already claimed its name in "
                        f"{store.url}/{SLOTS_PREFIX}/: more nodes started than the group has (a restarted node, or "
                        "a run id used twice)")


def service_node(env: Mapping[str, str], groups: Sequence[tuple[str, int]], run_url: str) -> str:
    """This node's name from ``LAUNCHER_NODE_GROUP`` (and, where needed, a claim in the work dir)."""
    try:
        held = json.loads(env[NODE_GROUP])
    except ValueError:
        held = None
    if not isinstance(held, list):
        raise IdentityError(f"{NODE_GROUP} must be a JSON list of group names, not {env[NODE_GROUP]!r}")
    names = candidates(groups, [str(name) for name in held])
    if len(names) == 1:
        return names[0]
    return claim(WorkDir(run_url), names, first_choice(names, env))
