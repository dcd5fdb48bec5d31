"""Sets of positions of an epoch's order, as sorted, disjoint ``[start, end)`` intervals: pure, no I/O."""

from __future__ import annotations

from typing import Iterable, Sequence

Interval = tuple[int, int]


def normalize(intervals: Iterable[Sequence[int]]) -> list[Interval]:
    """Sorted, merged where they overlap or touch, empty ones dropped."""
    merged: list[list[int]] = []
    for start, end in sorted((int(s), int(e)) for s, e in intervals if int(e) > int(s)):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def total(intervals: Iterable[Interval]) -> int:
    return sum(end - start for start, end in intervals)


def complement(intervals: list[Interval], size: int) -> list[Interval]:
    """The positions of ``[0, size)`` that ``intervals`` (normalized) do not hold."""
    gaps, cursor = [], 0
    for start, end in intervals:
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < size:
        gaps.append((cursor, size))
    return gaps


def take(intervals: list[Interval], start: int, count: int) -> list[Interval]:
    """Positions ``start .. start+count-1`` of the sequence that ``intervals`` list in order."""
    taken, skip, want = [], start, count
    for low, high in intervals:
        if want <= 0:
            break
        length = high - low
        if skip >= length:
            skip -= length
            continue
        first = low + skip
        last = min(high, first + want)
        taken.append((first, last))
        want -= last - first
        skip = 0
    return taken
