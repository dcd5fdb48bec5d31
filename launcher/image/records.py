"""What ``launcher build`` made for a spec file, so that ``"@image"`` in that spec names it.

One JSON record per spec file in ``{LAUNCHER_HOME}/images/``, written whole (atomically) after a
build succeeds and again after a push succeeds: a failed step or a refused push never leaves a
record that claims more than happened.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.fileio import atomic_write
from launcher.runs.state import home


@dataclass
class ImageRecord:
    spec_file: str
    tag: str
    image_id: str
    identity: str  # of the context, Dockerfile and build args it was built from (ImageRecord.identity)
    built_at: float
    pushed: str | None = None  # REPOSITORY@sha256:... once `build --push` succeeded
    build_args: dict[str, str] = field(default_factory=dict)  # the --build-arg values it was built with

    @property
    def reference(self) -> str:
        """How nodes should name the image: by pushed digest where there is one (it cannot move)."""
        return self.pushed or self.tag


def _path(spec_file: Path) -> Path:
    key = hashlib.sha256(str(spec_file.resolve()).encode()).hexdigest()[:16]
    return home() / "images" / f"{key}.json"


def load(spec_file: Path | None) -> ImageRecord | None:
    if spec_file is None:
        return None
    try:
        data = json.loads(_path(spec_file).read_text())
        data.setdefault("identity", data.pop("context_digest", ""))  # earlier versions named it so
        return ImageRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def save(spec_file: Path, tag: str, image_id: str, identity: str, build_args: dict[str, str],
         pushed: str | None = None) -> ImageRecord:
    record = ImageRecord(str(spec_file.resolve()), tag, image_id, identity, time.time(), pushed, build_args)
    atomic_write(_path(spec_file), json.dumps(asdict(record), indent=1) + "\n")
    return record
