"""``launcher data RUN``: each epoch's progress of launcher.data.ElasticSampler (shards done, in flight, left)."""

from __future__ import annotations

import json
import sys

from launcher.commands.inspect import _table
from launcher.errors import EXIT_OK
from launcher.runs.state import resolve_run
from launcher.runs.view import open_run, read_view

COLUMNS = ["EPOCH", "ATTEMPT", "SHARDS", "DONE", "IN FLIGHT", "LEFT"]
ENDED_COLUMNS = ["EPOCH", "ATTEMPT", "SHARDS", "DONE", "PARTLY DONE", "NOT STARTED"]  # nothing is in flight any more


def data_progress(run_ref: str | None, *, as_json: bool) -> int:
    from launcher.data.progress import read_progress

    info = resolve_run(run_ref)
    view = read_view(info)
    epochs = read_progress(open_run(info))
    if as_json:
        json.dump({"run_id": info.run_id, "result": view.result, "epochs": [p.as_dict() for p in epochs]},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    if not epochs:
        print(f"run {info.run_id} has ended ({view.result}) and recorded no epoch of launcher.data.ElasticSampler"
              if view.ended else f"run {info.run_id}: no epoch of launcher.data.ElasticSampler recorded yet")
        return EXIT_OK
    rows = [ENDED_COLUMNS if view.ended else COLUMNS]
    rows += [[str(p.epoch), p.attempt, str(p.shards), str(p.done), str(p.in_flight), str(p.left)] for p in epochs]
    when = f" when it ended ({view.result})" if view.ended else ""
    print(f"run {info.run_id}: data progress{when} (attempt = membership round.torchrun restart)")
    print(_table(rows))
    return EXIT_OK
