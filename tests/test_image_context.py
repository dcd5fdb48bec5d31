"""The build context `launcher build` sends, without an engine: what goes in, what never does, bounded memory."""

from __future__ import annotations

import tarfile
import tracemalloc

from launcher.image.context import build_context


def names(context) -> set[str]:
    with tarfile.open(fileobj=context.archive) as tar:
        return set(tar.getnames())


def test_code_launcher_and_artifacts_go_in_secrets_and_data_never(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("x = 1\n")
    for secret in (".oci/config", ".aws/credentials", ".git/config", "pkg/.env", "keys/server.pem", ".ssh/id_rsa"):
        (tmp_path / secret).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / secret).write_text("secret")
    (tmp_path / "work_dir" / "run-1").mkdir(parents=True)
    (tmp_path / "work_dir" / "run-1" / "status.json").write_text("{}")
    (tmp_path / "notes.log").write_text("ignored")
    (tmp_path / ".dockerignore").write_text("*.log\n")
    context = build_context(tmp_path, keep_out=[str(tmp_path / "work_dir"), "/elsewhere/outputs"])
    found = names(context)
    assert {"train.py", "pkg/model.py", ".launcher/launcher/node/main.py",
            "artifacts/pytorch/v1/Dockerfile", "artifacts/pytorch/v1/requirements.txt"} <= found
    assert not [n for n in found if n.startswith(("work_dir", ".oci", ".aws", ".git/", ".ssh", "keys/"))
                or n.endswith((".env", ".log", ".pem"))]
    assert context.excluded == ["work_dir"]
    # Same files, same digest: the default tag (and the cache) stays while nothing changes.
    assert build_context(tmp_path, keep_out=[str(tmp_path / "work_dir")]).digest == context.digest
    (tmp_path / "train.py").write_text("print('changed')\n")
    assert build_context(tmp_path, keep_out=[str(tmp_path / "work_dir")]).digest != context.digest


def test_a_large_file_is_streamed_not_held_in_memory(tmp_path):
    with open(tmp_path / "data.bin", "wb") as handle:  # 200 MiB, sparse on disk
        handle.truncate(200 << 20)
    tracemalloc.start()
    context = build_context(tmp_path, keep_out=[])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert context.size > 200 << 20
    assert peak < 80 << 20, f"staging peaked at {peak >> 20} MiB"
