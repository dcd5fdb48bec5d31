"""`launcher timeline -o x.svg` on a run of N nodes (issue 41): the picture's size (bytes, lanes, pixels high) and the
command's time, for this checkout and, with ``--before DIR``, for another checkout of launcher on the same records.

The runs are written by benchmarks/scale.py (the protocol's own writers), as in benchmarks/scale_client.py, whose
timing (the median of ``--repeat`` runs; wall and CPU seconds, peak RSS) is used here.

    git archive COMMIT | tar -x -C /tmp/before     # the checkout to compare with, e.g. the commit before folding
    PYTHONPATH=$PWD .venv/bin/python benchmarks/timeline_lanes.py --sizes 64 256 1024 --before /tmp/before \
        [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from common import REPO, print_table, scratch_dir
from scale_client import make_run, time_command


def measure(checkout: Path, run: str, home: Path, repeat: int) -> dict:
    """``timeline -o x.svg`` of ``run`` with ``checkout``'s launcher: its time, the picture's bytes and lanes."""
    picture = home / f"{checkout.name}.svg"
    env = {**os.environ, "LAUNCHER_HOME": str(home), "PYTHONPATH": str(checkout), "COLUMNS": "160"}
    timed = time_command([sys.executable, "-m", "launcher", "timeline", "-o", str(picture), run], env, repeat)
    text = picture.read_text(encoding="utf-8")
    lanes = len(re.findall(r'<g (?:class="fold" )?data-lane="', text)) - 1  # the run's own lane is no node's
    height = float(re.search(r'<svg[^>]* height="([\d.]+)"', text).group(1))
    return {**timed, "svg_bytes": len(text.encode()), "lanes": lanes, "height_px": height}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--train-seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the command; the median is kept")
    parser.add_argument("--before", type=Path, help="another checkout of launcher to measure on the same records")
    parser.add_argument("--keep", type=Path, help="make each run under KEEP/N and keep it; a run already there is "
                        "measured again as it is")
    args = parser.parse_args()
    checkouts = {"after": REPO, **({"before": args.before.resolve()} if args.before else {})}
    rows = []
    for nodes in args.sizes:
        home = args.keep / str(nodes) if args.keep else scratch_dir(f"timeline-lanes-{nodes}-")
        info = home / "runs" / "scale" / "info.yaml"
        if not info.exists():
            info, _ = make_run(nodes, args.train_seconds, home)
        for label, checkout in checkouts.items():
            row = {"nodes": nodes, "code": label, **measure(checkout, str(info), home, args.repeat)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print_table(["nodes", "code", "lanes", "height", "SVG", "total", "CPU", "peak RSS"],
                [[row["nodes"], row["code"], row["lanes"], f"{row['height_px']:,.0f} px",
                  f"{row['svg_bytes'] / 1024:,.0f} KiB", f"{row['total_s']:.2f} s", f"{row['cpu_s']:.2f} s",
                  f"{row['peak_rss_mib']:.0f} MiB"] for row in rows])


if __name__ == "__main__":
    main()
