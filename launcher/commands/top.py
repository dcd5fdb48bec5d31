"""``launcher top``: every node's and rank's latest figures (CPU, memory, GPUs, steps/s, last line's age), refreshed
until the run ends; the slowest rank and the stragglers marked."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from datetime import datetime
from typing import TextIO

from launcher.backends import backend_for
from launcher.columns import Column, fit
from launcher.commands.inspect import _age
from launcher.errors import EXIT_OK
from launcher.protocol.health import SAMPLE_SECONDS
from launcher.protocol.status import FINAL_STATES
from launcher.runs.health import HealthReader, NodeHealth, RankHealth, RunHealth, step_time
from launcher.runs.attempts import current_url
from launcher.runs.rounds import rounds_text, run_rounds
from launcher.runs.state import reread, resolve_run
from launcher.runs.view import RunView, open_run, read_view
from launcher.wording import size_text

REFRESH_SECONDS = 2.0
REDRAW = "\x1b[H\x1b[J"  # cursor home, clear to the end of the screen
# The columns, in the order shown; where the terminal is narrow, long cells are cut first, then whole columns left
# out, the highest ``keep`` first: the node or rank, its state, steps/s and the note (the slowest and straggler
# marks, a node's sample's age) last of all (launcher.columns).
COLUMNS = [Column("NODE / RANK", last=10, middle=True), Column("STATE"), Column("CPU", keep=1),
           Column("MEMORY", keep=4, least=10), Column("GPU", keep=2, least=4), Column("GPU MEMORY", keep=7, least=10),
           Column("STEPS/S"), Column("SAMPLES/S", keep=5), Column("WORK/STEP", keep=3), Column("DATA WAIT", keep=6),
           Column("LAST LINE", keep=8), Column("NOTE", least=19, last=8)]
HEADER = [column.name for column in COLUMNS]
GPU_COLUMNS = ("GPU", "GPU MEMORY")  # shown only where some node has GPUs


def _number(value: object, form: str, suffix: str = "") -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:{form}}{suffix}"


def _size(value: object) -> str:
    return size_text(int(value)) if isinstance(value, (int, float)) else "-"


def _share(part: object, whole: object) -> str:
    """``30/80 GiB``: two sizes in one short cell."""
    if not (isinstance(part, (int, float)) and isinstance(whole, (int, float))):
        return "-"
    return f"{part / 2**30:.3g}/{whole / 2**30:.3g} GiB"


def _gpu_memory(gpu: dict) -> str:
    return _share(gpu.get("mem_used_bytes"), gpu.get("mem_total_bytes"))


def _node_row(node: NodeHealth) -> list[str]:
    machine = _share(node.figure("mem_available_bytes"), node.figure("mem_total_bytes"))
    machine = "" if machine == "-" else f" ({machine} free)"
    gpus = node.gpus
    note = _sampled(node) or ("started again, not sampled yet" if node.restarted and node.state not in FINAL_STATES
                              else "")
    return [node.node, node.state, _number(node.figure("cpu_percent"), ".0f", "%"),
            _size(node.figure("rss_bytes")) + machine if node.sample else "-",
            " ".join(_number(gpu.get("util_percent"), ".0f", "%") for gpu in gpus) or "-",
            " ".join(_gpu_memory(gpu) for gpu in gpus) or "-", "", "", "", "", "", note]


def _sampled(node: NodeHealth) -> str:
    """How fresh a training node's figures are; an ended node's last sample is as old as its end, not growing."""
    if node.sample is None:
        return ""
    return "last sample" if node.state in FINAL_STATES else f"sampled {_age(node.figure('at'))}"


def _rank_row(rank: RankHealth, health: RunHealth) -> list[str]:
    work = rank.figure("work_per_step_s")
    # an ended rank's rates are those of whatever interval its node sampled last: not shown as its pace
    rate = rank.figure if rank.training else (lambda _name: None)
    said = next((f"straggler: {s.suggests}" for s in health.stragglers if s.rank == rank.rank), "")
    note = ", ".join(part for part in ("slowest" if rank.rank == health.slowest else "", said) if part)
    return [f"  rank {rank.rank}", rank.state, _number(rank.figure("cpu_percent"), ".0f", "%"),
            _size(rank.figure("rss_bytes")), _number(rank.gpu_util, ".0f", "%"),
            "-" if rank.gpu is None else _gpu_memory(rank.gpu), _number(rate("steps_per_s"), ".2f"),
            _number(rate("samples_per_s"), ".1f"), "-" if work is None or not rank.training else step_time(work),
            _number(rank.figure("data_wait_fraction"), ".0%"), _age(rank.figure("last_line_at")), note]


def rows(health: RunHealth) -> list[list[str]]:
    """The table, every column: the header, then each node and its ranks."""
    table = [HEADER]
    for node in health.nodes:
        table.append(_node_row(node))
        table.extend(_rank_row(rank, health) for rank in health.ranks if rank.node == node.node)
    return table


def width() -> int:
    """The terminal's width: ``COLUMNS`` where set, else the terminal's that stdout is, else 80."""
    return shutil.get_terminal_size().columns


def _wrapped(text: str, columns: int | None) -> list[str]:
    """A line of text in lines of at most ``columns`` characters (the next ones indented); None: as it is."""
    if columns is None or len(text) <= columns:
        return [text]
    return textwrap.wrap(text, columns, subsequent_indent="  ", break_on_hyphens=False) or [text[:columns]]


def hidden_line(hidden: list[str], cut: list[str], columns: int) -> str:
    """What the fitted table leaves out and how to see it: ``hidden to fit 80 columns: LAST LINE; --wide shows
    every column``."""
    parts = [f"hidden to fit {columns} columns: {', '.join(hidden)}"] if hidden else []
    if cut:
        parts.append(f"cut: {', '.join(cut)}" if hidden else f"cut to fit {columns} columns: {', '.join(cut)}")
    return "; ".join(parts + ["--wide shows every column whole"])


def render(view: RunView, health: RunHealth, *, columns: int | None = None, rounds: dict | None = None) -> str:
    """One refresh: the run's state (and round) and when, then the table (or why there is none), the stragglers and
    what the table leaves out to fit ``columns`` characters (None: every column whole, however wide)."""
    state = f"{view.result} ({rounds_text(rounds)})" if rounds else view.result
    said = _wrapped(f"run {view.info.run_id} ({view.info.backend}): {state}, {datetime.now():%H:%M:%S}", columns)
    if not health.sampled:
        why = "its nodes recorded no figures" if view.ended else \
            f"no figures yet: nodes sample every {SAMPLE_SECONDS:g} s by default"
        return "\n".join([*said, *_wrapped(why, columns)]) + "\n"
    table = rows(health)
    if not any(node.gpus for node in health.nodes):  # a machine without GPUs: no columns of "-"
        kept = [index for index, name in enumerate(HEADER) if name not in GPU_COLUMNS]
        table = [[row[index] for index in kept] for row in table]
    fitted = fit([column for column in COLUMNS if column.name in table[0]], table[1:], columns)
    lines = [*said, *fitted.lines, *(line for s in health.stragglers for line in _wrapped(s.line(), columns))]
    if columns is not None and (fitted.hidden or fitted.cut):
        lines += _wrapped(hidden_line(fitted.hidden, fitted.cut, columns), columns)
    return "\n".join(lines) + "\n"


def top(ref: str | None, *, once: bool, wide: bool = False, out: TextIO = sys.stdout) -> int:
    """Show the table every :data:`REFRESH_SECONDS` (in place on a terminal) until the run ends; ``once``: one table.
    Each table fits the terminal's width (:func:`width`), but with ``wide``, which shows every column whole.
    Returns 0 for ``once``, else the run's exit status, as ``watch`` does."""
    info = resolve_run(ref)
    backend = backend_for(info.backend, "local")
    run = open_run(info)
    reader = HealthReader()
    in_place = out.isatty() and not once
    while True:
        info = reread(info)  # `launcher scale` may have added nodes, a whole-run retry begun a new attempt
        if run.url != current_url(info):
            run = open_run(info)
        view = read_view(info, run, backend)
        shown = render(view, reader.read(view, run), columns=None if wide else width(), rounds=run_rounds(info))
        if in_place:
            shown = REDRAW + shown
        out.write(shown)
        out.flush()
        if once:
            return EXIT_OK
        if view.ended:
            return view.exit_status()
        time.sleep(REFRESH_SECONDS)
        if not in_place:
            out.write("\n")
