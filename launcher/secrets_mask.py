"""Mask secret values before anything is printed. Applied to output only, never to what is sent."""

from __future__ import annotations

import re
from typing import Any

MASK = "********"
_SECRET_NAME = re.compile(
    r"(PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|CREDENTIAL|PRIVATE|(^|_)AUTH|(^|_)KEY$|API_?KEY|ACCESS_?KEY)",
    re.IGNORECASE,
)


def looks_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def mask(value: Any) -> Any:
    """A copy of ``value`` in which every mapping entry whose key looks secret has its value masked."""
    if isinstance(value, dict):
        return {k: (MASK if isinstance(k, str) and looks_secret(k) and v not in ("", None) else mask(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [mask(item) for item in value]
    return value
