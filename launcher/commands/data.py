"""``launcher data RUN``: each epoch's progress of launcher.data.ElasticSampler (shards done, in flight, left)."""

from __future__ import annotations

import json
import sys

from launcher.commands.inspect import _table
from launcher.errors import EXIT_OK
from launcher.runs.state import resolve_run
from launcher.runs.view import open_run


def data_progress(run_ref: str | None, *, as_json: bool) -> int:
    from launcher.data.progress import read_progress

    info = resolve_run(run_ref)
    epochs = read_progress(open_run(info))
    if as_json:
        json.dump({"run_id": info.run_id, "epochs": [p.as_dict() for p in epochs]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    if not epochs:
        print(f"run {info.run_id}: no epoch of launcher.data.ElasticSampler recorded yet")
        return EXIT_OK
    rows = [["EPOCH", "ATTEMPT", "SHARDS", "DONE", "IN FLIGHT", "LEFT"]]
    rows += [[str(p.epoch), p.attempt, str(p.shards), str(p.done), str(p.in_flight), str(p.left)] for p in epochs]
    print(f"run {info.run_id}: data progress (attempt = membership round.torchrun restart)")
    print(_table(rows))
    return EXIT_OK
