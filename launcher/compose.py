"""Render a docker-compose file that runs the same cluster as the docker backend, one service per node."""

from __future__ import annotations

from typing import Any

from launcher.backends.docker.containers import container_specs
from launcher.plan import Plan


def _literal(value: str) -> str:
    """Compose interpolates ``$VAR`` in values; ``$$`` keeps a dollar sign as it is."""
    return value.replace("$", "$$")


def compose_document(plan: Plan, gpu_shares: list[str] | None = None,
                     build_context: str | None = None, build_args: dict[str, str] | None = None) -> dict[str, Any]:
    """``build_context``: a directory holding the staged build context, for nodes that use "@image",
    built with the image's own build args and ``build_args`` (those `launcher build` was given)."""
    services: dict[str, Any] = {}
    for node, container in zip(plan.nodes, container_specs(plan, gpu_shares)):
        service: dict[str, Any] = {"image": _literal(container["image"])}
        if build_context and plan.image and node.image == plan.image.tag:
            service["build"] = {"context": build_context, "dockerfile": plan.image.dockerfile,
                                "args": {**plan.image.build_args, **(build_args or {})}}
        service.update({
            "container_name": container["name"],
            "hostname": container["hostname"],
            "init": True,
            "command": [_literal(part) for part in container["command"]],
            "environment": {name: _literal(value) for name, value in container["environment"].items()},
            "volumes": [_literal(volume) for volume in container["volumes"]],
            "labels": container["labels"],
        })
        if "network_mode" in container:  # else the file's own default network: one per `up`
            service["network_mode"] = container["network_mode"]
        if "shm_size" in container:
            service["shm_size"] = container["shm_size"]
        for request in container.get("device_requests", []):
            service.setdefault("deploy", {"resources": {"reservations": {"devices": []}}})
            service["deploy"]["resources"]["reservations"]["devices"].append(
                {"driver": request["Driver"], "device_ids": request["DeviceIDs"], "capabilities": ["gpu"]})
        services[node.name] = service
    return {"services": services}
