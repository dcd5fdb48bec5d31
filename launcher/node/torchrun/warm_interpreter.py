"""A training process started before it is needed: a fresh interpreter that imports torch, then waits to be told
which script to run, for which rank (:mod:`launcher.node.torchrun.warmstart` sends that from torchrun's process).

Started as ``python -u -c "exec(compile(THIS_FILE's text, THIS_FILE, 'exec'))" FD``: this file runs as
the interpreter's own ``__main__``, so the script later runs in that very module (what ``multiprocessing``
recorded as ``__mp_main__`` while torch was imported stays right), and nothing of launcher's package is
imported (a module of the script's named ``launcher`` is not shadowed). It imports only the standard library
and torch. FD is its end of a socket pair. The command comes as one JSON object (the script or module, its
arguments, the environment torchrun gives the rank, the working directory), with the descriptors of the rank's
output. The process then becomes what ``python -u train.py`` would be, less the second of torch's import: the
output, environment, signal dispositions, ``sys.argv``, ``sys.path[0]``, a ``__main__`` holding nothing of this
file's, launcher's rank hooks, and the interpreter's own handling of the script's end (threads joined,
``atexit``, files flushed, the exit status of an exception or of Ctrl-C). Closing the socket with no command ends
it at once.

The spare torchrun starts from this file too (``... --spare PROCESSES``): once torch is imported it forks its
first warm interpreter (:func:`fork_interpreter`) and only then becomes torchrun, so that one torch import serves
both. The fork is made before any of torchrun's or launcher's code has run: the child holds the same modules, the
same ``__main__`` and the same state as a warm interpreter spawned on its own, and carries on as one. What it
shares with its parent, the hash seed and the random state of modules other than ``random`` (which reseeds at a
fork), it shares with the spare torchrun only: the other warm interpreters are spawned, each a process of its own.
"""

import json
import os
import signal
import socket
import sys

import torch  # noqa: F401 - the reason this process exists: imported before its rank needs it

MAX_MESSAGE = 1 << 20
# What a warm interpreter imports besides torch while it waits (comma-separated; unset or empty: torch only). Naming
# torch._dynamo, which DistributedDataParallel imports as it is constructed, saves 0.8 s of a rank's start here, 2 s
# with four at once on two cores. Not the default: a rank once hung at exit with it (gloo's teardown waiting for the
# GIL), and that it had no part in that is not shown yet.
WARM_IMPORTS_ENV = "LAUNCHER_WARM_IMPORTS"
DEFAULT_WARM_IMPORTS = ""
# The signals torchrun catches while its training processes run: a process it starts gets them at their defaults
TORCHRUN_CAUGHT = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def import_ahead():
    """Import what the script will import anyway (WARM_IMPORTS_ENV), before it is handed its rank; a module this
    torch lacks is left for the script to ask for itself."""
    import importlib

    for name in os.environ.get(WARM_IMPORTS_ENV, DEFAULT_WARM_IMPORTS).split(","):
        if name.strip():
            try:
                importlib.import_module(name.strip())
            except Exception:  # noqa: BLE001 - never a reason for the warm interpreter to fail
                pass


def receive(channel):
    """(the command, the descriptors sent with it); None when the other end closed with nothing."""
    data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 2)
    chunks = [data]
    while data:
        data = channel.recv(MAX_MESSAGE)
        chunks.append(data)
    body = b"".join(chunks)
    return (json.loads(body), fds) if body else None


def become(command, fds):
    """This process as a fresh start of the command would be, up to the script's first line."""
    for target, fd in zip(command["outputs"], fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(command["env"])
    if os.getcwd() != command["cwd"]:
        os.chdir(command["cwd"])
    for signum in TORCHRUN_CAUGHT:  # here they are as this process inherited them (a supervisor ignores SIGHUP)
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    hooks = sys.modules.get("sitecustomize")  # launcher's rank hooks ran at this start, before there was a rank
    if hasattr(hooks, "register_rank_hooks"):
        hooks.register_rank_hooks()
    module = command["kind"] == "module"
    sys.orig_argv = [sys.executable, "-u", *(["-m"] if module else []), command["name"], *command["args"]]
    sys.argv = ["-m" if module else command["name"], *command["args"]]
    path = os.path.abspath(command["name"])
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.realpath(path))  # links resolved, as Python does
    sys.excepthook = users_part_hook(sys.excepthook, (become.__code__.co_filename, "<string>"))


_HOOK = """
def show_users_part(kind, value, tb):
    while tb is not None and tb.tb_frame.f_code.co_filename in OURS:
        tb = tb.tb_next
    # the hook prints the exception's own traceback, where it has one
    USUAL(kind, value.with_traceback(tb) if isinstance(value, BaseException) else value, tb)
"""


def users_part_hook(usual, ours):
    """An excepthook: ``usual``, given the traceback from the script's first frame (the frames of files in ``ours``
    dropped). Made in a namespace of its own: a function of this file would keep ``__main__``'s namespace, the
    script's, alive at exit past the modules its objects need to end (a gzip file left open lost its end)."""
    namespace = {"USUAL": usual, "OURS": ours}
    exec(_HOOK, namespace)
    return namespace["show_users_part"]


def main_code(command):
    """(the code to run, ``__main__``'s namespace emptied of this file's names and set up as a fresh start's)."""
    import importlib.machinery
    import io

    namespace = sys.modules["__main__"].__dict__
    builtins = namespace["__builtins__"]
    if command["kind"] == "module":  # what `python -m` runs, its errors ("No module named ...") included
        code = compile(f"__import__('runpy')._run_module_as_main({command['name']!r}, True)", "<string>", "exec")
        extra = {}
    else:
        path = os.path.abspath(command["name"])
        with io.open_code(path) as handle:
            code = compile(handle.read(), path, "exec", dont_inherit=True)
        extra = {"__file__": path, "__cached__": None,
                 "__loader__": importlib.machinery.SourceFileLoader("__main__", path)}
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None, __builtins__=builtins,
                     __annotations__={}, **extra)
    return code, namespace


SPARE = "--spare"  # launcher.node.torchrun.warmstart.SPARE_ARG (this file imports nothing of launcher's before it forks)


def fork_interpreter():
    """In the spare torchrun's process, right after its torch import: (the pid of a child that is this interpreter
    as it stands, our end of its socket). In that child: (None, the fd of its end), once it is what a warm
    interpreter started on its own is (its own session, stdin from /dev/null, no other descriptor, SIGTERM when
    the spare dies)."""
    ours, theirs = socket.socketpair()
    spare = os.getpid()
    pid = os.fork()
    if pid:
        theirs.close()
        return pid, ours
    ours.close()
    kept = theirs.detach()
    os.setsid()
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != spare:  # the spare died before the line above
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd in map(int, os.listdir("/proc/self/fd")):  # what a spawned process's close_fds leaves: 0, 1, 2 and ours
        if fd > 2 and fd != kept:
            try:
                os.close(fd)
            except OSError:  # the directory listing's own descriptor, closed already
                pass
    return None, kept


if __name__ == "__main__":
    if sys.argv[1] == SPARE:  # this process is the spare torchrun (launcher.node.torchrun.spare): its first warm interpreter
        child, end = fork_interpreter()  # is a fork of it, made now, so that torch is imported once for both
        if child is not None:
            from launcher.node.torchrun.shim import run_spare

            run_spare(int(sys.argv[2]), child, end)  # never returns
        channel_fd = end
    else:
        channel_fd = int(sys.argv[1])
    import_ahead()
    with socket.socket(fileno=channel_fd) as channel:
        received = receive(channel)
    if received is None:
        os._exit(0)  # never needed: nothing to finalise, and torch's teardown takes a second
    become(*received)
    exec(*main_code(received[0]))  # `exec` comes from the builtins: the namespace holds none of this file's names
