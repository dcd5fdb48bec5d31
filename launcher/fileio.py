"""Writing user-visible files without ever leaving a half-written one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: str | bytes, mode: int | None = None) -> None:
    """Write via a temporary file in the same directory and rename it into place."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def write_new_file(path: str | os.PathLike, data: str | bytes, *, force: bool, mode: int | None = None) -> bool:
    """Write ``path`` unless it exists and ``force`` is false; return whether it was written."""
    if Path(path).exists() and not force:
        return False
    atomic_write(path, data, mode)
    return True
