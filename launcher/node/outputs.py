"""Sync the training outputs directory to ``outputs/{node}/`` in the work dir; restore an earlier run's.

Only changed files (size or mtime) are uploaded. Names starting with a dot are treated as
in-progress temporaries and skipped, so write-then-rename checkpoints are never caught half-written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from launcher.node.store import WorkDir

OUTPUTS_PREFIX = "outputs"


class OutputsSync:
    def __init__(self, store: WorkDir, node: str, directory: str):
        self.store = store
        self.node = node
        self.directory = Path(directory)
        self._uploaded: dict[str, tuple[int, int]] = {}

    def sync(self) -> int:
        """Upload what changed since the last sync; return how many files were uploaded."""
        count = 0
        if not self.directory.is_dir():
            return 0
        for root, dirs, files in os.walk(self.directory):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                if name.startswith("."):
                    continue
                path = Path(root, name)
                rel = path.relative_to(self.directory).as_posix()
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue  # removed while we walked
                signature = (stat.st_size, stat.st_mtime_ns)
                if self._uploaded.get(rel) == signature:
                    continue
                try:
                    self.store.upload(str(path), f"{OUTPUTS_PREFIX}/{self.node}/{rel}")
                except FileNotFoundError:
                    continue
                self._uploaded[rel] = signature
                count += 1
        return count


def restore(run: WorkDir, node: str, directory: str) -> int:
    """Copy ``outputs/{node}/`` of a run into ``directory``; return the number of files restored."""
    prefix = f"{OUTPUTS_PREFIX}/{node}"
    keys = run.find(prefix)
    for rel in keys:
        run.download(f"{prefix}/{rel}", os.path.join(directory, rel))
    return len(keys)


def checkpoint_holder(run: WorkDir, prefer: str | None = None) -> str | None:
    """The node whose outputs a resume should start from: the one that kept the most files.

    Usually one rank writes checkpoints (rank 0), and in elastic mode that rank may be on any
    node, so the run's main is only the tie-breaker. None when no node left outputs.
    """
    counts: dict[str, int] = {}
    for key in run.find(OUTPUTS_PREFIX):
        node = key.split("/", 1)[0]
        counts[node] = counts.get(node, 0) + 1
    if not counts:
        return None
    return max(sorted(counts), key=lambda node: (counts[node], node == prefer))


def remove_temporary(directory: str) -> None:
    """Remove a launcher-chosen ``{tmp}/launcher/{run}/{node}/outputs`` and its then-empty parents."""
    node_dir = Path(directory).parent
    shutil.rmtree(node_dir, ignore_errors=True)
    try:
        node_dir.parent.rmdir()  # the run's directory, once its last node is done
    except OSError:
        pass
