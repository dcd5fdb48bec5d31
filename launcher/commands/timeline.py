"""``launcher timeline RUN [-o FILE] [--json]``: where a run's time went, phase by phase and node by node."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher.commands.inspect import _table
from launcher.errors import EXIT_OK, BackendError, BadInput
from launcher.protocol import events as node_events
from launcher.runs import timeline as tl
from launcher.runs.state import resolve_run
from launcher.wording import plural

PICTURES = (".html", ".htm", ".svg")
RUN_COLUMN = "run"
CAUSE_COLUMN = "CAUSE"


def timeline(run_ref: str | None, *, output: str | None, as_json: bool) -> int:
    if output and Path(output).suffix.lower() not in PICTURES:
        raise BadInput(f"-o {output}: the picture is written as .html or .svg (by the file's name)")
    info = resolve_run(run_ref)
    found = tl.read_timeline(info)
    if as_json:
        json.dump(found.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    if output:
        _write(found, Path(output))
    if not as_json:
        if not found.events:
            print(f"run {info.run_id}: nothing recorded yet")
            return EXIT_OK
        print(f"run {info.run_id}: seconds from submit ({plural(len(found.nodes), 'node')})")
        print(_table(table_rows(found)))
        if output:
            print(f"picture: {output}")
    return EXIT_OK


def _write(found: tl.Timeline, path: Path) -> None:
    from launcher import timeline_svg

    text = timeline_svg.svg(found) if path.suffix.lower() == ".svg" else timeline_svg.html(found, table_rows(found))
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BackendError(f"cannot write {path}: {exc.strerror or exc}") from None


def row_label(found: tl.Timeline, event: tl.Event) -> str:
    """``torchrun started (round 1)``: a row of the table; a replacement's process start says which it is; in a
    run of several attempts, each attempt's rows say which (``torchrun started (attempt 2, round 0)``)."""
    if event.phase in (tl.ATTEMPT, tl.ATTEMPT_ENDED):
        return event.label
    if event.phase == tl.ROUND_DECIDED or (event.phase == tl.ROUND_ENDED and event.node is None):
        label = "ranks decided" if event.round is None else f"round {event.round} {event.label.split()[-1]}"
        in_round = False  # the label names it
    else:
        label = event.label
        if event.phase == node_events.STARTED and event.incarnation:
            label += f" (replacement {event.incarnation})"
        if event.phase == tl.SCALE:  # one row per request
            label += f": {event.detail.split(' (')[0]}"
        in_round = event.round is not None and (event.phase == tl.TRAINING_AGAIN or found.recovering and
                                                event.node is not None and event.phase != tl.RECORDED)
    where = [f"attempt {event.attempt}"] if found.attempts > 1 and event.phase != tl.SUBMITTED else []
    where += [f"round {event.round}"] if in_round else []
    return f"{label} ({', '.join(where)})" if where else label


def table_rows(found: tl.Timeline) -> list[list[str]]:
    """PHASE, run, then one column per node: seconds from submit; then, where the run has a round or an attempt
    that ended, CAUSE: why each ended. A node's first training line is that of its earliest rank, its last line
    that of its latest; other repeated phases in one cell show the first."""
    columns = [RUN_COLUMN, *found.nodes]
    cells: dict[str, dict[str, float]] = {}
    causes: dict[str, str] = {}
    for event in found.events:
        label = row_label(found, event)
        row = cells.setdefault(label, {})
        column = event.node or RUN_COLUMN
        keep_latest = event.phase in tl.LATEST_OF_RANKS
        if column not in row or keep_latest:
            row[column] = event.at
        if event.phase in tl.RUN_ENDS and event.node is None:
            causes.setdefault(label, event.detail)
    ordered = sorted(cells.items(), key=lambda item: min(item[1].values()))
    rows = [["PHASE", *columns, *([CAUSE_COLUMN] if causes else [])]]
    for label, row in ordered:
        rows.append([label, *(f"{found.seconds(row[column]):.2f}" if column in row else "" for column in columns),
                     *([causes.get(label, "")] if causes else [])])
    return rows
