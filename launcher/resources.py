"""Locate the files that ship with the package: schemas, artifacts and templates.

In a wheel they live in ``launcher/_data/``; in a source checkout (editable
install, tests) they are the top-level ``schemas/``, ``artifacts/`` and
``templates/`` directories of the repository.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """Return the directory holding the shipped ``name`` files (schemas, artifacts, templates)."""
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"launcher installation is incomplete: no {name}/ directory next to {_PACKAGE_DIR}")
