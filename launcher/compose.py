"""Render a docker-compose file that runs the same cluster as the docker backend, one service per node."""

from __future__ import annotations

from typing import Any

from launcher.backends.docker import container_specs
from launcher.plan import Plan


def _literal(value: str) -> str:
    """Compose interpolates ``$VAR`` in values; ``$$`` keeps a dollar sign as it is."""
    return value.replace("$", "$$")


def compose_document(plan: Plan) -> dict[str, Any]:
    services: dict[str, Any] = {}
    for node, container in zip(plan.nodes, container_specs(plan)):
        service: dict[str, Any] = {
            "image": _literal(container["image"]),
            "container_name": container["name"],
            "command": [_literal(part) for part in container["command"]],
            "environment": {name: _literal(value) for name, value in container["environment"].items()},
            "network_mode": container["network_mode"],
            "volumes": [_literal(volume) for volume in container["volumes"]],
            "labels": container["labels"],
        }
        if "shm_size" in container:
            service["shm_size"] = container["shm_size"]
        services[node.name] = service
    return {"services": services}
