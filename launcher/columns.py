"""A table fitted to a terminal's width: long cells cut with an ellipsis, then whole columns left out by priority,
the key columns kept to the last; lines no longer than the width, whatever it is.

How a table of ``columns`` is fitted to ``width`` (:func:`fit`):

1. As it is, where it fits.
2. Every column cut to its ``least`` width (a column without one is not cut), where that fits: text is cut
   before any column is left out. The room left goes back to the cut columns, the most important first.
3. Else the key columns (``keep`` 0), cut so, and of the others as many as fit at their ``least`` widths, the
   most important (lowest ``keep``) first; a column that does not fit is left out, a less important and
   narrower one may still fit after it. The room left goes back to the cut columns, as in 2.
4. Where even the key columns do not fit: they are cut further, to their ``last`` widths, the least important
   first; and, on a terminal narrower than that, each line is cut at the width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GAP = 2  # spaces between two columns
ELLIPSIS = "…"


@dataclass(frozen=True)
class Column:
    name: str  # its header
    keep: int = 0  # 0: a key column, left out never; others: the higher, the sooner it is left out
    least: int | None = None  # the width it is cut to (with an ellipsis) before a column is left out; None: not cut
    last: int | None = None  # a key column: the width it is cut to where the key columns alone do not fit
    middle: bool = False  # cut in the middle (names, whose ends tell them apart), not at the end


@dataclass
class Fitted:
    lines: list[str]
    hidden: list[str] = field(default_factory=list)  # the columns left out
    cut: list[str] = field(default_factory=list)  # the columns some of whose cells were cut


def cut(text: str, width: int, *, middle: bool = False) -> str:
    """``text`` in at most ``width`` characters: cut with an ellipsis (in the middle where ``middle``)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    if middle:
        tail = (width - 1) // 2
        return text[:width - 1 - tail] + ELLIPSIS + (text[-tail:] if tail else "")
    return text[:width - 1].rstrip() + ELLIPSIS


def fit(columns: list[Column], rows: list[list[str]], width: int | None) -> Fitted:
    """``rows`` (each a cell per column; the header row is made of the columns' names) as lines of at most
    ``width`` characters; ``width`` None: every column whole, however wide."""
    table = [[column.name for column in columns], *rows]
    natural = [max(len(row[index]) for row in table) for index in range(len(columns))]
    if width is None or _total(natural, range(len(columns))) <= width:
        return Fitted(_lines(columns, table, range(len(columns)), natural))
    least = [min(natural[index], column.least) if column.least is not None else natural[index]
             for index, column in enumerate(columns)]
    by_priority = sorted(range(len(columns)), key=lambda index: (columns[index].keep, index))
    shown = [index for index in by_priority if columns[index].keep == 0]
    for index in by_priority:
        if columns[index].keep and _total(least, [*shown, index]) <= width:
            shown.append(index)
    widths = list(least)
    if _total(widths, shown) > width:  # the key columns alone do not fit: cut them further, the least important first
        for index in reversed(shown):
            if columns[index].last is not None:
                over = _total(widths, shown) - width
                widths[index] = max(min(widths[index], columns[index].last), widths[index] - over)
    room = width - _total(widths, shown)
    for index in shown:  # the room left goes back to the cut columns, the most important first
        given = min(room, natural[index] - widths[index]) if room > 0 else 0
        widths[index] += given
        room -= given
    shown.sort()
    lines = [line[:width] for line in _lines(columns, table, shown, widths)]
    return Fitted(lines, [column.name for index, column in enumerate(columns) if index not in shown],
                  [columns[index].name for index in shown if widths[index] < natural[index]])


def _total(widths: list[int], shown) -> int:
    shown = list(shown)
    return sum(widths[index] for index in shown) + GAP * max(0, len(shown) - 1)


def _lines(columns: list[Column], table: list[list[str]], shown, widths: list[int]) -> list[str]:
    shown = sorted(shown)
    return [(" " * GAP).join(cut(row[index], widths[index], middle=columns[index].middle).ljust(widths[index])
                             for index in shown).rstrip() for row in table]
