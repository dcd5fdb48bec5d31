"""Small helpers for the words launcher prints."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """``1 node``, ``2 nodes``, ``2 training processes``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}{'es' if noun.endswith('s') else 's'}"


def size_text(count: int) -> str:
    """``512 B``, ``12.0 MiB``, ``1.50 GiB``: bytes as a person reads them."""
    if count < 2**20:
        return f"{count} B" if count < 2**10 else f"{count / 2**10:.1f} KiB"
    return f"{count / 2**20:.1f} MiB" if count < 2**30 else f"{count / 2**30:.2f} GiB"


def quoted(text: str, limit: int = 60) -> str:
    """``'abc'``: a value the user gave, quoted as an error message echoes it, cut short past ``limit`` characters
    (a pasted log line or a mistyped path must not fill the terminal): ``'abc…' (412 characters)``."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit] + '…'!r} ({len(text)} characters)"
