"""A training process started before it is needed: a fresh interpreter that imports torch, then waits to be told
which script to run, for which rank (:mod:`launcher.node.warmstart` sends that from torchrun's process).

``python -u -m launcher.node.warm_interpreter FD``: FD is its end of a socket pair. The command comes as one
JSON object (the script or module, its arguments, the environment torchrun gives the rank, the working
directory), with the descriptors of the rank's output. The process then becomes what ``python -u train.py``
would be, less the second of torch's import: the output, environment, ``sys.argv``, ``sys.path[0]`` and a fresh
``__main__`` of that start, launcher's rank hooks, and the interpreter's own handling of the script's end
(threads joined, ``atexit``, files flushed, the exit status of an exception or of Ctrl-C). It is a process of
its own from the start (never a fork), so nothing of torchrun's is in it. Closing the socket with no command
ends it at once.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from types import TracebackType

import torch  # noqa: F401 - the reason this process exists: imported before its rank needs it

MAX_MESSAGE = 1 << 20


def receive(channel: socket.socket) -> tuple[dict, list[int]] | None:
    """The command and the descriptors sent with it; None when the other end closed with nothing."""
    data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 2)
    chunks = [data]
    while data:
        data = channel.recv(MAX_MESSAGE)
        chunks.append(data)
    body = b"".join(chunks)
    if not body:
        return None
    return json.loads(body), fds


def become(command: dict, fds: list[int]) -> None:
    """This process as a fresh start of the command would be, up to the script's first line."""
    for target, fd in zip(command["outputs"], fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(command["env"])
    if os.getcwd() != command["cwd"]:
        os.chdir(command["cwd"])
    hooks = sys.modules.get("sitecustomize")  # launcher's rank hooks ran at this start, before there was a rank
    if hasattr(hooks, "register_stack_dump"):
        hooks.register_stack_dump()
    sys.orig_argv = [sys.executable, "-u", *(["-m"] if command["kind"] == "module" else []), command["name"],
                     *command["args"]]
    usual_hook = sys.excepthook

    def show_users_part(kind: type, value: BaseException, tb: TracebackType | None) -> None:
        users = users_part(tb)  # the hook prints the exception's own traceback, where it has one
        usual_hook(kind, value.with_traceback(users) if isinstance(value, BaseException) else value, users)

    sys.excepthook = show_users_part


def run(command: dict) -> None:
    """The script or module as ``__main__``, in a module of its own (this one's globals stay apart)."""
    import runpy
    import types

    if command["kind"] == "module":  # what `python -m` calls, its errors ("No module named ...") included
        sys.argv = ["-m", *command["args"]]
        sys.path[0] = os.getcwd()
        sys.modules["__main__"] = types.ModuleType("__main__")
        runpy._run_module_as_main(command["name"], alter_argv=True)
        return
    import builtins
    import importlib.machinery
    import io

    path = os.path.abspath(command["name"])
    sys.argv = [command["name"], *command["args"]]
    sys.path[0] = os.path.dirname(os.path.realpath(path))  # as the interpreter computes it: links resolved
    main = types.ModuleType("__main__")
    main.__file__, main.__builtins__, main.__cached__ = path, builtins, None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    with io.open_code(path) as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def users_part(traceback: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's own first frame, as a fresh interpreter shows it (this module's and
    runpy's frames dropped; none left for a script that did not compile)."""
    while traceback is not None and (traceback.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
                                     or traceback.tb_frame.f_code.co_filename.endswith("runpy.py")):
        traceback = traceback.tb_next
    return traceback


if __name__ == "__main__":
    with socket.socket(fileno=int(sys.argv[1])) as _channel:
        _received = receive(_channel)
    if _received is None:
        os._exit(0)  # never needed: nothing to finalise, and torch's teardown takes a second
    become(*_received)
    run(_received[0])
