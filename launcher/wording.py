"""Small helpers for the words launcher prints."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """``1 node``, ``2 nodes``, ``2 training processes``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}{'es' if noun.endswith('s') else 's'}"
