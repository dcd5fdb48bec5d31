"""The bootstrap's entry in a Slurm task: which node this task is, and whether it sees what the client wrote.

``srun`` starts one task per allocated node with the same command line (:mod:`launcher.backends.slurm.batch`):
each task takes its node name from ``SLURM_NODEID`` in the spec's order (main first), or from the client for a
one-node job (``LAUNCHER_SLURM_NODE``: a lost node started again, a node `launcher scale` adds), adds its group's own env
(``--main-env NAME=VALUE``, ``--worker-env NAME=VALUE``) and checks that the spec's directory and a local work
dir are the ones the client used, which they are only on a filesystem the nodes share with it. Then it runs
the bootstrap (:mod:`launcher.node.main`) as its child and stays its parent on this machine: a bootstrap that
dies without reporting (SIGKILL, the OOM killer) has its end recorded here, as the local backend's supervisor
does, so that its peers stop, or, in a recovering run, meet without it in the next round.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile

from launcher.node.engines import indexed
from launcher.node.main import EXIT_BAD_ENV

# a one-node job's node, set in sbatch's environment: {"name", "incarnation" (a lost node started again),
# "groups" (a node `launcher scale` adds, with the groups grown to hold it)}
ONE_NODE = "LAUNCHER_SLURM_NODE"
# a retried run's job (and its one-node jobs), set in sbatch's environment: [attempt number, restarts used so far];
# the task moves the node into the attempt's namespace (launcher.runs.attempts.node_env)
ATTEMPT = "LAUNCHER_SLURM_ATTEMPT"
SHARED_FS_HINT = ("launcher runs your code and meets the other nodes there, so it must be on a filesystem every "
                  "node mounts at the same path as the machine you ran launcher on (your home or a shared "
                  "/scratch on most clusters); or use an s3:// or oci:// work dir")


def one_node(env: os._Environ) -> str | None:
    """A one-node job's node (a lost node started again, a node `launcher scale` adds), as the client submitted it:
    its name, incarnation and groups go into the node's env; None for the run's own job."""
    given = env.pop(ONE_NODE, None)
    if not given:
        return None
    node = json.loads(given)
    if node.get("incarnation"):
        env["LAUNCHER_NODE_INCARNATION"] = str(node["incarnation"])
    if node.get("groups"):
        env["LAUNCHER_NODE_GROUPS"] = json.dumps(node["groups"])
    return node["name"]


def in_attempt(env: os._Environ) -> None:
    """A retried run's task: its node's run id, namespace, what it restores and the restarts left, as the client's
    attempt (:data:`ATTEMPT`) says; the run as submitted otherwise."""
    from launcher.runs.attempts import node_env

    given = env.pop(ATTEMPT, None)
    if not given:
        return
    number, restarts = json.loads(given)
    max_restarts = int(json.loads(env.get("LAUNCHER_RECOVERY") or "{}").get("maxRestarts", 0))
    env.update(node_env(dict(env), number, restarts, max_restarts))


def visibility_problem(env: dict[str, str]) -> str | None:
    """Why this machine does not see the run as the client left it (None: it does)."""
    from launcher.workdirs import scheme

    code = env.get("LAUNCHER_CODE_DIR", "")
    if code and not os.path.isdir(code):
        return f"the spec's directory {code} is not on this machine: {SHARED_FS_HINT}"
    work_dir = env.get("LAUNCHER_WORK_DIR", "")
    if work_dir and scheme(work_dir) == "file":
        run = os.path.join(work_dir, env.get("LAUNCHER_RUN_ID", ""))
        if not os.path.isfile(os.path.join(run, "run.json")):
            return f"the work dir {work_dir} on this machine does not hold the run's record ({run}/run.json): " \
                   f"{SHARED_FS_HINT}"
    return None


def slurm_address(node: str) -> str | None:
    """The address Slurm reaches this machine at (its NodeAddr): on clusters, the network the nodes share."""
    try:
        shown = subprocess.run(["scontrol", "-o", "show", "node", node], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(token.split("=", 1) for token in shown.stdout.split() if "=" in token)
    address = fields.get("NodeAddr")
    if not address or shown.returncode != 0:
        return None
    try:
        return socket.gethostbyname(address)
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = indexed.group_args(argv, "python -m launcher.node.engines.slurm")
    env = os.environ
    try:
        name = one_node(env) or indexed.name_at(env, "SLURM_NODEID")
    except (KeyError, ValueError) as exc:
        print(f"launcher node on {socket.gethostname()}: cannot tell which node this task is: {exc}", file=sys.stderr)
        return EXIT_BAD_ENV
    indexed.become(env, name, args)
    problem = visibility_problem(dict(env))
    if problem:
        said = f"launcher node {name} on {socket.gethostname()}: {problem}"
        print(said, file=sys.stderr)
        _record_refusal(env, name, said)
        return EXIT_BAD_ENV
    in_attempt(env)
    os.chdir(env.get("LAUNCHER_CODE_DIR") or os.getcwd())
    if not env.get("LAUNCHER_NODE_ADDRESS") and not any(env.get(v) for v in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")):
        address = slurm_address(env.get("SLURMD_NODENAME", ""))
        if address:
            env["LAUNCHER_SLURM_NODE_ADDRESS"] = address
    return keep(name, env)


def _record_refusal(env: os._Environ, name: str, said: str) -> None:
    """Where this machine reaches the run's work dir at all (an object store; the shared filesystem, when only
    the spec's directory is missing), the node's failure goes there too, so that its peers stop and the user
    reads why, not a rendezvous timeout."""
    from launcher.protocol.control import record_failure
    from launcher.protocol.store import StoreError, WorkDir

    run_url = f"{env.get('LAUNCHER_WORK_DIR', '').rstrip('/')}/{env.get('LAUNCHER_RUN_ID', '')}"
    if "work dir" in said and "does not hold the run's record" in said:
        return  # a local work dir this machine does not share: writing there would reach nobody
    try:
        record_failure(WorkDir(run_url), name, None, EXIT_BAD_ENV, said)
    except (StoreError, OSError, ValueError):
        pass


def keep(name: str, env: os._Environ) -> int:
    """Run the bootstrap as a child; when it ends without a final status, record its end for it."""
    from launcher.node.leftovers import describe, save_leftovers
    from launcher.protocol.status import FINAL_STATES, status_key
    from launcher.protocol.store import StoreError, WorkDir
    from launcher.runs.supervision import EndRecorder, record_on_behalf

    from launcher.node.engines import slurm_limit
    from launcher.node.sigterm import SLURM_JOB

    for signum in (signal.SIGTERM, signal.SIGINT):  # Slurm signals every process of the step: the child too
        signal.signal(signum, signal.SIG_IGN)
    slurm_limit.hold()  # the time limit's notice: the bootstrap takes it, torchrun and the ranks never see it
    if env.get("SLURM_JOB_ID"):
        env[SLURM_JOB] = env["SLURM_JOB_ID"]
    child = subprocess.Popen([sys.executable, "-m", "launcher.node"], env=env,
                             preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGINT)])
    code = child.wait()
    try:
        run = EndRecorder(WorkDir(f"{env['LAUNCHER_WORK_DIR'].rstrip('/')}/{env['LAUNCHER_RUN_ID']}")).store_for(code)
        status = run.get_record(status_key(name))
        newer = int(status.get("incarnation") or 0) > int(env.get("LAUNCHER_NODE_INCARNATION") or 0)
        if status.get("state") not in FINAL_STATES and code != EXIT_BAD_ENV and not newer:  # newer: its replacement's
            exit_code, reason = describe(code)
            print(f"[launcher {name}] {reason}: recording its end", flush=True)
            save_leftovers(run, name, status)
            record_on_behalf(run, name, status, exit_code, reason, _console())
    except (StoreError, KeyError) as exc:
        print(f"[launcher {name}] could not record the node's end: {exc}", file=sys.stderr, flush=True)
    return 128 - code if code < 0 else code


def _console() -> str:
    """The file this task's output goes to (srun --output), for the work dir's copy of a dead node's console."""
    try:
        path = os.readlink("/proc/self/fd/1")
        if stat.S_ISREG(os.stat(path).st_mode):
            return path
    except OSError:
        pass
    handle, path = tempfile.mkstemp(prefix="launcher-console-", suffix=".log")
    os.write(handle, b"(this node's output went to Slurm's output of its task, not to a file here)\n")
    os.close(handle)
    return path


if __name__ == "__main__":
    sys.exit(main())
