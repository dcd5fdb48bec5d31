"""The build context `launcher build` sends, without an engine: what goes in, what never does, bounded memory."""

from __future__ import annotations

import tarfile
import tracemalloc

import pytest

from launcher.image.context import GENERATED_COMPOSE_HEADER, build_context


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


SECRETS = (".env", ".env.local", "pkg/.envrc", ".aws/credentials", ".oci/config", ".ssh/id_ed25519",
           "server.pem", "keys/id_rsa", ".git/config", ".netrc", ".docker/config.json", ".pypirc")
NEVER_IN_AN_IMAGE = ("work_dir", ".launcher/compose-build", "compose.yaml", *SECRETS)

# .dockerignore files a user may write, and the secrets they ask for that launcher must say it withheld;
# whatever they say, nothing of NEVER_IN_AN_IMAGE is sent.
DOCKERIGNORE_CASES = {
    "none": (None, set()),
    "re-include secrets": ("!.env\n!.aws\n!server.pem\n!.git\n!.ssh/id_ed25519\n!work_dir\n!compose.yaml\n",
                           {".env", ".aws", ".git", "server.pem"}),
    "re-include everything": ("*\n!*\n!**\n", {".env", ".env.local", ".aws", ".git", "server.pem"}),
    "allow-list": ("*\n!train.py\n!train.yaml\n", set()),
    "allow-list of dot files": ("*\n!train.py\n!.*\n", {".env", ".env.local", ".aws", ".git"}),
    "ignore the recipe": ("artifacts\n.dockerignore\n", set()),
}


def project_with_secrets(root):
    for path in ("train.py", "train.yaml", "artifacts/pytorch/v1/Dockerfile", "artifacts/pytorch/v1/node_entry.py",
                 "artifacts/pytorch/v1/requirements.txt", "work_dir/run-1/outputs/model.pt",
                 ".launcher/compose-build/train.py", *SECRETS):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("secret" if path in SECRETS else "x")
    (root / "compose.yaml").write_text(f"{GENERATED_COMPOSE_HEADER} for run r-1\nservices: {{}}\n")
    (root / "my-compose.yaml").write_text("services: {}\n")  # the user's own: code like any other


@pytest.mark.parametrize("dockerignore, withheld", DOCKERIGNORE_CASES.values(), ids=DOCKERIGNORE_CASES.keys())
def test_nothing_secret_or_run_data_is_sent_whatever_dockerignore_says(tmp_path, dockerignore, withheld):
    project_with_secrets(tmp_path)
    if dockerignore is not None:
        (tmp_path / ".dockerignore").write_text(dockerignore)
    context = build_context(tmp_path, keep_out=[str(tmp_path / "work_dir")])
    found = names(context)
    leaked = [name for name in found for never in NEVER_IN_AN_IMAGE
              if name == never or name.startswith(f"{never}/")]
    assert leaked == []
    # The recipe always goes (docker build always sends its Dockerfile), and with it what it copies.
    assert {"train.py", "artifacts/pytorch/v1/Dockerfile", "artifacts/pytorch/v1/requirements.txt",
            "artifacts/pytorch/v1/node_entry.py", ".launcher/launcher/node/main.py"} <= found
    assert withheld <= set(context.withheld)  # what a `!` line asked for is named, not silently dropped


def test_the_identity_covers_context_dockerfile_and_build_args(tmp_path):
    (tmp_path / "train.py").write_text("x")
    context = build_context(tmp_path, keep_out=[])
    base = context.identity("artifacts/pytorch/v1/Dockerfile", {"CODE_DIR": "."})
    assert base == build_context(tmp_path, keep_out=[]).identity("artifacts/pytorch/v1/Dockerfile", {"CODE_DIR": "."})
    assert base != context.identity("other/Dockerfile", {"CODE_DIR": "."})
    assert base != context.identity("artifacts/pytorch/v1/Dockerfile", {"CODE_DIR": ".", "BASE_IMAGE": "b:1"})
