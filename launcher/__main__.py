"""``python -m launcher`` and the ``launcher`` command: the CLI, where a Ctrl-C that lands while it is still
loading ends it as one that lands later does (exit 130, no traceback)."""

from __future__ import annotations

import sys


def run() -> int:
    try:
        from launcher.cli import main

        return main()
    except KeyboardInterrupt:  # before main() took Ctrl-C over: nothing was started yet
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(run())
