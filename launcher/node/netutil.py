"""Addresses and ports, without cloud APIs: the route the kernel would use, a free port, a port that answers."""

from __future__ import annotations

import os
import socket
import time

# A documentation-range address: connect() on a UDP socket only asks the kernel for a route;
# no packet is sent.
_ROUTE_PROBE = ("192.0.2.1", 9)


# Set by OCI Data Science in multi-node jobs: the interface of the cluster network between nodes.
CLUSTER_INTERFACE_VARIABLES = ("JR_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` (SIOCGIFADDR), or None when it has none."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def own_address() -> str:
    """LAUNCHER_NODE_ADDRESS if set; else the address of the cluster interface the service names;
    else the source address of this host's default route."""
    override = os.environ.get("LAUNCHER_NODE_ADDRESS")
    if override:
        return override
    for variable in CLUSTER_INTERFACE_VARIABLES:
        interface = os.environ.get(variable, "").split(",")[0].strip()
        address = interface_address(interface) if interface and not interface.startswith("^") else None
        if address:
            return address
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(_ROUTE_PROBE)
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


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
