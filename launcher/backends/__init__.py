"""Backends, looked up by name and imported only when used (their SDKs are heavy)."""

from __future__ import annotations

import importlib

from launcher.backend_names import BACKENDS, BY_INFRASTRUCTURE
from launcher.backends.base import Backend
from launcher.errors import BadInput


def backend_for(name: str | None, infra_type: str) -> Backend:
    """The backend named on the command line, else the one the spec's infrastructure type implies."""
    chosen = name or BY_INFRASTRUCTURE[infra_type]
    if chosen not in BACKENDS:
        raise BadInput(f"unknown backend '{chosen}'; choose one of: {', '.join(BACKENDS)}")
    module_name, class_name = BACKENDS[chosen].split(":")
    return getattr(importlib.import_module(module_name), class_name)()
