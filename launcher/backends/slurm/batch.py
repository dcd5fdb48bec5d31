"""A plan as one Slurm batch job: the exact ``sbatch`` command line and batch script. Pure: no I/O.

The script exports what every node shares, runs the spec's ``setup`` lines and starts one task per
node with ``srun``; each task runs :mod:`launcher.node.engines.slurm`, which takes its node name from
``SLURM_NODEID`` in the spec's order (main first) and its group's own env from its arguments. Every
option goes on the ``sbatch`` command line, one token each, never through a shell; the script's only
shell is the user's ``setup``.
"""

from __future__ import annotations

import shlex
import sys
from typing import TYPE_CHECKING, Mapping, Sequence

from launcher.backends.indexed import group_env, shared_env
from launcher.backends.slurm.engine import time_limit_seconds
from launcher.node.engines.indexed import group_argv
from launcher.node.engines.slurm_limit import NOTICE_VARIABLE, ranks_grace
from launcher.plan import Plan
from launcher.spec.model import SlurmInfra, Spec

if TYPE_CHECKING:
    from launcher.runs.state import RunInfo

JOB_NAME_PREFIX = "launcher:"  # the job's name is this and the run id: how a run's jobs are found
NODE_ENTRY = "launcher.node.engines.slurm"
SRUN_KEEPER = "launcher.node.engines.slurm_srun"
CODE_DIR_VARIABLE = "LAUNCHER_CODE_DIR"
SETUP_GUARD = ("set -e; trap 'code=$?; echo \"launcher: the spec'\"'\"'s setup failed on $(hostname) (exit $code): "
               "$BASH_COMMAND\" >&2' ERR\n")
# options launcher sets itself (sbatch_argv, one_node_argv): sbatchOptions must not change them
OWN_OPTIONS = ("--parsable", "--job-name", "-J", "--nodes", "-N", "--ntasks-per-node", "--chdir", "-D", "--output",
               "-o", "--export", "--requeue", "--no-requeue", "--comment", "--no-kill", "-k", "--ntasks", "-n")
NOTICE_SIGNAL = "USR1"  # Slurm sends it to every task of the job's steps timeLimitNotice before its time limit
NOTICE_SHARE = 4  # the notice is at most a quarter of the time limit: a short limit never stops a job as it starts
NOTICE_MAX_SECONDS = 65535  # the most sbatch --signal takes
# srun must not end the step when one task fails (an elastic run goes on without it), nor kill the others
SRUN_OPTIONS = ("--no-kill", "--kill-on-bad-exit=0", "--ntasks-per-node=1")


def infra_of(spec: Spec) -> SlurmInfra:
    return spec.infra if isinstance(spec.infra, SlurmInfra) else SlurmInfra()


def job_name(run_id: str) -> str:
    return f"{JOB_NAME_PREFIX}{run_id}"


def python_of(infra: SlurmInfra) -> str:
    """The nodes' interpreter: the spec's; else this launcher's own, for a virtual environment on a filesystem
    the nodes share."""
    return infra.python or sys.executable


def gpus_per_node(spec: Spec) -> int | None:
    """--gpus-per-node: the spec's gpusPerNode (0: none); else processesPerNode where the spec gives a number (one
    GPU per training process); none for ``auto``, which counts on each node what it sees, or no processesPerNode."""
    infra = infra_of(spec)
    if infra.gpus_per_node is not None:
        return infra.gpus_per_node or None
    written = spec.data.get("spec", {}).get("cluster", {}).get("spec", {}).get("processesPerNode")
    return written if isinstance(written, int) else None  # not the default of 1: CPU clusters have no GPUs to ask


def asked_partition(argv: Sequence[str]) -> str | None:
    """The partition an ``sbatch`` command line asks for: the last one it gives (None: the cluster's default)."""
    asked = None
    for token, following in zip(argv, [*argv[1:], None]):
        if token.startswith("--partition="):
            asked = token.split("=", 1)[1]
        elif token in ("-p", "--partition"):
            asked = following
        elif token.startswith("-p") and not token.startswith("--"):
            asked = token[2:]
    return asked


def notice_seconds(infra: SlurmInfra) -> int | None:
    """How long before the time limit Slurm signals the nodes (None: the job has no limit): timeLimitNotice, at most
    a quarter of the limit."""
    limit = time_limit_seconds(infra.time)
    if limit is None:
        return None
    return max(1, min(infra.time_limit_notice, limit // NOTICE_SHARE, NOTICE_MAX_SECONDS))


def notice_capped(infra: SlurmInfra) -> str | None:
    """A note where the notice Slurm is asked for is shorter than timeLimitNotice (None: it is not)."""
    notice = notice_seconds(infra)
    if notice is None or notice >= infra.time_limit_notice:
        return None
    return (f"timeLimitNotice: the nodes are told {notice}s before the time limit, not {infra.time_limit_notice}s: "
            f"the notice is at most a quarter of the job's time ({infra.time}), so that it never stops a job as it "
            "starts")


def sbatch_argv(plan: Plan, output: str) -> list[str]:
    """``sbatch`` with every option of the spec; the script comes on stdin. ``output``: the batch script's console."""
    spec = plan.spec
    infra = infra_of(spec)
    argv = ["sbatch", "--parsable", f"--job-name={job_name(plan.run_id)}", f"--comment=launcher run {plan.run_id}",
            f"--nodes={len(plan.nodes)}", "--ntasks-per-node=1", f"--chdir={spec.base_dir}", f"--output={output}",
            "--export=ALL", "--no-requeue"]
    for option, value in (("partition", infra.partition), ("account", infra.account), ("qos", infra.qos),
                          ("reservation", infra.reservation), ("constraint", infra.constraint),
                          ("time", infra.time), ("cpus-per-task", infra.cpus_per_node), ("mem", infra.memory),
                          ("gpus-per-node", gpus_per_node(spec))):
        if value is not None:
            argv.append(f"--{option}={value}")
    if infra.exclusive:
        argv.append("--exclusive")
    if spec.cluster.recovery:  # a node's failure must not end the job: the others go on, the lost one is replaced
        argv.append("--no-kill")
    notice = notice_seconds(infra)
    if notice:  # to the steps' tasks, not the batch shell: each node saves and stops before the limit
        argv.append(f"--signal={NOTICE_SIGNAL}@{notice}")
    return argv + list(infra.sbatch_options)


def node_argv(plan: Plan, shared: Mapping[str, str]) -> list[str]:
    """What ``srun`` starts on every node: the Slurm entry of the bootstrap, with each group's own env."""
    return [python_of(infra_of(plan.spec)), "-m", NODE_ENTRY, *group_argv(group_env(plan, shared))]


def batch_script(plan: Plan, node_output: str) -> str:
    """The batch script; ``node_output``: srun's --output pattern for each node's console (``%n``: node index)."""
    spec = plan.spec
    infra = infra_of(spec)
    shared = shared_env(plan.nodes)
    shared[CODE_DIR_VARIABLE] = str(spec.base_dir)
    notice = notice_seconds(infra)
    if notice:
        shared[NOTICE_VARIABLE] = str(notice)
        shared.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(ranks_grace(notice)))  # torchrun's wait for its ranks
    lines = ["#!/bin/bash",
             f"# launcher run {plan.run_id}: {len(plan.nodes)} nodes of {spec.source or 'a spec'}",
             "# The node names, in SLURM_NODEID order: " + " ".join(plan.node_names)]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in shared.items()]
    # no --nodes or --ntasks: one task per node of the job's own allocation, so the same script serves a one-node
    # job that starts a lost node again (replacement_argv)
    srun = ["srun", *SRUN_OPTIONS, f"--output={node_output}"]
    command = node_argv(plan, shared)
    if infra.setup.strip():
        lines.append("# setup, from the spec: run by each node's task before the node starts")
        # bash -c SETUP; exec "$@": the user's lines run on each node, then the node replaces that shell; a line
        # that fails stops the node there, saying so
        command = ["bash", "-c", SETUP_GUARD + infra.setup.strip() + '\nexec "$@"', "launcher-setup", *command]
    # exec: srun's keeper (slurm_srun) is the batch script's process; srun itself is out of reach of a cancel's
    # SIGTERM, on which it would SIGKILL the nodes at once instead of leaving them KillWait to stop
    lines.append("exec " + shlex.join([python_of(infra), "-m", SRUN_KEEPER, *srun, *command]))
    return "\n".join(lines) + "\n"


def one_node_argv(argv: Sequence[str], label: str) -> list[str]:
    """The run's ``sbatch`` command line for a one-node job of its batch script (a lost node started again, a node
    `launcher scale` adds), named after the run and ``label``; which node it runs comes through sbatch's
    environment, which the script leaves as it is (:data:`launcher.node.engines.slurm.ONE_NODE`)."""
    return ["--nodes=1" if token.startswith("--nodes=") else
            f"{token}:{label}" if token.startswith("--job-name=") else token for token in argv]


def attempt_argv(info: RunInfo, attempt: tuple[int, int] | None) -> list[str]:
    """The run's ``sbatch`` command line for ``attempt`` (number, restarts; None: the first), whose jobs are named
    after the attempt (``launcher:RUN.2``) so that each job of the run has a name of its own to be found by."""
    argv = list(info.backend_ids["sbatch"])
    if attempt is None:
        return argv
    return [f"--job-name={job_name(f'{info.run_id}.{attempt[0]}')}" if token.startswith("--job-name=") else token
            for token in argv]


def own_option_clashes(spec: Spec) -> list[str]:
    """The sbatchOptions that would change what launcher sets itself (node count, name, output, environment)."""
    clashes = []
    for token in infra_of(spec).sbatch_options:
        name = token.split("=", 1)[0]
        if name in OWN_OPTIONS or any(name.startswith(short) and len(name) > 2 for short in OWN_OPTIONS
                                      if len(short) == 2):
            clashes.append(token)
    return clashes
