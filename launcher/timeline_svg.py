"""A run's timeline as a picture: an SVG drawn by hand, alone or in a self-contained HTML page.

Nodes are lanes over time (seconds from submit); each stretch of a lane is coloured by what the node was
doing (:data:`launcher.runs.timeline.STATES`), and marks show each rank's first training line, deaths,
replacements, nodes joining and leaving, rounds decided and ended, training starting again, scale
requests and cancels. A run retried whole has a band per attempt in its run lane, each attempt's stretches
and marks say which attempt they belong to, and why each round and attempt ended is written under the legend.
Under the lane of a node that wrote a health record, a row of its utilisation (CPU in percent of its cores as an
area, mean GPU utilisation as a line, both 0-100 %) and a row of its ranks' steps/s (a thin line per rank, on one
scale for the whole run), with each sample's figures in the title of its column.
Nothing is fetched: no script, font or style sheet from elsewhere, so the file opens offline in any browser.
Every drawn element carries what it stands for as data attributes (``data-node``, ``data-state`` or
``data-phase``, ``data-t`` seconds, ``data-attempt``), and the root its scale (``data-x0``, ``data-px-per-s``),
so tools and tests can find each one.
"""

from __future__ import annotations

import math
from html import escape
from typing import Iterable

from launcher.protocol import events as node_events
from launcher.runs import timeline as tl
from launcher.runs import timeline_fold as fold
from launcher.runs.timeline_health import Utilisation

PLOT_WIDTH = 1000
LEFT = 180  # room for the lane labels
TOP = 56  # title and time axis
LANE = 26
GAP = 8
UTIL_ROW = 24  # a node's CPU and GPU row under its lane: 0 to 100 %
STEPS_ROW = 18  # its ranks' steps/s row: 0 to the run's fastest rank
ROW_GAP = 2
CPU_COLOUR, GPU_COLOUR, STEPS_COLOUR = "#6baed6", "#d94801", "#444444"
STATE_COLOURS = {
    tl.STARTING: "#a0a0a0", tl.WAITING: "#f1c232", tl.PREPARING: "#b07aa1", tl.LAUNCHING: "#4e79a7",
    tl.TRAINING: "#59a14f", tl.STOPPING: "#9c755f", tl.ENDING: "#e15759", tl.SYNCING: "#76b7b2",
    tl.RECORDING: "#d4a6c8",
}
STATE_WORDS = {
    tl.STARTING: "starting (process to registration)", tl.WAITING: "waiting for the decision",
    tl.PREPARING: "restoring outputs", tl.LAUNCHING: "torchrun to first line",
    tl.TRAINING: "training (first to last line)", tl.STOPPING: "last line to the processes' exit",
    tl.ENDING: "processes' exit to torchrun's",
    tl.SYNCING: "syncing outputs", tl.RECORDING: "recording the end",
}
# marks: phase -> (colour, shape), drawn in the lane of their node, or across every lane for the run's own
MARKS = {
    node_events.FIRST_LINE: ("#1b5e20", "tick"), tl.DEATH: ("#d62728", "cross"),
    node_events.STARTED: ("#222222", "triangle"),  # drawn for replacements (incarnation > 0) only
    tl.JOINS: ("#1f77b4", "diamond"), tl.LEAVE_ASKED: ("#ffbb78", "diamond"), tl.LEAVES: ("#ff7f0e", "diamond"),
    tl.RECORDED: ("#222222", "dot"),
    tl.ROUND_DECIDED: ("#555555", "line"), tl.ROUND_ENDED: ("#d62728", "line"),
    tl.TRAINING_AGAIN: ("#2ca02c", "line"), tl.SCALE: ("#ff7f0e", "line"), tl.CANCELLED: ("#000000", "line"),
    tl.LIMIT_REACHED: ("#000000", "line"), tl.ATTEMPT: ("#9467bd", "line"), tl.ATTEMPT_ENDED: ("#9467bd", "line"),
    tl.SUBMITTED: ("#000000", "line"),
}
MARK_WORDS = {
    node_events.FIRST_LINE: "a rank's first training line", tl.DEATH: "death seen",
    node_events.STARTED: "replacement started", tl.JOINS: "asks to join", tl.LEAVE_ASKED: "asked to leave",
    tl.LEAVES: "leaves (ends its round)",
    tl.RECORDED: "final status recorded", tl.ROUND_DECIDED: "round decided", tl.ROUND_ENDED: "round ended",
    tl.TRAINING_AGAIN: "training again", tl.SCALE: "scale requested", tl.CANCELLED: "cancel requested",
    tl.LIMIT_REACHED: "maxRuntime reached", tl.ATTEMPT: "attempt started", tl.ATTEMPT_ENDED: "attempt ended",
    tl.SUBMITTED: "submitted",
}
HEALTH_WORDS = {"cpu": "CPU, % of the node's cores", "gpu": "mean GPU utilisation, %",
                "steps": "steps/s, a line per rank"}
ATTEMPT_BANDS = ("#ece4f4", "#f7f2fb")  # the run lane's band of each attempt, alternating
NOTE_CHARACTERS = 170  # a note on why a round or an attempt ended is cut to this (its title holds all of it)
FOLD_ROW = 7  # a folded lane's row per state
FOLD_WORDS = "folded: a row per state, median (solid), spread (pale)"


def nice_step(seconds: float) -> float:
    """``seconds`` rounded up to 1, 2, 2.5 or 5 times a power of ten: the axis's tick spacing."""
    if seconds <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(seconds))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= seconds)


def axis(seconds: float) -> tuple[float, float]:
    """(length, tick spacing) of an axis that holds ``seconds``, with about eight ticks."""
    step = nice_step(seconds / 8)
    return max(1, math.ceil(seconds / step - 1e-9)) * step, step


class _Canvas:
    def __init__(self, timeline: tl.Timeline, spans: list[tl.Segment], lanes: fold.Lanes):
        self.timeline = timeline
        self.lanes = lanes
        self.health = [drawn for drawn in timeline.health if drawn.node in lanes.shown]
        ends = ([timeline.seconds(s.end) for s in spans] + [timeline.seconds(e.at) for e in timeline.events]
                + [timeline.seconds(point[0]) for drawn in self.health for point in drawn.points])
        self.span, self.step = axis(max(ends, default=1.0))
        self.scale = PLOT_WIDTH / self.span
        self.fastest = max((value for drawn in self.health for points in drawn.steps_per_s.values()
                            for _, value in points if value is not None), default=0.0)
        self.strip = UTIL_ROW + ROW_GAP + (STEPS_ROW + ROW_GAP if self.fastest > 0 else 0)  # under a lane with health
        self.tops: dict[str, float] = {}
        below = float(TOP)
        for lane in ["run", *lanes.shown]:
            self.tops[lane] = below
            below += LANE + GAP + (self.strip if any(drawn.node == lane for drawn in self.health) else 0)
        for index, folded in enumerate(lanes.folds):
            self.tops[_fold_lane(index)] = below
            below += _fold_height(folded) + GAP
        self.bottom = below - GAP  # of the last lane (and its rows)
        self.states = [state for state in tl.STATES if any(span.state == state for span in spans)]
        self.marks = [phase for phase in MARKS if any(_drawn(event) and self.has_lane(event.node)
                                                        and event.phase == phase for event in timeline.events)]
        self.health_keys = [key for key, drawn in (("cpu", self._measured(1)), ("gpu", self._measured(2)),
                                                   ("steps", self.fastest > 0)) if drawn]  # in the legend
        self.entries = (len(self.states) + len(self.marks) + len(self.health_keys)
                        + (1 if lanes.folded else 0))  # in the legend
        self.ends = [event for event in timeline.events if event.phase in tl.RUN_ENDS and event.node is None]
        self.height = self.bottom + GAP + 40 + 18 * ((self.entries + 2) // 3 + len(self.ends))
        self.parts: list[str] = []
        self.label_ends = [0.0, 0.0]  # where the last word in each of the run lane's two rows ends

    def has_lane(self, node: str | None) -> bool:
        """Whether ``node`` (None: the run) is drawn on a lane of its own, not folded."""
        return node is None or node in self.lanes.shown

    def _measured(self, figure: int) -> bool:
        """Whether any sample of any health record has its figure at ``figure`` of a point (1: CPU, 2: GPU)."""
        return any(point[figure] is not None for drawn in self.health for point in drawn.points)

    def x(self, at: float) -> float:
        return LEFT + self.timeline.seconds(at) * self.scale

    def lane_top(self, node: str | None) -> float:
        return self.tops[node or "run"]

    def add(self, text: str) -> None:
        self.parts.append(text)


def _drawn(event: tl.Event) -> bool:
    """Whether the event has a mark: a process start only for replacements."""
    return event.phase in MARKS and (event.phase != node_events.STARTED or event.incarnation > 0)


def svg(timeline: tl.Timeline, *, standalone: bool = True, all_nodes: bool = False) -> str:
    """The picture; ``standalone``: with the XML namespace, as an .svg file needs; ``all_nodes``: a lane for every
    node however many (else a run of more than :data:`fold.FOLD_ABOVE` is folded)."""
    spans = tl.segments(timeline)
    lanes = fold.lanes(timeline, spans, all_nodes)
    canvas = _Canvas(timeline, spans, lanes)
    width = LEFT + PLOT_WIDTH + 30
    namespace = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    canvas.add(f'<svg{namespace} width="{width}" height="{canvas.height:.0f}" viewBox="0 0 {width} '
               f'{canvas.height:.0f}" font-family="sans-serif" font-size="12" data-x0="{LEFT}" '
               f'data-px-per-s="{canvas.scale:.6f}" data-submitted="{timeline.submitted:.6f}">')
    canvas.add('<rect x="0" y="0" width="100%" height="100%" fill="#ffffff"/>')
    canvas.add(f'<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{escape(timeline.run_id)}: seconds from '
               f'submit{escape(_fold_words(timeline, lanes))}</text>')
    _axis(canvas)
    _lanes(canvas)
    _attempt_bands(canvas, spans)
    for span in spans:
        if canvas.has_lane(span.node):
            _segment(canvas, span)
    for index, folded in enumerate(lanes.folds):
        _fold(canvas, index, folded)
    for node in dict.fromkeys(drawn.node for drawn in canvas.health):
        _health_rows(canvas, node)
    for drawn in canvas.health:
        _health(canvas, drawn)
    for event in timeline.events:
        if canvas.has_lane(event.node):
            _mark(canvas, event)
    _legend(canvas)
    _end_notes(canvas)
    canvas.add("</svg>")
    return "\n".join(canvas.parts) + "\n"


def _fold_words(timeline: tl.Timeline, lanes: fold.Lanes) -> str:
    """What the title adds for a folded run: how many nodes, how many on their own, how many folded."""
    if not lanes.folded:
        return ""
    folded = sum(len(each.nodes) for each in lanes.folds)
    return f" ({len(timeline.nodes):,} nodes: {len(lanes.shown)} on their own, {folded:,} folded)"


def _fold_lane(index: int) -> str:
    return f"fold:{index}"  # no node's name has a colon


def _fold_height(folded: fold.Fold) -> float:
    return max(LANE, FOLD_ROW * len(folded.spreads) + 6)


def _axis(canvas: _Canvas) -> None:
    bottom = canvas.bottom
    for index in range(int(round(canvas.span / canvas.step)) + 1):
        seconds = index * canvas.step
        x = LEFT + seconds * canvas.scale
        canvas.add(f'<line x1="{x:.2f}" y1="{TOP - 6}" x2="{x:.2f}" y2="{bottom:.2f}" stroke="#e6e6e6"/>')
        canvas.add(f'<text x="{x:.2f}" y="{TOP - 10}" text-anchor="middle" fill="#444">{seconds:g}</text>')


def _lanes(canvas: _Canvas) -> None:
    """A lane per node drawn on its own; in a folded run its label says under the name why it is drawn."""
    for node in ["run", *canvas.lanes.shown]:
        top = canvas.lane_top(None if node == "run" else node)
        why = canvas.lanes.shown.get(node, "")
        label = (f'<text x="{LEFT - 8}" y="{top + 11:.2f}" text-anchor="end">{escape(node)}</text>'
                 f'<text x="{LEFT - 8}" y="{top + 22:.2f}" text-anchor="end" font-size="9" fill="#666">'
                 f'{escape(why)}</text>' if why else
                 f'<text x="{LEFT - 8}" y="{top + LANE / 2 + 4:.2f}" text-anchor="end">{escape(node)}</text>')
        canvas.add(f'<g data-lane="{escape(node)}" data-top="{top:.2f}" data-bottom="{top + LANE:.2f}"'
                   + (f' data-why="{escape(why)}"' if why else "") +
                   f'><rect x="{LEFT}" y="{top:.2f}" width="{PLOT_WIDTH}" height="{LANE}" fill="#f7f7f7"/>'
                   f'{label}</g>')


def _fold(canvas: _Canvas, index: int, folded: fold.Fold) -> None:
    """A lane for a fold of nodes: its label counts them and names the first and last (its title every one); a
    row per state, pale from the earliest start to the latest end over the fold's nodes, solid from the median
    start to the median end, its title giving the three figures of each."""
    top = canvas.tops[_fold_lane(index)]
    height = _fold_height(folded)
    count = len(folded.nodes)
    names = fold.named(folded.nodes)
    first_last = folded.nodes[0] if count == 1 else f"{folded.nodes[0]} … {folded.nodes[-1]}"
    said = f"{count:,} {'node' if count == 1 else 'nodes'} folded" + (f" ({folded.why})" if folded.why else "")
    seconds = canvas.timeline.seconds
    canvas.add(f'<g class="fold" data-lane="{_fold_lane(index)}" data-top="{top:.2f}" '
               f'data-bottom="{top + height:.2f}" data-count="{count}" data-why="{escape(folded.why)}" '
               f'data-nodes="{escape(" ".join(folded.nodes))}"><rect x="{LEFT}" y="{top:.2f}" width="{PLOT_WIDTH}" '
               f'height="{height}" fill="#eef1f5"/><text x="{LEFT - 8}" y="{top + 11:.2f}" text-anchor="end">'
               f'{escape(said)}</text><text x="{LEFT - 8}" y="{top + 22:.2f}" text-anchor="end" font-size="9" '
               f'fill="#666">{escape(first_last)}</text>'
               f'<title>{escape(said)}: {escape(names)}</title></g>')
    for row, spread in enumerate(folded.spreads):
        y = top + 3 + row * FOLD_ROW
        colour = STATE_COLOURS[spread.state]
        (first, middle, last), (ended_first, ended_middle, ended_last) = spread.starts, spread.ends
        figures = (f"{STATE_WORDS[spread.state]}: {spread.nodes:,} of {count:,} folded nodes; began "
                   f"{seconds(first):.2f} / {seconds(middle):.2f} / {seconds(last):.2f} s, ended "
                   f"{seconds(ended_first):.2f} / {seconds(ended_middle):.2f} / {seconds(ended_last):.2f} s "
                   "(earliest / median / latest)")
        data = " ".join(f'data-{name}="{seconds(at):.6f}"' for name, at in (
            ("start-min", first), ("start-median", middle), ("start-max", last), ("end-min", ended_first),
            ("end-median", ended_middle), ("end-max", ended_last)))
        x, middle_x = canvas.x(first), canvas.x(middle)
        end_x = max(canvas.x(ended_middle), middle_x + 1)  # a median stretch too short to see: a line
        canvas.add(f'<g class="spread" data-fold="{index}" data-state="{spread.state}" data-nodes="{spread.nodes}" '
                   f'{data}><rect x="{x:.3f}" y="{y:.2f}" width="{canvas.x(ended_last) - x:.3f}" '
                   f'height="{FOLD_ROW - 1}" fill="{colour}" fill-opacity="0.3"/><rect x="{middle_x:.3f}" y="{y:.2f}" '
                   f'width="{end_x - middle_x:.3f}" height="{FOLD_ROW - 1}" fill="{colour}"/>'
                   f'<title>{escape(figures)}</title></g>')


def _attempt_bands(canvas: _Canvas, spans: list[tl.Segment]) -> None:
    """A run retried whole: each attempt's stretch of the run lane, from its start to its last event or the end of
    its last node's stretch."""
    timeline = canvas.timeline
    if timeline.attempts < 2:
        return
    top = canvas.lane_top(None)
    for number in range(1, timeline.attempts + 1):
        start = timeline.submitted if number == 1 else timeline.attempt_started(number)
        if start is None:
            continue
        end = max([start, *(event.at for event in timeline.events if event.attempt == number),
                   *(span.end for span in spans if span.attempt == number)])
        ended = next((f"; ended: {event.detail}" for event in canvas.ends
                      if event.phase == tl.ATTEMPT_ENDED and event.attempt == number), "")
        start_s, end_s = timeline.seconds(start), timeline.seconds(end)
        canvas.add(f'<rect class="attempt" x="{canvas.x(start):.3f}" y="{top:.2f}" '
                   f'width="{canvas.x(end) - canvas.x(start):.3f}" height="{LANE}" '
                   f'fill="{ATTEMPT_BANDS[number % 2]}" data-attempt="{number}" data-t="{start_s:.6f}" '
                   f'data-end="{end_s:.6f}"><title>attempt {number}: {start_s:.2f}-{end_s:.2f} s{escape(ended)}'
                   '</title></rect>')


def _attempt_words(timeline: tl.Timeline, attempt: int) -> str:
    """``attempt 2, `` in a run retried whole, else nothing: what a title says first."""
    return f"attempt {attempt}, " if timeline.attempts > 1 else ""


def _segment(canvas: _Canvas, span: tl.Segment) -> None:
    top = canvas.lane_top(span.node) + 3
    x, end = canvas.x(span.start), canvas.x(span.end)
    start_s, end_s = canvas.timeline.seconds(span.start), canvas.timeline.seconds(span.end)
    replacement = f" (replacement {span.incarnation})" if span.incarnation else ""
    canvas.add(f'<rect class="state" x="{x:.3f}" y="{top:.2f}" width="{end - x:.3f}" height="{LANE - 6}" '
               f'fill="{STATE_COLOURS[span.state]}" data-node="{escape(span.node)}" data-state="{span.state}" '
               f'data-attempt="{span.attempt}" data-t="{start_s:.6f}" data-end="{end_s:.6f}"><title>'
               f'{escape(span.node)}{replacement}: {_attempt_words(canvas.timeline, span.attempt)}'
               f'{STATE_WORDS[span.state]}, {start_s:.2f}-{end_s:.2f} s</title></rect>')


def _rows(canvas: _Canvas, node: str) -> list[tuple[str, float, float]]:
    """(row, top, bottom) of the rows under ``node``'s lane: its utilisation, and its ranks' steps/s where the run
    has any."""
    top = canvas.lane_top(node) + LANE + ROW_GAP
    rows = [("util", top, top + UTIL_ROW)]
    if canvas.fastest > 0:
        rows.append(("steps", top + UTIL_ROW + ROW_GAP, top + UTIL_ROW + ROW_GAP + STEPS_ROW))
    return rows


def _health_rows(canvas: _Canvas, node: str) -> None:
    """The ground and the scale's words of each row under a node's lane; a row's data-top is its full scale's
    height (100 %, the fastest rank), data-bottom its zero."""
    for row, top, bottom in _rows(canvas, node):
        util = "CPU, GPU" if "gpu" in canvas.health_keys else "CPU"
        words = f"{util} 0-100 %" if row == "util" else f"steps/s 0-{canvas.fastest:.3g}"
        canvas.add(f'<g class="health-row" data-node="{escape(node)}" data-row="{row}" data-top="{top:.2f}" '
                   f'data-bottom="{bottom:.2f}"><rect x="{LEFT}" y="{top:.2f}" width="{PLOT_WIDTH}" '
                   f'height="{bottom - top}" fill="#fbfbfb" stroke="#ececec"/><text x="{LEFT - 8}" '
                   f'y="{bottom - 3:.2f}" text-anchor="end" font-size="9" fill="#666">{words}</text></g>')


def _unbroken(points: list[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """``points`` cut where a value is missing: the stretches a line is drawn through."""
    stretches: list[list[tuple[float, float]]] = [[]]
    for at, value in points:
        if value is None:
            stretches.append([])
        else:
            stretches[-1].append((at, value))
    return [stretch for stretch in stretches if stretch]


def _points(canvas: _Canvas, stretch: list[tuple[float, float]], bottom: float, height: float,
            full: float) -> list[tuple[float, float]]:
    """``stretch`` on the picture: time across, ``full`` (clamped) at ``height`` above ``bottom``."""
    return [(canvas.x(at), bottom - min(max(value, 0.0), full) / full * height) for at, value in stretch]


def _listed(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{x:.2f},{y:.2f}" for x, y in (points * 2 if len(points) == 1 else points))  # one: a dot


def _health(canvas: _Canvas, drawn: Utilisation) -> None:
    """One health record under its node's lane: CPU as an area, GPU as a line, a thin line per rank's steps/s (one
    colour for all: the ranks of synchronous training go at one pace, so their lines lie on one another and a rank
    that differs stands apart, where eight colours a node would need a key of their own), then a column per sample
    whose title gives its figures."""
    rows = _rows(canvas, drawn.node)
    _, top, bottom = rows[0]
    data = f'data-node="{escape(drawn.node)}" data-attempt="{drawn.attempt}"'
    for stretch in _unbroken([(at, cpu) for at, cpu, _ in drawn.points]):
        line = _points(canvas, stretch, bottom, UTIL_ROW, 100.0)
        area = [(line[0][0], bottom), *line, (line[-1][0], bottom)]
        canvas.add(f'<polygon class="cpu" {data} points="{_listed(area)}" fill="{CPU_COLOUR}" fill-opacity="0.6" '
                   f'stroke="{CPU_COLOUR}" stroke-linejoin="round"/>')
    for stretch in _unbroken([(at, gpu) for at, _, gpu in drawn.points]):
        canvas.add(f'<polyline class="gpu" {data} points="{_listed(_points(canvas, stretch, bottom, UTIL_ROW, 100.0))}"'
                   f' fill="none" stroke="{GPU_COLOUR}" stroke-width="1.5" stroke-linecap="round"/>')
    if len(rows) > 1:
        _, _, steps_bottom = rows[1]
        for rank, points in sorted(drawn.steps_per_s.items()):
            for stretch in _unbroken(points):
                listed = _listed(_points(canvas, stretch, steps_bottom, STEPS_ROW, canvas.fastest))
                canvas.add(f'<polyline class="steps" {data} data-rank="{rank}" points="{listed}" fill="none" '
                           f'stroke="{STEPS_COLOUR}" stroke-width="1" stroke-opacity="0.6" stroke-linecap="round">'
                           f'<title>{escape(drawn.node)}: rank {rank}, steps/s</title></polyline>')
    _sample_columns(canvas, drawn, top, rows[-1][2])


def _sample_columns(canvas: _Canvas, drawn: Utilisation, top: float, bottom: float) -> None:
    """A column over the rows for each sample, reaching halfway to its neighbours: hovering it names its figures,
    each rank's steps/s included."""
    xs = [canvas.x(at) for at, _, _ in drawn.points]
    by_time = {rank: dict(points) for rank, points in drawn.steps_per_s.items()}
    for index, (at, cpu, gpu) in enumerate(drawn.points):
        left = (xs[index - 1] + xs[index]) / 2 if index else xs[index]
        right = (xs[index] + xs[index + 1]) / 2 if index + 1 < len(xs) else xs[index]
        figures = [f"CPU {cpu:.0f} % of its cores" if cpu is not None else "",
                   f"GPU {gpu:.0f} %" if gpu is not None else ""]
        steps = [f"rank {rank} {by_time[rank][at]:.2f}" for rank in sorted(by_time)
                 if by_time[rank].get(at) is not None]
        said = ", ".join(figure for figure in figures if figure) + (f"; steps/s: {', '.join(steps)}" if steps else "")
        canvas.add(f'<rect class="sample" data-node="{escape(drawn.node)}" data-at="{at:.6f}" x="{left - 1:.2f}" '
                   f'y="{top:.2f}" width="{right - left + 2:.2f}" height="{bottom - top:.2f}" fill="#000000" '
                   f'fill-opacity="0"><title>{escape(drawn.node)}: '
                   f'{_attempt_words(canvas.timeline, drawn.attempt)}{canvas.timeline.seconds(at):.1f} s: '
                   f'{escape(said or "no figures")}</title></rect>')


def _mark(canvas: _Canvas, event: tl.Event) -> None:
    if not _drawn(event):
        return
    colour, shape = MARKS[event.phase]
    x = canvas.x(event.at)
    seconds = canvas.timeline.seconds(event.at)
    where = f"round {event.round}: " if event.round is not None and canvas.timeline.recovering else ""
    if event.phase not in (tl.ATTEMPT, tl.ATTEMPT_ENDED, tl.SUBMITTED):
        where = _attempt_words(canvas.timeline, event.attempt) + where
    rank = f" (rank {event.rank})" if event.rank is not None else ""
    title = escape(f"{event.node or 'run'}: {where}{event.label}{rank} at {seconds:.2f} s"
                   + (f"; {event.detail}" if event.detail else ""))
    data = (f'data-phase="{event.phase}" data-node="{escape(event.node or "")}" data-t="{seconds:.6f}"'
            f' data-attempt="{event.attempt}"'
            + (f' data-round="{event.round}"' if event.round is not None else "")
            + (f' data-rank="{event.rank}"' if event.rank is not None else ""))
    if shape == "line":  # the run's own: across every lane
        top, bottom = TOP - 4, canvas.bottom
        dash = ' stroke-dasharray="4 3"' if event.phase in (tl.ROUND_DECIDED, *tl.RUN_ENDS) else ""
        canvas.add(f'<g class="mark" {data}><line x1="{x:.3f}" y1="{top}" x2="{x:.3f}" y2="{bottom:.2f}" '
                   f'stroke="{colour}" stroke-width="1.5"{dash}/>{_run_label(canvas, event, x)}'
                   f'<title>{title}</title></g>')
        return
    middle = canvas.lane_top(event.node) + LANE / 2
    canvas.add(f'<g class="mark" {data}>{_shape(shape, x, middle, colour)}<title>{title}</title></g>')


def _run_label(canvas: _Canvas, event: tl.Event, x: float) -> str:
    """A short word in the run's lane: r1 for round 1, ✕ for round ends, and so on."""
    words = {tl.ROUND_DECIDED: f"r{event.round}" if event.round is not None else "ranks", tl.SCALE: "scale",
             tl.CANCELLED: "cancel", tl.TRAINING_AGAIN: "again", tl.ATTEMPT: f"attempt {event.attempt}",
             tl.LIMIT_REACHED: "limit", tl.SUBMITTED: "attempt 1" if canvas.timeline.attempts > 1 else ""}
    word = words.get(event.phase)
    if not word:
        return ""
    row = 0 if canvas.label_ends[0] <= x else 1 if canvas.label_ends[1] <= x else 0  # words side by side never overlap
    canvas.label_ends[row] = x + 8 + 6 * len(word)
    return f'<text x="{x + 2:.2f}" y="{canvas.lane_top(None) + 10 + 11 * row:.2f}" font-size="10">{escape(word)}</text>'


def _shape(shape: str, x: float, y: float, colour: str) -> str:
    if shape == "tick":
        return (f'<line x1="{x:.3f}" y1="{y - 11:.2f}" x2="{x:.3f}" y2="{y + 11:.2f}" stroke="{colour}" '
                'stroke-width="2"/>')
    if shape == "cross":
        return (f'<path d="M{x - 6:.2f},{y - 6:.2f} L{x + 6:.2f},{y + 6:.2f} M{x - 6:.2f},{y + 6:.2f} '
                f'L{x + 6:.2f},{y - 6:.2f}" stroke="{colour}" stroke-width="3"/>')
    if shape == "triangle":
        return f'<path d="M{x:.2f},{y - 7:.2f} L{x + 7:.2f},{y + 6:.2f} L{x - 7:.2f},{y + 6:.2f} Z" fill="{colour}"/>'
    if shape == "diamond":
        return f'<path d="M{x:.2f},{y - 7:.2f} L{x + 7:.2f},{y:.2f} L{x:.2f},{y + 7:.2f} L{x - 7:.2f},{y:.2f} Z" ' \
               f'fill="{colour}"/>'
    return f'<circle cx="{x:.3f}" cy="{y:.2f}" r="4" fill="{colour}"/>'


def _legend(canvas: _Canvas) -> None:
    top = canvas.bottom + 28
    entries: list[tuple[str, str]] = [
        (f'<rect width="14" height="10" y="-9" fill="{STATE_COLOURS[state]}"/>', STATE_WORDS[state])
        for state in canvas.states]
    for phase in canvas.marks:
        colour, shape = MARKS[phase]
        drawn = (f'<line x1="7" y1="-12" x2="7" y2="3" stroke="{colour}" stroke-width="1.5"/>' if shape == "line"
                 else _shape(shape, 7, -4, colour))
        entries.append((drawn, MARK_WORDS[phase]))
    for key in canvas.health_keys:
        drawn = (f'<rect width="14" height="10" y="-9" fill="{CPU_COLOUR}" fill-opacity="0.6"/>' if key == "cpu" else
                 f'<line x1="0" y1="-4" x2="14" y2="-4" stroke="{GPU_COLOUR if key == "gpu" else STEPS_COLOUR}" '
                 'stroke-width="1.5"/>')
        entries.append((drawn, HEALTH_WORDS[key]))
    if canvas.lanes.folded:
        entries.append((f'<rect width="14" height="6" y="-7" fill="{STATE_COLOURS[tl.TRAINING]}" fill-opacity="0.3"/>'
                        f'<rect x="4" width="6" height="6" y="-7" fill="{STATE_COLOURS[tl.TRAINING]}"/>', FOLD_WORDS))
    for index, (drawn, words) in enumerate(entries):
        x, y = LEFT + (index % 3) * 330, top + (index // 3) * 18
        canvas.add(f'<g class="legend" transform="translate({x},{y:.2f})">{drawn}'
                   f'<text x="20" y="0">{escape(words)}</text></g>')


def _end_notes(canvas: _Canvas) -> None:
    """Under the legend, a line for each round and attempt that ended: when, and why."""
    top = canvas.bottom + 28 + 18 * ((canvas.entries + 2) // 3)
    for index, event in enumerate(canvas.ends):
        if event.phase == tl.ATTEMPT_ENDED:
            which = f"attempt {event.attempt}"
        else:
            which = f"round {event.round}" + (f" of attempt {event.attempt}" if canvas.timeline.attempts > 1 else "")
        note = f"{which} ended at {canvas.timeline.seconds(event.at):.2f} s: {event.detail}"
        shown = _shortened(note)
        canvas.add(f'<text class="end" x="{LEFT}" y="{top + index * 18:.2f}" data-ended="{event.phase}" '
                   f'data-attempt="{event.attempt}"' + (f' data-round="{event.round}"' if event.round is not None
                                                        else "") +
                   f'>{escape(shown)}<title>{escape(note)}</title></text>')


def _shortened(note: str) -> str:
    """``note`` cut to NOTE_CHARACTERS in its middle, keeping its last clause (``; retried as attempt 2 ...``):
    what came of the end."""
    if len(note) <= NOTE_CHARACTERS:
        return note
    tail = note[note.rfind("; "):][-(NOTE_CHARACTERS // 2):] if "; " in note else ""
    return note[:NOTE_CHARACTERS - len(tail) - 1] + "…" + tail


def html(timeline: tl.Timeline, table: Iterable[list[str]], all_nodes: bool = False) -> str:
    """A self-contained page: the picture, then the table of phases (the rows of ``launcher timeline``)."""
    rows = list(table)
    head = "".join(f"<th>{escape(cell)}</th>" for cell in rows[0]) if rows else ""
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows[1:])
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>timeline of {escape(timeline.run_id)}</title><style>"
            "body{font-family:sans-serif;margin:16px;color:#222}"
            "table{border-collapse:collapse;margin-top:16px;font-size:13px}"
            "td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}td:first-child,th:first-child"
            "{text-align:left}</style></head><body>\n"
            f"{svg(timeline, standalone=False, all_nodes=all_nodes)}"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n"
            "</body></html>\n")
