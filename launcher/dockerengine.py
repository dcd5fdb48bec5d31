"""The Docker engine, reached through the Docker SDK, with errors a user can act on."""

from __future__ import annotations

import os
from typing import Any

from launcher.errors import BackendError


def connect() -> Any:
    """A ``docker.DockerClient`` for the engine of this environment (DOCKER_HOST or the local socket)."""
    try:
        import docker
        import docker.errors
    except ImportError:
        raise BackendError("the Docker SDK is missing from this installation of launcher; reinstall it, or: "
                           "pip install 'docker>=7.0'") from None
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise BackendError(f"cannot reach the Docker engine at {where}: {_cause(exc)}; is dockerd running, and "
                           "may this user use it (DOCKER_HOST, the docker group)?") from None
    return client


def _cause(exc: BaseException) -> str:
    """The innermost reason (e.g. 'No such file or directory'), not the SDK's nested retry text."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return str(exc) or type(exc).__name__


def api_error_text(exc: Any) -> str:
    """What the engine said about a refused call (docker.errors.APIError), without the HTTP wrapping."""
    explanation = getattr(exc, "explanation", None)
    return (explanation.decode() if isinstance(explanation, bytes) else explanation) or str(exc)
