"""Imported by every training process at start (its directory leads PYTHONPATH; see launcher.node.diagnosis.stacks).

It lets the node ask a training process for its Python stacks without stopping it: the stack
signal (``LAUNCHER_STACK_SIGNAL``) makes faulthandler write every thread's stack to ``LOCAL_RANK.stack`` in
``LAUNCHER_STACKS_DIR``, and a thread writes the process's progress beside it (launcher/data/rankprogress.py,
for the node's health sampler). Processes that are not training processes (torchrun itself, no
``LOCAL_RANK``) are left alone; a warm interpreter (launcher.node.torchrun.warm_interpreter) calls
:func:`register_rank_hooks` again once it knows its rank. Then the next ``sitecustomize`` on the path, if any, runs
as it would have without this one.
"""

import os
import sys


def register_stack_dump() -> None:
    directory, local_rank = os.environ.get("LAUNCHER_STACKS_DIR"), os.environ.get("LOCAL_RANK")
    signal_number = os.environ.get("LAUNCHER_STACK_SIGNAL", "")
    if not directory or local_rank is None or not signal_number.isdigit():
        return
    import faulthandler

    try:
        handle = open(os.path.join(directory, f"{local_rank}.stack"), "w")  # noqa: SIM115 - open for life
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        faulthandler.register(int(signal_number), file=handle, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):  # never in the way of training: no stacks, that is all
        return
    sys.launcher_stack_file = handle  # kept alive: faulthandler writes to its descriptor


PROGRESS_MODULE = "launcher.data.rankprogress"


def start_progress() -> None:
    """Start counting the process's steps. The module is loaded from its file, not imported through launcher's
    package, so that a module of the script's named ``launcher`` is not shadowed; ``launcher.data.report`` finds
    this very module in ``sys.modules``."""
    if not os.environ.get("LAUNCHER_STACKS_DIR") or os.environ.get("LOCAL_RANK") is None:
        return
    try:
        module = sys.modules.get(PROGRESS_MODULE)
        if module is None:
            import importlib.util

            here = os.path.dirname(os.path.abspath(__file__))
            path = os.path.join(here, os.pardir, os.pardir, os.pardir, "data", "rankprogress.py")
            spec = importlib.util.spec_from_file_location(PROGRESS_MODULE, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[PROGRESS_MODULE] = module
        module.start()
    except Exception:  # noqa: BLE001 - never in the way of training: no progress, that is all
        return


def register_rank_hooks() -> None:
    register_stack_dump()
    start_progress()


def _run_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


register_rank_hooks()
_run_next_sitecustomize()
