"""Build and push progress as the engine streams it: a bar redrawn in place on a terminal, lines when piped,
and what a failure report quotes. The streams are the shapes Docker's API sends (decode=True chunks)."""

from __future__ import annotations

import io
import os

from launcher.image import progress as progress_module
from launcher.image.progress import BuildProgress, PushProgress

BUILD = [
    {"stream": "Step 1/3 : FROM base\n"}, {"stream": " ---> 4c39610ef133\n"},
    {"stream": "Step 2/3 : RUN pip install -r requirements.txt\n"}, {"stream": " ---> Running in 1234\n"},
    {"stream": "Collecting numpy\n"}, {"stream": "Installing collected packages: numpy\n"},
    {"stream": "Step 3/3 : COPY . /code\n"}, {"stream": " ---> Using cache\n"},
    {"aux": {"ID": "sha256:abc"}}, {"stream": "Successfully built abc\n"},
]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return 1  # the size asked for is the test's (os.get_terminal_size is replaced where it matters)


def shown(progress_class, chunks, out):
    """Feed ``chunks`` to a progress display writing to ``out``; return the display."""
    progress = progress_class(out)
    for chunk in chunks:
        progress.feed(chunk)
    progress.finish()
    return progress


def test_piped_build_prints_every_step_and_output_line():
    out = io.StringIO()
    progress = shown(BuildProgress, BUILD, out)
    lines = out.getvalue().splitlines()
    assert lines == ["[########................] Step 1/3 : FROM base",
                     "[################........] Step 2/3 : RUN pip install -r requirements.txt",
                     "  Collecting numpy", "  Installing collected packages: numpy",
                     "[########################] Step 3/3 : COPY . /code"]
    assert progress.image_id == "sha256:abc" and progress.cached == 1 and progress.error is None


def test_terminal_build_redraws_output_in_place():
    out = Terminal()
    shown(BuildProgress, BUILD, out)
    text = out.getvalue()
    assert "\r\033[K  Collecting numpy" in text and "\r\033[K  Installing collected packages: numpy" in text
    assert "  Collecting numpy\n" not in text  # output lines are status, not scrolled
    assert text.endswith("Step 3/3 : COPY . /code\n")


def test_a_failed_step_is_quoted_with_its_last_lines():
    progress = BuildProgress(io.StringIO())
    for chunk in BUILD[:6] + [{"error": "The command '/bin/sh -c pip install' returned a non-zero code: 1",
                               "errorDetail": {"message": "The command '/bin/sh -c pip install' returned a "
                                               "non-zero code: 1"}}]:
        progress.feed(chunk)
    report = progress.failure()
    assert report.splitlines() == ["image build failed at Step 2/3 : RUN pip install -r requirements.txt",
                                   "  | Collecting numpy", "  | Installing collected packages: numpy",
                                   "The command '/bin/sh -c pip install' returned a non-zero code: 1"]


PUSH = [
    {"status": "The push refers to repository [127.0.0.1:5000/train]"},
    {"status": "Preparing", "id": "aaa"}, {"status": "Preparing", "id": "bbb"},
    {"status": "Pushing", "id": "aaa", "progressDetail": {"current": 512, "total": 2048}},
    {"status": "Layer already exists", "id": "bbb"},
    {"status": "Pushing", "id": "aaa", "progressDetail": {"current": 2048, "total": 2048}},
    {"status": "Pushed", "id": "aaa"},
    {"status": "v1: digest: sha256:0123 size: 739"}, {"aux": {"Tag": "v1", "Digest": "sha256:0123", "Size": 739}},
]


def test_push_progress_piped_and_on_a_terminal():
    piped = io.StringIO()
    progress = shown(PushProgress, PUSH, piped)
    assert piped.getvalue().splitlines() == ["  layer bbb: layer already exists", "  layer aaa: pushed (2.0 KiB)"]
    assert progress.digest == "sha256:0123" and progress.error is None
    terminal = Terminal()
    shown(PushProgress, PUSH[:4], terminal)
    assert "pushing: 512 B of 2.0 KiB, 0 of 2 layers done" in terminal.getvalue()
    refused = PushProgress(io.StringIO())
    refused.feed({"error": "denied: requested access to the resource is denied",
                  "errorDetail": {"message": "denied: requested access to the resource is denied"}})
    assert refused.error == "denied: requested access to the resource is denied"


def test_the_push_count_never_passes_its_total():
    terminal = Terminal()
    shown(PushProgress, PUSH[:3] + [{"status": "Pushing", "id": "aaa", "progressDetail": {"current": 2800,
                                                                                            "total": 2048}}], terminal)
    assert terminal.getvalue().rstrip().endswith("pushing: 2.0 KiB of 2.0 KiB, 0 of 2 layers done")


def test_engine_escape_codes_never_reach_pipes_or_failure_quotes():
    out = io.StringIO()
    progress = BuildProgress(out)
    for chunk in [{"stream": "Step 1/1 : RUN make\n"}, {"stream": "\x1b[1;31merror:\x1b[0m no rule\r\n"},
                  {"error": "\x1b[31mreturned a non-zero code: 2\x1b[0m"}]:
        progress.feed(chunk)
    assert "\x1b" not in out.getvalue() and "  error: no rule" in out.getvalue().splitlines()
    assert progress.failure().splitlines()[1:] == ["  | error: no rule", "returned a non-zero code: 2"]
    early = BuildProgress(io.StringIO())
    early.feed({"error": "Cannot locate specified Dockerfile"})
    assert early.failure() == "image build failed before the first step: Cannot locate specified Dockerfile"


def test_terminal_status_lines_fit_the_terminal(monkeypatch):
    monkeypatch.setattr(progress_module.os, "get_terminal_size", lambda fd: os.terminal_size((40, 24)))
    out = Terminal()
    long_line = {"stream": "Downloading " + "x" * 200 + "\n"}
    shown(BuildProgress, [BUILD[0], long_line], out)
    redrawn = [part for part in out.getvalue().split("\r\033[K") if part.startswith("  Downloading")]
    assert redrawn and all(len(part.rstrip("\n")) <= 39 for part in redrawn)
