"""Error types, each carrying the process exit status the CLI reports for it.

Exit statuses (documented in the README):
  0  success
  1  the run failed (a node failed, was cancelled or timed out)
  2  bad input (spec, arguments, files)
  3  backend or infrastructure error (engine unreachable, store errors, ...)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_BACKEND = 3


class LauncherError(Exception):
    """Base class: a message meant for the user, plus an exit status."""

    exit_status = EXIT_BACKEND


class BadInput(LauncherError):
    exit_status = EXIT_BAD_INPUT


class SpecError(BadInput):
    """One or more problems in a spec file, reported together."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class BackendError(LauncherError):
    exit_status = EXIT_BACKEND


class RunFailed(LauncherError):
    exit_status = EXIT_RUN_FAILED
