"""``launcher timeline RUN [-o FILE] [--json]``: where a run's time went, phase by phase and node by node."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import median

from launcher.commands.inspect import _table
from launcher.errors import EXIT_OK, BackendError, BadInput
from launcher.protocol import events as node_events
from launcher.runs import incidents
from launcher.runs import recoveries as rec
from launcher.runs import timeline as tl
from launcher.runs import timeline_fold as fold
from launcher.runs.state import resolve_run
from launcher.runs.view import read_view
from launcher.wording import plural

PICTURES = (".html", ".htm", ".svg")
RUN_COLUMN = "run"
CAUSE_COLUMN = "CAUSE"
SUMMARY_COLUMNS = ["NODES", "MIN", "MEDIAN", "MAX"]  # a folded table's, over every node


def timeline(run_ref: str | None, *, output: str | None, as_json: bool, all_nodes: bool = False) -> int:
    if output and Path(output).suffix.lower() not in PICTURES:
        raise BadInput(f"-o {output}: the picture is written as .html or .svg (by the file's name)")
    info = resolve_run(run_ref)
    found = tl.read_timeline(info)
    recovered = rec.recoveries(found)
    costs = incidents.read(info, read_view(info), found) if found.events else None
    if as_json:
        json.dump({**found.to_dict(), "recoveries": [each.to_dict() for each in recovered],
                   "costs": costs.to_dict() if costs else None}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    if output:
        _write(found, Path(output), all_nodes)
    if not as_json:
        if not found.events:
            print(f"run {info.run_id}: nothing recorded yet")
            return EXIT_OK
        print(f"run {info.run_id}: seconds from submit ({plural(len(found.nodes), 'node')})")
        lanes = _lanes(found, all_nodes)
        print(_table(table_rows(found, lanes)))
        if lanes.folded:
            print(fold_note(found, lanes))
        for each in recovered:
            print(f"\n{breakdown(found, each)}")
        if costs and costs.start_s is not None:
            print(f"\nwhat failures cost: {costs.line()}")
            print("".join(f"  {incident.line()}\n" for incident in costs.incidents), end="")
        if output:
            print(f"picture: {output}")
    return EXIT_OK


def _write(found: tl.Timeline, path: Path, all_nodes: bool) -> None:
    from launcher import timeline_svg

    text = (timeline_svg.svg(found, all_nodes=all_nodes) if path.suffix.lower() == ".svg"
            else timeline_svg.html(found, table_rows(found, _lanes(found, all_nodes)), all_nodes))
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
        in_round = event.round is not None and (event.phase in (tl.TRAINING_AGAIN, tl.RUN_STOPPED) or found.recovering and
                                                event.node is not None and event.phase != tl.RECORDED)
    where = [f"attempt {event.attempt}"] if found.attempts > 1 and event.phase != tl.SUBMITTED else []
    where += [f"round {event.round}"] if in_round else []
    return f"{label} ({', '.join(where)})" if where else label


def _lanes(found: tl.Timeline, all_nodes: bool) -> fold.Lanes:
    """The nodes the table shows on their own; its states are only computed for a run large enough to fold."""
    if all_nodes or len(found.nodes) <= fold.FOLD_ABOVE:
        return fold.lanes(found, [], all_nodes)
    return fold.lanes(found, tl.segments(found))


def table_rows(found: tl.Timeline, lanes: fold.Lanes | None = None) -> list[list[str]]:
    """PHASE, run, then one column per node: seconds from submit; then, where the run has a round or an attempt
    that ended, CAUSE: why each ended. A node's first training line is that of its earliest rank, its last line
    that of its latest; other repeated phases in one cell show the first. Rows are in the order of their median
    time. A folded run (``lanes``) has, between
    the run's column and the nodes shown on their own, how many nodes had the phase and its earliest, median and
    latest time over them all."""
    shown = list(lanes.shown) if lanes else found.nodes
    summed = bool(lanes and lanes.folded)
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
    # by each row's middle time: by its earliest, one early cell (a node lost long before the others recorded their
    # end) put a row of late times above rows that came before them
    ordered = sorted(cells.items(), key=lambda item: median(item[1].values()))
    rows = [["PHASE", RUN_COLUMN, *(SUMMARY_COLUMNS if summed else []), *shown, *([CAUSE_COLUMN] if causes else [])]]
    for label, row in ordered:
        rows.append([label, *_cells(found, row, [RUN_COLUMN]), *(_summary(found, row) if summed else []),
                     *_cells(found, row, shown), *([causes.get(label, "")] if causes else [])])
    return rows


def _cells(found: tl.Timeline, row: dict[str, float], columns: list[str]) -> list[str]:
    return [f"{found.seconds(row[column]):.2f}" if column in row else "" for column in columns]


def _summary(found: tl.Timeline, row: dict[str, float]) -> list[str]:
    """A phase over every node that had it: how many, the earliest, median and latest time."""
    times = sorted(at for column, at in row.items() if column != RUN_COLUMN)
    if not times:  # the run's own
        return ["", "", "", ""]
    return [str(len(times)), *(f"{found.seconds(at):.2f}" for at in (times[0], median(times), times[-1]))]


def fold_note(found: tl.Timeline, lanes: fold.Lanes) -> str:
    """Under a folded table: the nodes it shows and why, and that the rest are in the summary columns."""
    shown = ", ".join(f"{node} ({why})" for node, why in lanes.shown.items())
    folded = sum(len(each.nodes) for each in lanes.folds)
    return (f"{len(found.nodes):,} nodes: NODES, MIN, MEDIAN and MAX are over every node; shown on their own: {shown}; "
            f"{folded:,} more not shown (--all-nodes shows every node)")


def breakdown(found: tl.Timeline, recovery: rec.Recovery) -> str:
    """Where one recovery's seconds went: each phase after the round before ended, the seconds since the phase
    before, and the member the round waited for (the last to get there)."""
    where = f"attempt {recovery.attempt}, " if found.attempts > 1 else ""
    ended = recovery.ended
    since = f" at {found.seconds(ended):.2f} s" if ended is not None else ""
    lines = [f"recovery ({where}round {recovery.round}): {recovery.ended_label}{since}, {recovery.cause}"]
    rows = [["PHASE", "AFTER", "STEP", "WAITED FOR"]]
    previous = ended
    for phase in recovery.phases[1:]:
        after = recovery.after(phase.at)
        step = None if phase.at is None or previous is None else phase.at - previous
        who = phase.node or ""
        if phase.name == rec.TORCHRUN and phase.node:
            who += " (cold: no spare)" if phase.node in recovery.cold else " (a spare)"
        rows.append([phase.label, "-" if after is None else f"+{after:.2f}", "-" if step is None else f"{step:.2f}",
                     who])
        previous = phase.at if phase.at is not None else previous
    lines.append(_table(rows))
    own_end = next((event for event in found.events if event.phase == tl.ROUND_ENDED and event.node is None
                    and event.round == recovery.round and event.attempt == recovery.attempt), None)
    if recovery.phase(rec.FIRST_STEP).at is None and own_end is not None:
        lines.append(f"the round ended at +{recovery.after(own_end.at):.2f} ({own_end.detail}) before every rank "
                     "counted a step")
    elif recovery.phase(rec.FIRST_STEP).at is None:
        first = recovery.after(recovery.first_line)
        lines.append("no first step counted (the script neither steps a torch.optim optimizer, iterates a DataLoader "
                     "nor calls launcher.data.report)" + (f"; first training line +{first:.2f}" if first is not None
                                                          else ""))
    return "\n".join("  " + line if index else line for index, line in enumerate("\n".join(lines).splitlines()))
