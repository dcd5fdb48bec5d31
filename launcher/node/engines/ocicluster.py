"""A node's address on OCI Data Science, from what the service documents and Oracle ADS relies on.

Multi-node job runs: the service writes ``CLUSTER_NODES_METADATA_FILE``, a JSON list of
``{"Rank": r, "IPAddress": ip}``, one per node, on the cluster network; it may be missing or hold
only some nodes when a node starts, and ``INITIAL_CLUSTER_SIZE`` says how many to expect. ADS
re-reads it every 20 s until every node is in it, takes its own address by ``NODE_RANK`` and the
interface that holds it (``ads/jobs/templates/driver_pytorch.py``, ``Runner.read_metadata``).

Per-node job runs on a subnet of yours: the interface whose address lies in the subnet's CIDR
(ADS: ``find_self_ip`` in the same file and in
``ads/opctl/distributed/common/abstract_cluster_provider.py``); the subnet's CIDR is read with the
node's resource principal.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Mapping

from launcher.node.netutil import NodeAddress, holder, in_network
from launcher.protocol.rendezvous import RendezvousError

METADATA_FILE = "CLUSTER_NODES_METADATA_FILE"
CLUSTER_SIZE = "INITIAL_CLUSTER_SIZE"
SERVICE_RANK = "NODE_RANK"
SUBNET = "LAUNCHER_OCI_SUBNET_ID"  # set by launcher in per-node runs on a subnet of yours
NETWORK_ENDPOINT = "LAUNCHER_OCI_NETWORK_ENDPOINT"  # set by launcher where the SDK's default is not used
POLL_VARIABLE = "LAUNCHER_OCI_METADATA_POLL"  # seconds between reads of the metadata file
DEFAULT_POLL_SECONDS = 20.0  # as ADS


class ClusterAddressError(RendezvousError):
    """The service's cluster metadata does not give this node an address."""


def read_entries(path: str) -> dict[int, str] | None:
    """Rank -> IP address from the metadata file; None while it is missing or not (yet) a valid list."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return {int(entry["Rank"]): str(entry["IPAddress"]) for entry in data}
    except (OSError, ValueError, TypeError, KeyError):
        return None


def choose(entries: dict[int, str], rank: int | None, expected: int, table: dict[str, str]) -> str | None:
    """This node's address among ``entries``, or None while it cannot be told yet.

    Its own rank's entry, when an interface here holds it (ADS takes it by rank). Otherwise, once
    every node is listed, the entry an interface here holds: how ``NODE_RANK`` counts across
    several node groups is documented nowhere, so the rank alone is not trusted. Failing that, the
    rank's entry as ADS would take it."""
    held = set(table.values())
    if rank is not None and entries.get(rank) in held:
        return entries[rank]
    if len(entries) < expected:
        return None
    local = [address for address in entries.values() if address in held]
    if local:
        return local[0]
    if rank is not None and rank in entries:
        return entries[rank]
    raise ClusterAddressError(f"none of the {len(entries)} addresses in {METADATA_FILE} is on this node "
                              f"(its interfaces: {_listing(table)}) and {SERVICE_RANK} does not name one")


def metadata_address(env: Mapping[str, str], table: Callable[[], dict[str, str]], *, timeout: float,
                     say: Callable[[str], None], sleep: Callable[[float], None] = time.sleep) -> NodeAddress | None:
    """This node's address from the metadata file, waiting for the file to list it; None outside multi-node runs."""
    path = env.get(METADATA_FILE)
    if not path:
        return None
    rank = int(env[SERVICE_RANK]) if env.get(SERVICE_RANK, "").isdigit() else None
    expected = int(env.get(CLUSTER_SIZE) or 1)
    interval = float(env.get(POLL_VARIABLE) or DEFAULT_POLL_SECONDS)
    deadline = time.monotonic() + timeout
    while True:
        entries = read_entries(path)
        interfaces = table()
        address = choose(entries, rank, expected, interfaces) if entries is not None else None
        if address:
            rank_note = f", {SERVICE_RANK} {rank}" if rank is not None else ""
            return NodeAddress(address, holder(address, interfaces), f"{METADATA_FILE}{rank_note}")
        seen = "is missing or not valid JSON" if entries is None else f"lists {len(entries)} of {expected} nodes"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ClusterAddressError(f"{METADATA_FILE} ({path}) {seen} after {timeout:g}s: the service did not "
                                      "say this node's address on the cluster network")
        say(f"waiting for the cluster's addresses: {METADATA_FILE} ({path}) {seen}; reading it again in "
            f"{min(interval, remaining):.0f}s")
        sleep(min(interval, remaining))


def subnet_address(env: Mapping[str, str], table: dict[str, str]) -> NodeAddress | None:
    """The address of the interface in this run's subnet; None when launcher named no subnet."""
    subnet = env.get(SUBNET)
    if not subnet:
        return None
    cidr = subnet_cidr(subnet, env)
    found = in_network(cidr, table)
    if found is None:
        raise ClusterAddressError(f"no interface of this node lies in subnet {subnet} ({cidr}); its interfaces: "
                                  f"{_listing(table)}")
    return NodeAddress(found[1], found[0], f"subnet {cidr}")


def subnet_cidr(subnet: str, env: Mapping[str, str]) -> str:
    """The subnet's CIDR block, read with this node's OCI credentials (the job run's resource principal)."""
    try:
        import oci

        from launcher.ociauth import sdk_auth

        config, signer = sdk_auth(env)
        options: dict[str, Any] = {"signer": signer} if signer is not None else {}
        if env.get(NETWORK_ENDPOINT):
            options["service_endpoint"] = env[NETWORK_ENDPOINT]
        return oci.core.VirtualNetworkClient(config, **options).get_subnet(subnet).data.cidr_block
    except Exception as exc:  # noqa: BLE001 - any failure here means the node cannot tell its address
        message = f"{getattr(exc, 'status', '')} {getattr(exc, 'message', '') or exc}".strip()
        raise ClusterAddressError(f"could not read subnet {subnet} to find this node's interface: {message} (the "
                                  "job runs' dynamic group needs `use virtual-network-family`)") from None


def _listing(table: dict[str, str]) -> str:
    return ", ".join(f"{name} {address}" for name, address in table.items()) or "none with an IPv4 address"
