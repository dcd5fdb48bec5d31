"""Network interfaces and their IPv4 addresses; free ports; waiting for a port that answers."""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass


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
