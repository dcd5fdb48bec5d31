"""``launcher status``, ``show-config`` and ``list``: read-only views of runs."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from launcher.errors import EXIT_OK, LauncherError
from launcher.gpus import describe
from launcher.protocol.rounds import grouped_history
from launcher.runs import attempts
from launcher.runs.health import HealthReader, RunHealth, status_figures
from launcher.runs.preflight import quick_work_dir
from launcher.runs.rounds import run_rounds
from launcher.runs.state import RunInfo, all_runs, resolve_run
from launcher.runs.view import RunView, closing_line, not_recorded_note, open_run, read_view, record_lost
from launcher.wording import plural

MAX_CONCURRENT_READS = 16


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _age(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    seconds = max(0, int(time.time() - timestamp))
    return f"{seconds}s ago" if seconds < 120 else f"{seconds // 60}m ago" if seconds < 7200 else \
        f"{seconds // 3600}h ago"


def _devices(accelerators: dict | None) -> str:
    if not accelerators:
        return "-"
    return f"{accelerators['count']} GPU" if accelerators.get("count") else "CPU"


def _address(record: dict) -> str:
    """The address a node advertised, with the interface that holds it where the node named one."""
    address = record.get("address") or "-"
    return f"{address} ({record['interface']})" if record.get("interface") else address


def _data(info: RunInfo) -> dict | None:
    """The newest epoch's progress of launcher.data.ElasticSampler, for a run that uses it."""
    from launcher.data.progress import read_progress

    latest = read_progress(open_run(info), latest_only=True)
    return latest[-1].as_dict() if latest else None


def _recoveries(info: RunInfo) -> list[dict]:
    """Where each recovery's seconds went (launcher.runs.recoveries), for a run that trained in rounds."""
    from launcher.runs import recoveries

    return [each.to_dict() for each in recoveries.read(info)]


def _costs(info: RunInfo, view: RunView):
    """What the run's incidents cost and its ETTR (launcher.runs.incidents)."""
    from launcher.runs import incidents

    return incidents.read(info, view)


def _record(view: RunView, node: str, health: RunHealth) -> dict | None:
    """The node's status record, with its rank now (none once it has left) and its latest figures."""
    record = view.statuses.get(node)
    return None if record is None else {**record, "rank": view.rank_of(node), **health.node(node).as_dict()}


def status(ref: str | None, *, as_json: bool) -> int:
    info = resolve_run(ref)
    view = read_view(info)
    run = open_run(info)
    if view.lost:
        refused = record_lost(view, run)
        if refused:
            print(not_recorded_note(refused), file=sys.stderr)
    rounds = run_rounds(info)
    data = _data(info)
    health = HealthReader().read(view, run)
    costs = _costs(info, view) if view.decision else None
    if as_json:
        json.dump({"run_id": info.run_id, "backend": info.backend, "recorded_here": info.recorded,
                   "result": view.result, "submission_error": info.submission_error or None,
                   "attempts": [asdict(attempt) for attempt in view.attempts],
                   "rounds": rounds, "recoveries": _recoveries(info) if rounds else [],
                   "costs": costs.to_dict() if costs else None, "data": data,
                   "work_dir": info.run_url, "nodes": {n: _record(view, n, health) for n in info.nodes},
                   **status_figures(health),
                   "lost": view.lost, "failures": view.failures, "first_failure": view.root_failure(),
                   "stopped_because_of_it": view.victims()},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        rows = [["NODE", "RANK", "STATE", "EXIT", "ADDRESS", "DEVICES", "UPDATED", "REASON"]]
        for name in info.nodes:
            record = view.shown_status(name)
            rank = view.rank_of(name)
            rows.append([name, "-" if rank is None else str(rank), record["state"],
                         "-" if record.get("exit_code") is None else str(record["exit_code"]),
                         _address(record), _devices(record.get("accelerators")),
                         _age(record.get("updated_at")), record.get("reason") or ""])
        origin = "" if info.recorded else "; not recorded here: its work dir's view"
        print(f"run {info.run_id} ({info.backend}{origin}): {view.result}")
        from launcher.backends import backend_for

        engine = backend_for(info.backend, "local").engine_state(info) if info.recorded else None
        if engine:
            print(engine)
        if not view.ended:  # once it has, the closing line says how each attempt ended
            print("".join(f"  {line}\n" for line in attempts.history(info, view.attempts)), end="")
        if rounds:
            history = "".join(f"\n  {line}" for line in grouped_history(rounds["history"]))
            members = f"members {', '.join(rounds['members'])}" if rounds["members"] else "not started: the run stopped"
            print(f"round {rounds['round']}: {members}; {plural(rounds['restarts'], 'restart')}{history}")
        if costs and costs.start_s is not None:
            print(costs.line())
        if data:
            print(f"data: epoch {data['epoch']}: {data['done']} of {data['shards']} shards done, "
                  f"{data['in_flight']} in flight, {data['left']} left (launcher data {info.run_id})")
        print(_table(rows))
        for straggler in health.stragglers:
            print(straggler.line())
        for name in info.nodes:
            accelerators = view.statuses.get(name, {}).get("accelerators") or {}
            if accelerators.get("count"):
                print(f"{name}: {describe(accelerators)}")
        if view.ended:
            print(closing_line(view))
    return view.exit_status()


def show_config(ref: str | None) -> int:
    info = resolve_run(ref)
    view = read_view(info)
    if not view.decision:
        print(f"run {info.run_id}: the nodes have not elected a main yet ({view.result})")
        return EXIT_OK
    decision = view.decision
    print(f"run:          {info.run_id}")
    print(f"main node:    {decision['main']}")
    print(f"MASTER_ADDR:  {decision['master_addr']}")
    print(f"MASTER_PORT:  {decision['master_port']}")
    if "round" in decision:
        print(f"round:        {decision['round']} (a recovering run; `status` says why earlier rounds ended)")
    if decision["ranks"]:
        nodes = len(decision["ranks"])
        print(f"NNODES:       {nodes}")
        processes = decision.get("processes_per_node", info.processes_per_node)
        print(f"WORLD_SIZE:   {nodes * processes} ({plural(processes, 'process')} per node)")
        print("node ranks:")
        for name, rank in sorted(decision["ranks"].items(), key=lambda item: item[1]):
            print(f"  {rank:>4}  {name}")
    return EXIT_OK


def _result(info: RunInfo) -> str:
    try:  # the quick bounds: one run's unreachable store must not hold up the others for minutes
        return read_view(info, quick_work_dir(attempts.current_url(info))).result
    except LauncherError as exc:  # an unreachable work dir must not hide the other runs
        return f"unknown ({exc})"


def list_runs(limit: int) -> int:
    runs = all_runs()[:limit]
    if not runs:
        print("no runs yet; start one with: launcher run -f train.yaml")
        return EXIT_OK
    rows = [["RUN", "BACKEND", "NODES", "CREATED", "RESULT"]]
    # Read at once: runs whose store is down then cost one store timeout in all, not one each.
    with ThreadPoolExecutor(max_workers=min(len(runs), MAX_CONCURRENT_READS)) as pool:
        results = list(pool.map(_result, runs))
    for info, result in zip(runs, results):
        rows.append([info.run_id, info.backend, str(len(info.nodes)), _age(info.created_at), result])
    print(_table(rows))
    return EXIT_OK
