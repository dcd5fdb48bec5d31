"""Sync the training outputs directory to ``outputs/{node}/`` in the work dir; restore an earlier run's.

Only changed files (size or mtime) are uploaded, several at once, each streamed in bounded memory
(launcher.protocol.transfer). Names starting with a dot are treated as in-progress temporaries and skipped,
so write-then-rename checkpoints are never caught half-written. The periodic sync runs on a thread of its
own, so a checkpoint of many gigabytes never holds up supervision.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Sequence

from launcher.protocol.store import WorkDir
from launcher.protocol.transfer import Progress, each, raise_first_failure

OUTPUTS_PREFIX = "outputs"
MANIFEST = ".manifest.json"  # per node: each synced file's size and the time it was written (its mtime)


class OutputsSync:
    def __init__(self, store: WorkDir, node: str, directory: str):
        self.store = store
        self.node = node
        self.directory = Path(directory)
        self._uploaded: dict[str, tuple[int, int]] = {}
        self._restored: set[str] = set()  # came from the work dir: not this node's to list as written
        self._syncing = threading.Lock()  # one sync at a time: a final sync waits for a periodic one under way
        self._background: threading.Thread | None = None
        self._background_ended: int | Exception = 0  # what the last background sync uploaded, or raised

    def mark_synced(self, rel: str) -> None:
        """``rel`` (restored from the work dir) is there already: the next sync uploads it only if it changes."""
        stat = (self.directory / rel).stat()
        self._uploaded[rel] = (stat.st_size, stat.st_mtime_ns)
        self._restored.add(rel)

    def _files(self) -> list[tuple[str, Path, tuple[int, int]]]:
        """The directory's files but dot-named ones (in-progress temporaries): each as (path relative to it, path,
        (size, mtime)), the signature a sync compares."""
        found = []
        for root, dirs, files in os.walk(self.directory):  # nothing when there is no directory
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                if name.startswith("."):
                    continue
                path = Path(root, name)
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue  # removed while we walked
                found.append((path.relative_to(self.directory).as_posix(), path, (stat.st_size, stat.st_mtime_ns)))
        return found

    def unsynced(self) -> list[str]:
        """The files the work dir does not hold as they are now."""
        return [rel for rel, _, signature in self._files() if self._uploaded.get(rel) != signature]

    def sync(self) -> int:
        """Upload what changed since the last sync; return how many files were uploaded. A sync under way in the
        background ends first."""
        with self._syncing:
            changed = [(rel, str(path)) for rel, path, signature in self._files()
                       if self._uploaded.get(rel) != signature]
            outcomes = each(self._upload, changed)
            count = 0
            for (rel, _), outcome in zip(changed, outcomes):
                if isinstance(outcome, tuple):
                    self._uploaded[rel] = outcome  # what was read, even if the file changed since it was listed
                    self._restored.discard(rel)  # written here since: this node's own now
                    count += 1
            raise_first_failure(outcomes)
            if count:  # written after the files: a reader never finds a file it lists missing
                manifest = {rel: [size, mtime_ns / 1e9] for rel, (size, mtime_ns) in self._uploaded.items()
                            if rel not in self._restored}
                self.store.put(f"{OUTPUTS_PREFIX}/{self.node}/{MANIFEST}", json.dumps(manifest).encode())
            return count

    def _upload(self, item: tuple[str, str]) -> tuple[int, int] | None:
        """One file: its (size, mtime) as uploaded, or None when it was removed since the listing."""
        rel, path = item
        try:
            return self.store.upload(path, f"{OUTPUTS_PREFIX}/{self.node}/{rel}")
        except FileNotFoundError:
            return None

    def sync_in_background(self) -> int:
        """Start a sync on a thread of its own unless one is under way, so that supervision goes on at once however
        long the uploads take. Returns how many files the last one (ended since the last call) uploaded; raises
        what it failed with."""
        if self._background is not None and self._background.is_alive():
            return 0
        ended, self._background_ended = self._background_ended, 0
        if isinstance(ended, Exception):
            raise ended
        self._background = threading.Thread(target=self._sync_keeping_result, name="launcher-outputs-sync", daemon=True)
        self._background.start()
        return ended

    def _sync_keeping_result(self) -> None:
        try:
            self._background_ended = self.sync()
        except Exception as exc:  # raised in supervision, at its next call
            self._background_ended = exc


def restore_newest(runs: Sequence[WorkDir], sync: OutputsSync, progress: Progress | None = None) -> int:
    """Bring the newest copy of every output file any node of ``runs`` synced into this node's outputs dir.

    For each path the copy written last wins, by the time the file was written (each node's
    manifest), never an older one because another node holds more files; so a checkpoint rank 0
    wrote reaches every node, and each rank's own files come back to whichever node now has that
    rank. Across several runs (the attempts of a run retried whole, each holding only what its own
    nodes wrote) the newest copy wins the same way. A local file as new stays. Restored files count
    as synced: they are not uploaded again as this node's outputs, nor listed in its manifest. ``progress`` is
    told the bytes to restore (its total) and counts them as they come; stopped, the restore ends (Cancelled).
    """
    newest: dict[str, tuple[float, WorkDir, str, int]] = {}  # path in a node's outputs -> (written, run, key, size)
    for run in runs:
        for node, files in _written_times(run).items():
            for rel, (written, size) in files.items():
                if rel not in newest or written > newest[rel][0]:
                    newest[rel] = (written, run, f"{OUTPUTS_PREFIX}/{node}/{rel}", size)
    wanted = [(rel, copy) for rel, copy in sorted(newest.items()) if not _as_new_here(sync.directory / rel, copy[0])]
    if progress is not None:
        progress.total = sum(size for _, (_, _, _, size) in wanted)

    def download(item: tuple[str, tuple[float, WorkDir, str, int]]) -> bool:
        rel, (_, run, key, _) = item
        return run.download(key, str(sync.directory / rel), progress)

    outcomes = each(download, wanted)
    count = 0
    for (rel, (written, _, _, _)), outcome in zip(wanted, outcomes):
        if outcome is True:
            os.utime(sync.directory / rel, (written, written))  # its age is the copy's: newer local writes win later
            sync.mark_synced(rel)
            count += 1
    raise_first_failure(outcomes)
    return count


def _as_new_here(target: Path, written: float) -> bool:
    return target.exists() and target.stat().st_mtime >= written


def _written_times(run: WorkDir) -> dict[str, dict[str, tuple[float, int]]]:
    """node -> {file: (when it was written, its size)}, the time from each node's manifest, else (older runs) the
    store's."""
    by_node: dict[str, dict[str, tuple[float, int]]] = {}
    for key, stat in run.find_stats(OUTPUTS_PREFIX).items():
        node, _, rel = key.partition("/")
        if rel:
            by_node.setdefault(node, {})[rel] = stat
    for node, files in by_node.items():
        manifest = run.get_record(f"{OUTPUTS_PREFIX}/{node}/{MANIFEST}")
        for rel, (_, size) in files.items():
            entry = manifest.get(rel)
            if isinstance(entry, list) and len(entry) == 2:
                files[rel] = (float(entry[1]), size)
            elif manifest:  # listed by no manifest: a copy this node restored in an older version; skip it
                files[rel] = (-1.0, size)
    return by_node


KEPT = "unsynced_outputs"  # in a node's final status and failure marker: {"dir", "files" (the first few), "count"}
KEPT_FILES_SHOWN = 5


def kept_record(directory: str, left: list[str]) -> dict[str, dict]:
    """The ``KEPT`` field for a node whose files ``left`` (relative paths) the work dir did not get; {} if none."""
    return {KEPT: {"dir": directory, "files": left[:KEPT_FILES_SHOWN], "count": len(left)}} if left else {}


def kept_text(record: dict) -> str:
    """``not in the work dir, kept in DIR: checkpoints/ck.pt``, from a record holding a ``KEPT`` field."""
    kept = record[KEPT]
    more = " ..." if kept["count"] > len(kept["files"]) else ""
    return f"not in the work dir, kept in {kept['dir']}: {', '.join(kept['files'])}{more}"


def tidy_temporary(sync: OutputsSync) -> list[str]:
    """At a node's end, its launcher-chosen outputs directory: removed once the work dir holds every file in it
    (also when there are none: a failed run leaves no empty directories behind); otherwise only its empty
    directories go, and the files the work dir never got stay. Returns those."""
    left = sync.unsynced()
    if not left:
        remove_temporary(str(sync.directory))
        return []
    for root, _, _ in os.walk(sync.directory, topdown=False):  # bottom up: a directory's empty ones go first
        if not os.listdir(root):
            os.rmdir(root)
    return left


def remove_temporary(directory: str) -> None:
    """Remove a launcher-chosen ``{tmp}/launcher/{run}/{node}/outputs`` and its then-empty parents."""
    node_dir = Path(directory).parent
    shutil.rmtree(node_dir, ignore_errors=True)
    try:
        node_dir.parent.rmdir()  # the run's directory, once its last node is done
    except OSError:
        pass
