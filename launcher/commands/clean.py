"""``launcher clean``: remove old runs' records, local temporary outputs and, when asked, their work-dir data."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from launcher.errors import EXIT_BACKEND, EXIT_OK, BadInput, LauncherError
from launcher.runs.state import RunInfo, all_runs, resolve_run
from launcher.runs.view import open_run, read_view
from launcher.spec.model import parse_duration
from launcher.wording import plural

DURATION_HINT = "use seconds (3600) or a number with s, m, h or d (12h, 7d)"


def older_than_seconds(text: str) -> int:
    value = text.strip()
    try:
        return int(value) if value.isdigit() else parse_duration(value)
    except (ValueError, KeyError, IndexError):
        raise BadInput(f"--older-than {text!r}: {DURATION_HINT}") from None


def clean(older_than: str, *, work_dir: bool, dry_run: bool, runs: list[str] | None = None) -> int:
    """Runs named in ``runs`` whatever their age; else every run older than ``older_than``."""
    cutoff = time.time() - older_than_seconds(older_than)
    chosen = [resolve_run(ref) for ref in runs] if runs else [info for info in all_runs() if info.created_at < cutoff]
    verb = "would remove" if dry_run else "removed"
    removed = kept = 0
    failed = False
    for info in chosen:
        try:
            view = read_view(info)
            if not view.ended:
                print(f"kept {info.run_id}: it is {view.result}")
                kept += 1
                continue
        except LauncherError as exc:  # its work dir is gone or unreachable: the record is all there is
            if work_dir:
                print(f"kept {info.run_id}: cannot read its work dir ({exc})")
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
        targets.append((f"the containers and network of {info.run_id}", lambda: _remove_containers(info)))
    temporary = Path(tempfile.gettempdir()) / "launcher" / info.run_id
    if temporary.exists():
        targets.append((str(temporary), lambda: shutil.rmtree(temporary)))
    if work_dir:
        targets.append((info.run_url, lambda: open_run(info).remove_all()))
    targets.append((str(info.state_dir), lambda: shutil.rmtree(info.state_dir)))
    return targets


def _remove_containers(info: RunInfo) -> None:
    from launcher.backends import backend_for

    freed = backend_for("docker", "local").release(info, discard=True)
    print(f"  {', '.join(freed) if freed else 'none were left'}")
