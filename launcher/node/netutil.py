"""Which address a node advertises and on which interface; free ports; waiting for a port that answers.

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

import ipaddress
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable, MutableMapping

# A documentation-range address: connect() on a UDP socket only asks the kernel for a route;
# no packet is sent.
_ROUTE_PROBE = ("192.0.2.1", 9)
SOCKET_INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


@dataclass(frozen=True)
class NodeAddress:
    address: str
    interface: str | None  # the network interface that holds it, where known
    source: str  # where it came from, in words, for the node's log


def interface_address(name: str) -> str | None:
    """The (primary) IPv4 address of network interface ``name`` (SIOCGIFADDR), or None when it has none."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def interfaces() -> dict[str, str]:
    """This host's interfaces that have an IPv4 address: name -> address, in the kernel's order.

    One address per interface, the primary one, as ADS takes the first address psutil lists."""
    found = {}
    for _, name in socket.if_nameindex():
        address = interface_address(name)
        if address:
            found[name] = address
    return found


def holder(address: str, table: dict[str, str]) -> str | None:
    """The interface in ``table`` that holds ``address``."""
    return next((name for name, held in table.items() if held == address), None)


def in_network(cidr: str, table: dict[str, str]) -> tuple[str, str] | None:
    """(interface, address) of the first interface whose address lies in ``cidr``."""
    network = ipaddress.ip_network(cidr, strict=False)
    return next(((name, held) for name, held in table.items() if ipaddress.ip_address(held) in network), None)


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
    from launcher.node.engines import ocicluster

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


def free_port(address: str) -> int:
    """A port that was free on ``address`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def wait_for_port(address: str, port: int, *, deadline: float, initial: float = 0.05, cap: float = 0.5) -> bool:
    """Until the deadline, try TCP connections to ``address:port``; True once one is accepted."""
    delay = initial
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=min(2.0, max(0.1, deadline - time.monotonic()))):
                return True
        except OSError:
            time.sleep(delay)  # backoff between connection attempts: there is no event to wait on
            delay = min(cap, delay * 2)
    return False
