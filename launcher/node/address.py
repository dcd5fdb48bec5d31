"""Which address a node advertises, and on which interface.

The address, first match wins (no packet is sent to find it):

1. ``LAUNCHER_NODE_ADDRESS`` (the local backend and docker on the host network set it);
2. OCI Data Science multi-node runs: this node's entry in ``CLUSTER_NODES_METADATA_FILE``
   (:mod:`launcher.node.engines.ocicluster`);
3. OCI per-node runs on a subnet of yours: the interface whose address lies in the subnet's CIDR;
4. the interface a user named in ``NCCL_SOCKET_IFNAME`` or ``GLOO_SOCKET_IFNAME``;
5. Slurm: the interface that holds the address Slurm reaches this node at (its NodeAddr, which
   :mod:`launcher.node.engines.slurm` puts in ``LAUNCHER_SLURM_NODE_ADDRESS``);
6. the source address of the kernel's default route.

Where the choice is an interface, ``NCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` are set to it
for training unless the user set them, as Oracle ADS does: cluster traffic between OCI nodes runs
on a network of its own, not on the default route's card.
"""

from __future__ import annotations

import os
import socket
from typing import Callable, MutableMapping

from launcher.node.engines import ocicluster
from launcher.node.netutil import NodeAddress, holder, interface_address, interfaces

# A documentation-range address: connect() on a UDP socket only asks the kernel for a route;
# no packet is sent.
_ROUTE_PROBE = ("192.0.2.1", 9)
SOCKET_INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def route_address() -> str:
    """The source address of the kernel's default route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(_ROUTE_PROBE)
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def node_address(*, timeout: float, say: Callable[[str], None],
                 env: MutableMapping[str, str] = os.environ) -> NodeAddress:
    """This node's address (see the module's order); sets the socket interface variables in ``env`` for training."""
    override = env.get("LAUNCHER_NODE_ADDRESS")
    if override:
        return NodeAddress(override, None, "LAUNCHER_NODE_ADDRESS")
    chosen = (ocicluster.metadata_address(env, interfaces, timeout=timeout, say=say)
              or ocicluster.subnet_address(env, interfaces())
              or _named_interface(env) or _slurm_address(env) or NodeAddress(route_address(), None, "the default route"))
    say(f"address {chosen.address}" + (f" on {chosen.interface}" if chosen.interface else "") +
        f" (from {chosen.source}){use_interface(chosen.interface, env)}")
    return chosen


def _named_interface(env: MutableMapping[str, str]) -> NodeAddress | None:
    for variable in SOCKET_INTERFACE_VARIABLES:
        name = env.get(variable, "").split(",")[0].strip()
        address = interface_address(name) if name and not name.startswith(("^", "=")) else None
        if address:
            return NodeAddress(address, name, variable)
    return None


def _slurm_address(env: MutableMapping[str, str]) -> NodeAddress | None:
    address = env.get("LAUNCHER_SLURM_NODE_ADDRESS")
    if not address:
        return None
    return NodeAddress(address, holder(address, interfaces()), "Slurm's NodeAddr for this node")


def use_interface(interface: str | None, env: MutableMapping[str, str]) -> str:
    """Point NCCL and gloo at ``interface`` where the user named none; say what was set, for the node's log."""
    if not interface:
        return ""
    unset = [variable for variable in SOCKET_INTERFACE_VARIABLES if not env.get(variable)]
    for variable in unset:
        env[variable] = interface
    return f"; {' and '.join(unset)} set to {interface}" if unset else ""
