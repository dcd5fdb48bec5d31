"""``launcher clean``: remove old runs' records, local temporary outputs and, when asked, their work-dir data."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from launcher.errors import EXIT_BACKEND, EXIT_OK, BadInput, LauncherError
from launcher.protocol.outage import Outage
from launcher.protocol.store import WorkDir
from launcher.runs.attempts import current_url
from launcher.runs.preflight import QUICK_DEADLINE_SECONDS, quick_work_dir, reading_work_dir
from launcher.runs.state import RunInfo, all_runs, resolve_run
from launcher.runs.view import read_view
from launcher.spec.model import parse_duration
from launcher.wording import plural

DURATION_HINT = "use seconds (3600) or a number with s, m, h or d (12h, 7d)"


def older_than_seconds(text: str) -> int:
    value = text.strip()
    try:
        return int(value) if value.isdigit() else parse_duration(value)
    except (ValueError, KeyError, IndexError):
        raise BadInput(f"--older-than {text!r}: {DURATION_HINT}") from None


def clean(older_than: str, *, work_dir: bool, dry_run: bool, runs: list[str] | None = None,
          force: bool = False) -> int:
    """Runs named in ``runs`` whatever their age; else every run older than ``older_than``. A run whose local
    temporary outputs hold files the work dir lacks is kept unless ``force``: they may be all there is."""
    cutoff = time.time() - older_than_seconds(older_than)
    chosen = [resolve_run(ref) for ref in runs] if runs else [info for info in all_runs() if info.created_at < cutoff]
    verb = "would remove" if dry_run else "removed"
    removed = kept = 0
    failed = False
    readers = _Readers()
    for info in chosen:
        try:
            view = read_view(info, readers.of(info))
            if not view.ended:
                print(f"kept {info.run_id}: it is {view.result}")
                kept += 1
                continue
        except LauncherError as exc:  # its work dir is gone or unreachable: the record is all there is
            if work_dir:
                print(f"kept {info.run_id}: cannot read its work dir ({exc})")
                failed, kept = True, kept + 1
                continue
        try:
            unsynced = [] if force else unsynced_outputs(info, readers.of(info))
        except LauncherError as exc:
            print(f"kept {info.run_id}: cannot check that its outputs in {temporary_outputs(info)} reached its work "
                  f"dir ({exc}); add --force to delete them anyway")
            failed, kept = True, kept + 1
            continue
        if unsynced:
            shown = ", ".join(unsynced[:3]) + (" ..." if len(unsynced) > 3 else "")
            print(f"kept {info.run_id}: {plural(len(unsynced), 'output file')} in {temporary_outputs(info)} never "
                  f"reached its work dir ({shown}); copy what you need, or add --force to delete them")
            failed, kept = True, kept + 1
            continue
        for target, remove in _targets(info, work_dir):
            print(f"{verb} {target}")
            if not dry_run:
                try:
                    remove()
                except (OSError, LauncherError) as exc:
                    print(f"  could not remove {target}: {exc}")
                    failed = True
        removed += 1
    which = "named" if runs else f"older than {older_than.strip()}"
    print(f"{verb} {plural(removed, 'run')} {which}"
          + (f"; kept {kept}" if kept else "") + ("" if work_dir else " (work-dir data kept; add --work-dir)"))
    return EXIT_BACKEND if failed else EXIT_OK


def _targets(info: RunInfo, work_dir: bool) -> list[tuple[str, Callable[[], None]]]:
    """What belongs to a run, each with the function that removes it; the record itself last."""
    targets: list[tuple[str, Callable[[], None]]] = []
    if info.backend == "docker":  # its containers and network, kept (--keep, compose) or left by a dead supervisor
        targets.append((f"the containers and network of {info.run_id}", lambda: _remove_engine_objects(info)))
    if info.backend == "kubernetes" and info.backend_ids.get("job"):  # its Job (kept for kubectl logs) and Service
        targets.append((f"the Kubernetes Job and Service of {info.run_id}", lambda: _remove_engine_objects(info)))
    temporary = temporary_outputs(info)
    if temporary.exists():
        targets.append((str(temporary), lambda: shutil.rmtree(temporary)))
    if work_dir:
        # The run's whole directory: open_run names only its current attempt's, within it.
        targets.append((info.run_url, lambda: reading_work_dir(info.run_url).remove_all()))
    targets.append((str(info.state_dir), lambda: shutil.rmtree(info.state_dir)))
    return targets


def temporary_outputs(info: RunInfo) -> Path:
    """Where the nodes of a run on this machine wrote outputs when the spec named no outputsDir
    (``{tmp}/launcher/{run}/{node}/outputs``); each node removes its own once they are synced."""
    return Path(tempfile.gettempdir()) / "launcher" / info.run_id


class _Readers:
    """The work dirs clean reads, each store on one clock of QUICK_DEADLINE_SECONDS for the whole command: a dead
    store is given that once, and each other run on it is told at once that it cannot be read (it waited out
    LAUNCHER_STORE_DEADLINE for every run, a --dry-run too)."""

    def __init__(self) -> None:
        self._clocks: dict[str, Outage] = {}

    def of(self, info: RunInfo) -> WorkDir:
        clock = self._clocks.setdefault(info.work_dir.rstrip("/"), Outage(
            QUICK_DEADLINE_SECONDS, say=lambda message: print(f"note: {message}", file=sys.stderr, flush=True),
            source="clean's own bound"))
        return quick_work_dir(current_url(info), attempts=None, outage=clock)


def unsynced_outputs(info: RunInfo, run: WorkDir) -> list[str]:
    """The temporary output files (``node/path``) newer than every write of that path a node's manifest in the
    work dir (``run``) lists as synced. Raises LauncherError when the work dir cannot be read."""
    from launcher.protocol.outputs import MANIFEST, OUTPUTS_PREFIX

    local: dict[str, float] = {}
    for node_dir in sorted(temporary_outputs(info).glob("*/outputs")):
        for path in sorted(node_dir.rglob("*")):
            rel = path.relative_to(node_dir)
            if path.is_file() and not any(part.startswith(".") for part in rel.parts):  # dot files are never synced
                local[f"{node_dir.parent.name}/{rel.as_posix()}"] = path.stat().st_mtime
    if not local:
        return []
    written: dict[str, float] = {}  # path in a node's outputs -> the newest write any node synced of it
    for node in run.list(OUTPUTS_PREFIX):
        for rel, entry in run.get_record(f"{OUTPUTS_PREFIX}/{node}/{MANIFEST}").items():
            if isinstance(entry, list) and len(entry) == 2:
                written[rel] = max(written.get(rel, 0.0), float(entry[1]))
    # A file counts when the work dir holds that write or a newer one, from whichever node: a restored copy
    # keeps the write time of the node that wrote it, and one overwritten there since is only an older copy.
    return [name for name, mtime in local.items() if written.get(name.partition("/")[2], -1.0) < mtime - 1e-3]


def _remove_engine_objects(info: RunInfo) -> None:
    """What the run's backend still holds for it (containers, a Job), as its release with ``discard`` frees it."""
    from launcher.backends import backend_for

    freed = backend_for(info.backend, "local").release(info, discard=True)
    print(f"  {', '.join(freed) if freed else 'none were left'}")
