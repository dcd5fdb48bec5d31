"""Render a docker-compose file that runs the same cluster as the docker backend, one service per node."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from launcher.backends.docker.containers import container_specs, s3_client_env
from launcher.image.context import GENERATED_COMPOSE_HEADER
from launcher.plan import Plan


def _literal(value: str) -> str:
    """Compose interpolates ``$VAR`` in values; ``$$`` keeps a dollar sign as it is."""
    return value.replace("$", "$$")


def compose_header(run_id: str, overrides: Sequence[str] = ()) -> str:
    """The file's first lines; the first marks it as generated, so that no image build sends it. ``overrides``:
    the command-line options that changed the spec (as the run record shows them, secrets masked)."""
    shown = " ".join(option.replace("\r", "\\r").replace("\n", "\\n") for option in overrides)  # one comment line
    made_with = f"# The spec's overrides: {shown}\n" if overrides else ""
    return (f"{GENERATED_COMPOSE_HEADER} for run {run_id}: run it once, with\n"
            "#   docker-compose -f FILE up --abort-on-container-exit\n"
            f"# then `launcher watch {run_id}` / `launcher status {run_id}`; remove its containers and network\n"
            "# with `docker-compose -f FILE down`. For another run, generate the file again.\n" + made_with)


def compose_document(plan: Plan, gpu_shares: list[str] | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """One service per node. S3 client settings taken from ``environ`` are written as ``${NAME}``:
    compose reads them from the environment of ``up``, and no credential is written to the file."""
    services: dict[str, Any] = {}
    passed = set(s3_client_env(plan.spec, environ))
    for node, container in zip(plan.nodes, container_specs(plan, gpu_shares, environ)):
        environment = {name: f"${{{name}}}" if name in passed and name not in node.env else _literal(value)
                       for name, value in container["environment"].items()}
        service: dict[str, Any] = {
            "image": _literal(container["image"]),
            "container_name": container["name"],
            "init": True,
            "command": [_literal(part) for part in container["command"]],
            "environment": environment,
            "volumes": [_literal(volume) for volume in container["volumes"]],
            "labels": container["labels"],
        }
        if "hostname" in container:
            service["hostname"] = container["hostname"]
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
