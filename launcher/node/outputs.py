"""Sync the training outputs directory to ``outputs/{node}/`` in the work dir; restore an earlier run's.

Only changed files (size or mtime) are uploaded. Names starting with a dot are treated as
in-progress temporaries and skipped, so write-then-rename checkpoints are never caught half-written.
"""

from __future__ import annotations

import os
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
