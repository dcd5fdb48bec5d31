"""Show the engine's build and push streams: a bar redrawn in place on a terminal, plain lines when piped.

Both keep what a failure report needs: the step that failed and its last output lines.
"""

from __future__ import annotations

import os
import re
from collections import deque
from typing import Any, TextIO

from launcher.wording import plural

STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
# Terminal control sequences (colours, cursor moves) the engine passes on from the build's commands.
ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])|[\x00-\x08\x0b-\x1f\x7f]")
BAR_WIDTH = 24
KEPT_LINES = 15


def _bar(done: float, total: float) -> str:
    filled = int(BAR_WIDTH * done / total) if total else 0
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return ""


def plain(text: str) -> str:
    """The engine's text without terminal control sequences: printable anywhere, quotable in an error."""
    return ESCAPES.sub("", text)


class _Display:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.pending = False  # a status line is drawn and not ended

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.out.fileno()).columns
        except (OSError, ValueError, AttributeError):
            return 80

    def status(self, text: str) -> None:
        """On a terminal: redraw the one status line, cut to the terminal's width (a wrapped line could not be
        redrawn). Piped: nothing (lines carry the progress)."""
        if self.tty:
            self.out.write("\r\033[K" + text[:max(self._width() - 1, 1)])
            self.out.flush()
            self.pending = True

    def line(self, text: str) -> None:
        if self.pending:
            self.out.write("\r\033[K")
            self.pending = False
        self.out.write(text + "\n")
        self.out.flush()

    def end(self) -> None:
        if self.pending:
            self.out.write("\n")
            self.pending = False


class BuildProgress:
    """Feed it the build stream (``decode=True`` chunks); it prints steps and remembers the failure."""

    def __init__(self, out: TextIO, verbose: bool = False) -> None:
        self.display = _Display(out)
        self.verbose = verbose
        self.step = ""
        self.steps = (0, 0)
        self.cached = 0
        self.recent: deque[str] = deque(maxlen=KEPT_LINES)
        self.error: str | None = None
        self.image_id: str | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.error = plain((chunk.get("errorDetail") or {}).get("message") or chunk["error"])
        if isinstance(chunk.get("aux"), dict) and "ID" in chunk["aux"]:
            self.image_id = chunk["aux"]["ID"]
        for text in (chunk.get("stream") or "").splitlines():
            self._text(plain(text).rstrip())

    def _text(self, text: str) -> None:
        if not text:
            return
        found = STEP.match(text)
        if found:
            self.steps = (int(found[1]), int(found[2]))
            self.step = text
            self.recent.clear()
            self.display.line(f"{_bar(*self.steps)} {text}")
            return
        if text.strip() == "---> Using cache":
            self.cached += 1
        if text.lstrip().startswith("--->") or text.startswith(("Removing intermediate", "Successfully")):
            return  # the engine's bookkeeping, not the step's output
        self.recent.append(text)
        if self.verbose or not self.display.tty:
            self.display.line(f"  {text}")
        else:
            self.display.status(f"  {text}")

    def finish(self) -> None:
        self.display.end()

    def failure(self) -> str:
        where = f"at {self.step}" if self.step else "before the first step"
        tail = "\n".join(f"  | {line}" for line in self.recent)
        return f"image build failed {where}\n{tail}\n{self.error}" if tail else \
            f"image build failed {where}: {self.error}"


class PushProgress:
    """Feed it the push stream; a byte-count bar (terminal) or one line per finished layer (piped)."""

    def __init__(self, out: TextIO) -> None:
        self.display = _Display(out)
        self.layers: dict[str, tuple[int, int]] = {}  # layer -> (bytes sent, size), once its size is known
        self.seen: set[str] = set()
        self.done: set[str] = set()
        self.error: str | None = None
        self.digest: str | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.error = plain((chunk.get("errorDetail") or {}).get("message") or chunk["error"])
            return
        if isinstance(chunk.get("aux"), dict) and "Digest" in chunk["aux"]:
            self.digest = chunk["aux"]["Digest"]
        layer, status = chunk.get("id"), chunk.get("status") or ""
        if not layer or layer in self.done:
            return
        self.seen.add(layer)
        detail = chunk.get("progressDetail") or {}
        if detail.get("total"):  # the engine's count can pass its own total (headers, retries): capped
            self.layers[layer] = (min(detail.get("current", 0), detail["total"]), detail["total"])
        if status in ("Pushed", "Layer already exists") or status.startswith("Mounted from"):
            self.done.add(layer)
            size = self.layers.get(layer, (0, 0))[1]
            self.layers[layer] = (size, size)
            self.display.line(f"  layer {layer}: {status.lower()}" + (f" ({_size(size)})" if size else ""))
        sent = sum(current for current, _ in self.layers.values())
        total = sum(size for _, size in self.layers.values())
        self.display.status(f"{_bar(sent, total)} pushing: {_size(sent)} of {_size(total)}, "
                            f"{len(self.done)} of {plural(len(self.seen), 'layer')} done")

    def finish(self) -> None:
        self.display.end()
