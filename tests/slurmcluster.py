"""A real Slurm cluster on loopback for the tests: Debian's munged, slurmctld and one ``slurmd -N NAME`` per node,
all on one host, each with this directory's config, key, sockets and ports; stopped by the pids it started.

Slurm runs its daemons as root (SlurmUser=root); the suite runs as root where it installs the packages.
Test modules import the fixtures ``slurm_cluster`` (one per session) and ``slurm`` (a test's view of it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import require

from launcher.node.torchrun.childproc import die_with_parent

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
START_SECONDS = 60


def missing_tools() -> list[str]:
    return [tool for tool in DAEMONS if shutil.which(tool) is None]


def _free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 a moment ago (held open together, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SlurmCluster:
    """``nodes`` slurmd daemons n1..nN with ``cpus`` CPUs each, in one partition ``debug``."""

    def __init__(self, root: Path, nodes: int = 3, cpus: int = 2):
        self.root = root
        self.names = [f"n{i}" for i in range(1, nodes + 1)]
        self.processes: list[subprocess.Popen] = []
        for sub in ("state", "spool", "log", "munge"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        os.chmod(root / "munge", 0o755)  # munged wants its socket's directory world-executable
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, *node_ports = _free_ports(1 + nodes)
        self.socket = root / "munge" / "munge.sock"
        self.conf = root / "slurm.conf"
        node_lines = "\n".join(f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
                               "State=UNKNOWN" for name, port in zip(self.names, node_ports))
        self.conf.write_text(f"""\
ClusterName=launchertest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=15
MinJobAge=600
{node_lines}
PartitionName=debug Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP
""")

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _start(self, argv: list[str], log: str) -> None:
        with open(self.root / "log" / log, "ab") as out:
            # a test session killed before its teardown (a CI timeout, a Ctrl-C) takes the daemons with it
            self.processes.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                   env={**os.environ, **self.env}, start_new_session=True,
                                                   preexec_fn=die_with_parent()))

    def start(self) -> "SlurmCluster":
        munge = self.root / "munge"
        self._start(["munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={munge}/munge.key",
                     f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/seed",
                     f"--log-file={self.root}/log/munged.log"], "munged.out")
        self._wait(lambda: self.socket.exists(), "munged's socket")
        self._start(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld.out")
        for name in self.names:
            self._start(["slurmd", "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{name}.out")
        self._wait(lambda: self.idle() == len(self.names), f"{len(self.names)} idle nodes in sinfo")
        return self

    def idle(self) -> int:
        shown = self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
        return sum(1 for line in shown.splitlines() if line.split()[1:] == ["idle"])

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_SECONDS
        while not ready():
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((self.root / "log").iterdir()))
                raise RuntimeError(f"the test Slurm cluster did not come up ({what}):\n{logs}")
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while starting; logs in {self.root / 'log'}")
            time.sleep(0.2)  # the daemons announce readiness nowhere but in what sinfo shows

    def resume(self, node: str) -> None:
        """A node a test marked down is back in service (once every node is idle again)."""
        self.command("scontrol", "update", f"nodename={node}", "state=resume", check=False)  # may be back already
        self._wait(lambda: not re.search(r"down|drain|fail", self.command(
            "sinfo", "-h", "-n", node, "-o", "%t", check=False).stdout), f"{node} back in service")

    def command(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=60, check=check)

    def stop(self) -> None:
        """End every job of this cluster, then stop the daemons it started (each in its own session), by pid."""
        if self.processes and self.processes[-1].poll() is None:
            self.command("scancel", "--user=root", check=False)  # this cluster's controller: only its own jobs
            deadline = time.monotonic() + 30
            while self.command("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.2)  # the controller has no event for "every job ended"
        for proc in reversed(self.processes):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = missing_tools()
    require(not missing, f"Slurm is not installed ({', '.join(missing)}): apt-get install slurmctld slurmd "
                         "slurm-client munge")
    require(os.geteuid() == 0, "the test Slurm cluster runs its daemons as root")
    # four nodes: runs of three, and a fourth for the one-node jobs that start a lost node again
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=4).start()
    try:
        yield cluster
    finally:
        cluster.stop()


LEFT_JOB_SECONDS = 30  # a run's jobs end this soon after its client returns (the tests' own bound)


@pytest.fixture
def slurm(slurm_cluster, monkeypatch):
    """The session's cluster, with this test's environment (and the CLI it starts) pointed at it. A job the test
    left running fails the test, with what Slurm and the job's output say, and is cancelled: the next test
    starts on an empty cluster (one left job once failed three tests after it)."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    yield slurm_cluster
    deadline = time.monotonic() + LEFT_JOB_SECONDS
    left = slurm_cluster.command("squeue", "-h", "-o", "%i", check=False).stdout.split()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)  # squeue has no wait; jobs end on their own within the bound
        left = slurm_cluster.command("squeue", "-h", "-o", "%i", check=False).stdout.split()
    if not left:
        return
    said = []
    for job in left:
        shown = slurm_cluster.command("scontrol", "show", "job", job, check=False).stdout
        said.append(shown)
        output = re.search(r"StdOut=(\S+)", shown)
        if output and Path(output[1]).is_file():
            said.append("its output, last lines:\n" + "\n".join(Path(output[1]).read_text(errors="replace")
                                                               .splitlines()[-40:]))
    slurm_cluster.command("scancel", *left, check=False)
    pytest.fail(f"jobs {', '.join(left)} still ran {LEFT_JOB_SECONDS}s after the test:\n" + "\n".join(said))
