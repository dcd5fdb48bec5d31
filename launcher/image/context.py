"""The build context of a node image, as a tar archive: the code directory, the launcher package, the artifacts.

The user's directory is never written to: what the Dockerfile needs besides the code
(``.launcher/`` with the launcher package, ``artifacts/pytorch/v1/`` when the project has no copy)
is added to the archive only. ``.dockerignore`` is honoured, and some paths are never sent:
the run's local work dir and outputs, launcher's own state, VCS data and credential files.
"""

from __future__ import annotations

import hashlib
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import launcher
from launcher.plan import IMAGE_ARTIFACTS
from launcher.resources import data_dir

STAGED_PACKAGE_DIR = ".launcher"
# Never in an image, whatever .dockerignore says: secrets a user may keep beside their code.
NEVER_SENT = (".git", "**/.git", "**/__pycache__", ".launcher", ".aws", "**/.aws", ".oci", "**/.oci",
              ".ssh", "**/.ssh", "**/.netrc", "**/.env", "**/*.pem", "**/.docker/config.json",
              "**/.git-credentials", "**/credentials.json")


@dataclass
class Context:
    archive: IO[bytes]  # a tar file, positioned at its start
    files: int
    size: int
    digest: str  # of every member's name and content: equal digests, equal contexts
    excluded: list[str]  # the local directories kept out (work dir, outputs)


def _relative_inside(path: str | None, root: Path) -> str | None:
    if not path:
        return None
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return None


def build_context(code_dir: Path, *, keep_out: list[str]) -> Context:
    """The archive ``docker build`` gets. ``keep_out``: local paths (work dir, outputs dir) never to send."""
    from docker.utils.build import exclude_paths

    root = code_dir.resolve()
    patterns = list(NEVER_SENT)
    excluded = [rel for rel in (_relative_inside(path, root) for path in keep_out) if rel and rel != "."]
    patterns += excluded
    ignore_file = root / ".dockerignore"
    if ignore_file.is_file():
        patterns += [line.strip() for line in ignore_file.read_text().splitlines()
                     if line.strip() and not line.startswith("#")]
    members = sorted(exclude_paths(str(root), patterns))
    spool = tempfile.SpooledTemporaryFile(max_size=64 << 20)
    digest = hashlib.sha256()
    files = 0
    with tarfile.open(fileobj=spool, mode="w") as tar:
        for rel in members:
            _add(tar, root / rel, rel, digest)
            files += 1
        package = Path(launcher.__file__).resolve().parent
        for path in sorted(package.rglob("*")):
            rel = path.relative_to(package)
            if "__pycache__" in rel.parts or rel.parts[0] == "_data" or path.is_dir():
                continue
            _add(tar, path, f"{STAGED_PACKAGE_DIR}/launcher/{rel.as_posix()}", digest)
            files += 1
        if not (root / IMAGE_ARTIFACTS / "Dockerfile").is_file():
            shipped = data_dir("artifacts") / IMAGE_ARTIFACTS.removeprefix("artifacts/")
            for path in sorted(shipped.iterdir()):
                _add(tar, path, f"{IMAGE_ARTIFACTS}/{path.name}", digest)
                files += 1
    size = spool.tell()
    spool.seek(0)
    return Context(spool, files, size, digest.hexdigest()[:16], excluded)


def _add(tar: tarfile.TarFile, path: Path, name: str, digest: "hashlib._Hash") -> None:
    """One member with fixed owner and time, so that an unchanged project gives the same archive."""
    info = tar.gettarinfo(str(path), arcname=name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    digest.update(name.encode() + b"\0")
    if not info.isreg():
        tar.addfile(info)
        return
    with path.open("rb") as handle:  # streamed twice (hash, then archive): a large file never sits in memory
        content = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            content.update(block)
        digest.update(content.digest())
        info.size = handle.tell()
        handle.seek(0)
        tar.addfile(info, handle)
