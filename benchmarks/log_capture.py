"""Log capture under a burst: `launcher run` of a script printing N lines against plain torchrun.

One node, one process; both print every line to stdout (sent to /dev/null). launcher's lines
go through its capture (per-rank files, chunks in a local work dir) and are printed by the
following client from the work dir; a check counts them all.

    .venv/bin/python benchmarks/log_capture.py [--lines 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from common import median, timed_run

BURST = """
import sys
write = sys.stdout.write
for i in range({lines}):
    write(f"step {{i}} loss 0.{{i % 9973:04d}} lr 0.001 tokens_per_s 123456.7\\n")
"""

SPEC = """kind: distributed
apiVersion: v1.0
spec:
  name: burst
  infrastructure: {{kind: infrastructure, type: local}}
  cluster:
    kind: pytorch
    spec: {{workDir: ./wd, main: {{replicas: 1}}, worker: {{replicas: 0}}}}
  runtime: {{kind: python, spec: {{entryPoint: burst.py}}}}
"""


def timed(argv: list[str], cwd: Path, env: dict, expect_lines: int) -> float:
    elapsed, done = timed_run(argv, cwd, env)
    printed = done.stdout.count("tokens_per_s")
    assert done.returncode == 0 and printed == expect_lines, (done.returncode, printed, done.stderr[-2000:])
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="capture-bench-") as tmp:
        project = Path(tmp)
        (project / "burst.py").write_text(BURST.format(lines=args.lines))
        (project / "train.yaml").write_text(SPEC.format())
        env = {**os.environ, "LAUNCHER_HOME": str(project / "home")}
        plain_argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "burst.py"]
        launcher_argv = [sys.executable, "-m", "launcher", "run", "-f", "train.yaml"]
        plain, launched = [], []
        for _ in range(args.repeat):  # alternated, so both see the same machine load
            plain.append(timed(plain_argv, project, env, args.lines))
            launched.append(timed(launcher_argv, project, env, args.lines))
    p, q = median(plain), median(launched)
    print(f"{args.lines} lines from 1 process, median of {args.repeat}:")
    print(f"  plain torchrun  {p:6.2f} s")
    print(f"  launcher run    {q:6.2f} s")
    print(f"  ratio {q / p:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
