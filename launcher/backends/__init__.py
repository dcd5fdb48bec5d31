"""Backends, looked up by name and imported only when used (their SDKs are heavy)."""

from __future__ import annotations

import importlib

from launcher.backends.base import Backend
from launcher.errors import BadInput

_BACKENDS = {
    "local": "launcher.backends.local:LocalBackend",
    "docker": "launcher.backends.docker:DockerBackend",
    "oci": "launcher.backends.oci:OciBackend",
    "slurm": "launcher.backends.slurm:SlurmBackend",
    "kubernetes": "launcher.backends.kubernetes:KubernetesBackend",
}
_BY_INFRASTRUCTURE = {"local": "local", "docker": "docker", "dataScienceJob": "oci", "slurm": "slurm",
                      "kubernetes": "kubernetes"}


def backend_for(name: str | None, infra_type: str) -> Backend:
    """The backend named on the command line, else the one the spec's infrastructure type implies."""
    chosen = name or _BY_INFRASTRUCTURE[infra_type]
    if chosen not in _BACKENDS:
        raise BadInput(f"unknown backend '{chosen}'; choose one of: {', '.join(_BACKENDS)}")
    module_name, class_name = _BACKENDS[chosen].split(":")
    return getattr(importlib.import_module(module_name), class_name)()
