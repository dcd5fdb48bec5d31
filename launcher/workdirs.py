"""Work dir URLs: which store a URL names and whether this machine can reach it. No I/O beyond lookups."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

REMOTE_SCHEMES = {"s3": "s3fs", "oci": "ocifs"}


def scheme(url: str) -> str:
    """``file`` for plain paths, else the URL scheme (``s3``, ``oci``, ...)."""
    head, sep, _ = url.partition("://")
    return head if sep else "file"


def resolve_local(url: str, base_dir: Path) -> str:
    """An absolute path for a local work dir given relative to the spec file."""
    path = Path(os.path.expanduser(url.removeprefix("file://")))
    return str(path if path.is_absolute() else (base_dir / path).resolve())


def unusable_reason(url: str) -> str | None:
    """Why ``url`` cannot be used from this machine, or None when it can (as far as we can tell offline)."""
    kind = scheme(url)
    if kind == "file":
        return None
    package = REMOTE_SCHEMES.get(kind)
    if package is None:
        return f"unsupported work dir scheme '{kind}://' (use a directory, s3:// or oci://)"
    if not _installed(package):
        return f"the Python package '{package}' is not installed"
    if kind == "oci":
        from launcher.ociauth import auth_method, config_location

        path, _ = config_location()
        if auth_method() in ("api_key", "security_token") and not Path(path).exists():
            return f"no OCI credentials ({path}) on this machine"
    return None


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken or blocked installation counts as none
        return False
