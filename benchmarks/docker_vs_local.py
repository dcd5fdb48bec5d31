"""The docker backend against the local backend for the same 2-node example run, and a cached build.

Both run `launcher run -f train.yaml` (foreground: submit, follow, exit with the result) on the
example from `launcher init`, alternated in one run; the docker run uses the image `launcher build`
made (base image: the tests' Debian image, see tests/dockerenv.py, built first if missing).
Also times `launcher build` of the unchanged project (every step cached).

    .venv/bin/python benchmarks/docker_vs_local.py [--repeat 5] [--epochs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from common import median, scratch_dir, timed_run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from dockerenv import Engine, ensure_base_image  # noqa: E402

LAUNCHER = str(Path(sys.executable).with_name("launcher"))


def timed(argv: list[str], cwd: Path, env: dict) -> float:
    elapsed, done = timed_run(argv, cwd, env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    engine = Engine()
    base = ensure_base_image()
    root = scratch_dir("docker-vs-local-")
    project = root / "project"
    env = {**os.environ, "LAUNCHER_HOME": str(root / "home")}
    subprocess.run([LAUNCHER, "init", "--framework", "pytorch", "--dir", str(project)], check=True,
                   capture_output=True)
    build = [LAUNCHER, "build", "-f", "train.yaml", "--build-arg", f"BASE_IMAGE={base}"]
    timed(build, project, env)
    run = [LAUNCHER, "run", "-f", "train.yaml", "--", "--epochs", str(args.epochs)]
    local, docker, cached = [], [], []
    for _ in range(args.repeat):
        local.append(timed(run, project, env))
        docker.append(timed(run[:4] + ["--backend", "docker"] + run[4:], project, env))
        cached.append(timed(build, project, env))
    print(f"2-node example, {args.epochs} epochs, median of {args.repeat} (alternated):")
    print(f"  local backend   {median(local):6.2f} s")
    print(f"  docker backend  {median(docker):6.2f} s   overhead {median(docker) - median(local):+.2f} s "
          f"(ratio {median(docker) / median(local):.2f})")
    print(f"  launcher build, unchanged project (cached): {median(cached):.2f} s")
    engine.stop()


if __name__ == "__main__":
    main()
