"""``launcher top``: every node's and rank's latest figures (CPU, memory, GPUs, steps/s, last line's age), refreshed
until the run ends; the slowest rank and the stragglers marked."""

from __future__ import annotations

import shutil
import sys
import time
from datetime import datetime
from typing import TextIO

from launcher.backends import backend_for
from launcher.commands.inspect import _age, _table
from launcher.errors import EXIT_OK
from launcher.protocol.health import SAMPLE_SECONDS
from launcher.protocol.status import FINAL_STATES
from launcher.runs.health import HealthReader, NodeHealth, RankHealth, RunHealth, step_time
from launcher.runs.attempts import current_url
from launcher.runs.state import reread, resolve_run
from launcher.runs.view import RunView, open_run, read_view
from launcher.wording import size_text

REFRESH_SECONDS = 2.0
REDRAW = "\x1b[H\x1b[J"  # cursor home, clear to the end of the screen
HEADER = ["NODE / RANK", "STATE", "CPU", "MEMORY", "GPU", "GPU MEMORY", "STEPS/S", "SAMPLES/S", "WORK/STEP",
          "DATA WAIT", "LAST LINE", "NOTE"]


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
    return [node.node, node.state, _number(node.figure("cpu_percent"), ".0f", "%"),
            _size(node.figure("rss_bytes")) + machine if node.sample else "-",
            " ".join(_number(gpu.get("util_percent"), ".0f", "%") for gpu in gpus) or "-",
            " ".join(_gpu_memory(gpu) for gpu in gpus) or "-", "", "", "", "",
            _sampled(node), ""]


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
    """The table: each node, then its ranks."""
    table = [HEADER]
    for node in health.nodes:
        table.append(_node_row(node))
        table.extend(_rank_row(rank, health) for rank in health.ranks if rank.node == node.node)
    return table


def render(view: RunView, health: RunHealth) -> str:
    """One refresh: the run's state and when, then the table (or why there is none) and the stragglers."""
    said = f"run {view.info.run_id} ({view.info.backend}): {view.result}, {datetime.now():%H:%M:%S}"
    if not health.sampled:
        why = "its nodes recorded no figures" if view.ended else \
            f"no figures yet: nodes sample every {SAMPLE_SECONDS:g} s by default"
        return f"{said}\n{why}\n"
    return "\n".join([said, _table(rows(health)), *(s.line() for s in health.stragglers)]) + "\n"


def top(ref: str | None, *, once: bool, out: TextIO = sys.stdout) -> int:
    """Show the table every :data:`REFRESH_SECONDS` (in place on a terminal) until the run ends; ``once``: one table.
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
        shown = render(view, reader.read(view, run))
        if in_place:  # a redrawn screen must not wrap: each line is cut at the terminal's width
            width = shutil.get_terminal_size().columns
            shown = REDRAW + "".join(line[:width] + "\n" for line in shown.splitlines())
        out.write(shown)
        out.flush()
        if once:
            return EXIT_OK
        if view.ended:
            return view.exit_status()
        time.sleep(REFRESH_SECONDS)
        if not in_place:
            out.write("\n")
