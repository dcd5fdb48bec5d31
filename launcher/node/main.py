"""The node program: register, learn the rank, run torchrun, report, and never hang silently.

Exit status: 0 training succeeded; torchrun's exit status when training failed here;
1 when stopped because a peer failed or the rendezvous timed out; 124 when maxRuntime was
exceeded or training hung (hangTimeout); 130 when cancelled;
2 for a malformed environment or fewer GPUs than processesPerNode asks for; 3 when the work
dir cannot be reached.
"""

from __future__ import annotations

import collections
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO

from launcher.gpus import accelerator_report, visible_gpus
from launcher.node import outputs as outputs_mod
from launcher.node.cause import Cause, diagnose, lost_a_peer
from launcher.node.cause import describe as describe_cause
from launcher.node.control import ControlWatch, StopRequest, record_failure
from launcher.node.exits import signal_name
from launcher.node.logship import LogShipper
from launcher.node.netutil import free_port, own_address
from launcher.node.ranklogs import RankLogs
from launcher.node.rendezvous import (DECISION_KEY, Decision, RendezvousError, RendezvousStopped,
                                      RendezvousTimeout, Registration, await_decision)
from launcher.node.settings import NodeSettings, SettingsError, from_env
from launcher.node.status import StatusRecord, status_key
from launcher.node.store import StoreError, WorkDir
from launcher.node.torchrun_shim import EXIT_NO_MAIN
from launcher.wording import plural

EXIT_PEER_FAILED = 1
EXIT_CANCELLED = 130
EXIT_BAD_ENV = 2
EXIT_STORE = 3
EXIT_TIMED_OUT = 124  # maxRuntime or the hang watchdog, as timeout(1) reports it
HEARTBEAT_SECONDS = 10.0
STOP_GRACE_SECONDS = float(os.environ.get("LAUNCHER_STOP_GRACE", "5"))
PEER_GRACE_SECONDS = 5.0  # how long a node whose ranks only lost a peer waits for that peer's failure marker
PEER_POLL_SECONDS = 0.5


class TooFewGpus(Exception):
    """processesPerNode asks for more GPUs than the node sees."""


class NothingToResume(Exception):
    """``--resume-from`` named a run that left no outputs: starting from scratch would hide that."""


class Stopped(Exception):
    """Raised by the signal handler while no training process is running yet."""


@dataclass(frozen=True)
class _Ended:
    """How torchrun's run ended: its exit status, and whether this node stopped it (and why)."""
    code: int
    own_failure: str | None = None  # maxRuntime or the hang watchdog: this node is the cause
    stopped: bool = False  # stopped on request (a signal after training ended changes nothing)


@dataclass(frozen=True)
class _Outcome:
    """This node's final state, reason and exit status; ``mark_failed``: its own failure, to be marked."""
    state: str
    reason: str | None
    exit_code: int
    mark_failed: bool = False
    details: dict | None = None


class Node:
    def __init__(self, settings: NodeSettings):
        self.settings = settings
        self.run = WorkDir(settings.run_url)
        self.shipper = LogShipper(self.run, settings.node).start()
        self.status = StatusRecord(self.run, settings.node, settings.run_id)
        self.control = ControlWatch(self.run, settings.node)
        self.proc: subprocess.Popen | None = None
        self.stop_request: StopRequest | None = None
        self.rank: int | None = None
        self.torchrun_output: collections.deque[str] = collections.deque(maxlen=400)
        self.processes = 1
        self.started = time.monotonic()

    def say(self, message: str) -> None:
        print(f"[launcher {self.settings.node}] {message}", file=sys.stderr, flush=True)
        self.shipper.add("node", message)

    def _on_signal(self, signum: int, _frame: object) -> None:
        request = StopRequest("cancelled", f"received {signal_name(signum)}")
        if self.proc is None:
            raise Stopped(request.reason)
        self.stop_request = self.stop_request or request

    def main(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        try:
            return self._main()
        except Stopped as stop:
            return self._finish("cancelled", str(stop), EXIT_CANCELLED)
        except RendezvousStopped as exc:
            cancelled = exc.request.state == "cancelled"
            return self._finish(exc.request.state, str(exc), EXIT_CANCELLED if cancelled else EXIT_PEER_FAILED)
        except RendezvousTimeout as exc:
            return self._finish("failed", str(exc), EXIT_PEER_FAILED, mark_failed=True)
        except NothingToResume as exc:
            return self._finish("failed", str(exc), EXIT_PEER_FAILED, mark_failed=True)
        except TooFewGpus as exc:
            return self._finish("failed", str(exc), EXIT_BAD_ENV, mark_failed=True)
        except (RendezvousError, StoreError) as exc:
            return self._finish("failed", str(exc), EXIT_STORE, mark_failed=True)
        finally:
            self.shipper.close()

    def _main(self) -> int:
        settings = self.settings
        gpus = visible_gpus()
        self.status.update(state="registering", accelerators=accelerator_report(gpus))
        self.processes = self._processes(len(gpus))
        address = own_address()
        port = settings.master_port or free_port(address)
        self.status.update(state="waiting", address=address, outputs_dir=settings.outputs_dir,
                           processes=self.processes)
        devices = plural(len(gpus), "GPU") if gpus else "no GPU"
        self.say(f"registering in {settings.run_url} as {address}:{port} ({plural(self.processes, 'training process')}, "
                 f"{devices}); waiting for {plural(len(settings.nodes), 'node')}")
        decision = await_decision(
            self.run, Registration(settings.node, address, port, self.processes), settings.nodes,
            timeout=settings.rendezvous_timeout,
            elastic_min=settings.elastic["minNodes"] if settings.elastic else None,
            progress=self._progress)
        self.rank = decision.ranks.get(settings.node)
        self.status.update(rank=self.rank, main=decision.main)
        role = "main" if decision.main == settings.node else "worker"
        place = (f"rank {self.rank} of {plural(len(decision.ranks), 'node')}" if decision.mode == "static"
                 else f"elastic, main {decision.main}; torchrun's c10d rendezvous assigns ranks")
        self.say(f"{role}: {place}; MASTER_ADDR={decision.master_addr} MASTER_PORT={decision.master_port}")
        if settings.resume_from:
            self._restore(settings.resume_from)
        return self._train(decision)

    def _processes(self, gpus: int) -> int:
        """processesPerNode as a number, or auto: one per GPU this node sees, 1 without GPUs."""
        wanted = self.settings.nproc_per_node
        if wanted is None:
            return max(1, gpus)
        if 0 < gpus < wanted:  # caught here, not as an NCCL error minutes later
            raise TooFewGpus(f"processesPerNode is {wanted} but this node sees {plural(gpus, 'GPU')} "
                             f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                             "use processesPerNode: auto or at most the GPU count")
        return wanted

    def _progress(self, registered: list[str], missing: list[str], waited: float) -> None:
        total = len(registered) + len(missing)
        waiting = f", waiting for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}" if missing else ""
        timing = f" after {waited:.0f}s of {self.settings.rendezvous_timeout:g}s" if waited >= 1 else ""
        self.say(f"{len(registered)}/{plural(total, 'node')} registered{timing}{waiting}")

    def _restore(self, previous_url: str) -> None:
        previous = WorkDir(previous_url)
        data = previous.get(DECISION_KEY)
        main = Decision.from_bytes(data).main if data else None
        source = outputs_mod.checkpoint_holder(previous, prefer=main)
        if source is None:
            raise NothingToResume(f"nothing to resume: {previous_url}/{outputs_mod.OUTPUTS_PREFIX}/ holds no outputs")
        count = outputs_mod.restore(previous, source, self.settings.outputs_dir)
        self.say(f"restored {count} output files of {previous_url} (node {source}) into "
                 f"{self.settings.outputs_dir}")

    def _train(self, decision: Decision) -> int:
        from launcher.node.torchrun import torchrun_argv, training_env

        settings = self.settings
        os.makedirs(settings.outputs_dir, exist_ok=True)
        log_dir = tempfile.mkdtemp(prefix=f"launcher-{settings.node}-torchrun-")
        argv = torchrun_argv(decision, settings, self.processes, log_dir=log_dir,
                             wait_seconds=settings.rendezvous_timeout)
        self.say(f"starting: {shlex.join(argv)}")
        self.proc = subprocess.Popen(argv, env=training_env(os.environ, decision, settings, self.processes),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent())
        node_rank = decision.ranks.get(settings.node) if decision.mode == "static" else None
        rank_logs = RankLogs(log_dir, self.shipper, sys.stdout.buffer, global_rank=lambda local: (
            None if node_rank is None else node_rank * self.processes + local)).start()
        reader = threading.Thread(target=self._pump_torchrun, args=(self.proc.stdout,), daemon=True)
        reader.start()
        self.status.update(state="running", training_pgid=self.proc.pid, training_logs=log_dir)
        sync = outputs_mod.OutputsSync(self.run, settings.node, settings.outputs_dir)
        ended = self._supervise(rank_logs, sync)
        reader.join(timeout=10)
        rank_logs.close()
        try:
            outcome = self._outcome(decision, ended, rank_logs)
        finally:  # not before: it holds the ranks' error files (torch's @record)
            shutil.rmtree(log_dir, ignore_errors=True)
        if outcome.mark_failed:  # before the outputs sync, which may take long: peers stop and learn why at once
            self._mark_failed(outcome.state, outcome.reason, outcome.exit_code, outcome.details)
        synced = sync.sync()
        if synced:
            self.say(f"synced {synced} output files to {self.run.url}/outputs/{settings.node}/")
        if settings.outputs_temporary:  # every file is in the work dir now
            outputs_mod.remove_temporary(settings.outputs_dir)
        return self._finish(outcome.state, outcome.reason, outcome.exit_code, details=outcome.details)

    def _supervise(self, rank_logs: RankLogs, sync: outputs_mod.OutputsSync) -> _Ended:
        """Wait for torchrun to exit, meanwhile enforcing the limits, obeying stop requests and syncing."""
        assert self.proc is not None
        settings = self.settings
        next_sync = time.monotonic() + settings.outputs_sync_interval
        next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
        training_started = time.monotonic()
        exited = _ExitEvent(self.proc.pid)
        try:
            while not exited.wait(0.5):  # wakes when torchrun exits, or after 0.5 s for the periodic duties
                own_failure = self._limits(rank_logs, training_started)
                if own_failure:
                    self.say(f"stopping training: {own_failure}")
                    return _Ended(self._terminate(), own_failure=own_failure)
                self.stop_request = self.stop_request or self._control_check()
                if self.stop_request:
                    self.say(f"stopping training: {self.stop_request.reason}")
                    return _Ended(self._terminate(), stopped=True)
                now = time.monotonic()
                if now >= next_heartbeat:
                    self.status.heartbeat()
                    next_heartbeat = now + HEARTBEAT_SECONDS
                if now >= next_sync:
                    sync.sync()
                    next_sync = now + settings.outputs_sync_interval
            return _Ended(self.proc.wait())
        finally:
            exited.close()

    def _outcome(self, decision: Decision, ended: _Ended, rank_logs: RankLogs) -> _Outcome:
        """How training ended for this node; reads the rank logs, so before they are deleted."""
        if ended.own_failure:
            return _Outcome("failed", ended.own_failure, EXIT_TIMED_OUT, mark_failed=True)
        if ended.code == 0 and not ended.stopped:  # training ended on its own, successfully: a later SIGTERM
            return _Outcome("succeeded", None, 0)  # (compose stopping the others as one exits) changes nothing
        cause = diagnose(self.torchrun_output, rank_logs.stderr_tails)
        # Did training fail because the run was cancelled or a peer failed first? Then that is the cause.
        self.stop_request = self.stop_request or self._peer_stop(cause)
        if self.stop_request:
            cancelled = self.stop_request.state == "cancelled"
            return _Outcome(self.stop_request.state, self.stop_request.reason,
                            EXIT_CANCELLED if cancelled else EXIT_PEER_FAILED)
        if ended.code == EXIT_NO_MAIN:
            reason = (f"the main node {decision.main} did not open {decision.master_addr}:{decision.master_port} "
                      f"within {self.settings.rendezvous_timeout:g}s")
            return _Outcome("failed", reason, EXIT_PEER_FAILED, mark_failed=True)
        return _Outcome("failed", describe_cause(cause.to_dict()), cause.exit_code or ended.code, mark_failed=True,
                        details={"cause": cause.to_dict()})

    def _limits(self, rank_logs: RankLogs, training_started: float) -> str | None:
        """Why this node must stop the run now: maxRuntime reached, or every training process silent."""
        settings = self.settings
        now = time.monotonic()
        if settings.max_runtime and now - self.started >= settings.max_runtime:
            return f"exceeded max runtime ({settings.max_runtime:g}s)"
        if settings.hang_timeout:
            silent = [local for local in range(self.processes)
                      if now - rank_logs.last_output.get(local, training_started) >= settings.hang_timeout]
            if len(silent) == self.processes:
                labels = [(rank_logs.global_rank(local), local) for local in silent]
                ranks = ", ".join(f"local {local}" if rank is None else str(rank) for rank, local in labels)
                return (f"hung: no training process wrote a line for {settings.hang_timeout:g}s "
                        f"(silent ranks: {ranks})")
        return None

    def _peer_stop(self, cause: Cause) -> StopRequest | None:
        """A cancel or a peer's failure marker. When this node's ranks only lost a peer, the node whose
        rank raised is given PEER_GRACE_SECONDS to write its marker, so that it, not this node, is the cause."""
        alone = len(self.settings.nodes) == 1
        deadline = time.monotonic() + (0 if alone or not lost_a_peer(cause) else PEER_GRACE_SECONDS)
        while True:
            request = self.stop_request or self._control_check(force=True)
            if request or time.monotonic() >= deadline:
                return request
            time.sleep(PEER_POLL_SECONDS)

    def _control_check(self, force: bool = False) -> StopRequest | None:
        try:
            return self.control.check(force=force)
        except StoreError as exc:  # keep training through a store outage; the next check may succeed
            self.say(f"could not read the run's control markers: {exc}")
            return None

    def _pump_torchrun(self, pipe: IO[bytes]) -> None:
        """torchrun's own messages (the training processes write to files, see RankLogs): kept for
        the cause of a failure and in the work dir as stream ``torchrun``, shown to users only with -v."""
        for raw in iter(pipe.readline, b""):
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.torchrun_output.append(text)
            self.shipper.add("torchrun", text)
        pipe.close()

    def _terminate(self) -> int:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            return self.proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.say(f"training did not stop within {STOP_GRACE_SECONDS:g}s of SIGTERM; sending SIGKILL")
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()
        except ProcessLookupError:
            return self.proc.wait()

    def _mark_failed(self, state: str, reason: str | None, exit_code: int, details: dict | None) -> None:
        """The failure marker: written first, so peers stop as early as possible."""
        try:
            record_failure(self.run, self.settings.node, self.rank, exit_code, reason or state, details)
        except StoreError:
            pass

    def _finish(self, state: str, reason: str | None, exit_code: int, *, mark_failed: bool = False,
                details: dict | None = None) -> int:
        if mark_failed:
            self._mark_failed(state, reason, exit_code, details)
        self.say(f"{state}" + (f": {reason}" if reason else "") + f" (exit status {exit_code})")
        self.shipper.flush()  # every log line is in the work dir before the final status says so
        self.status.update(state=state, reason=reason, exit_code=exit_code, **(details or {}))
        return exit_code


class _ExitEvent:
    """Waits for a process to exit without busy polling (a pidfd becomes readable when it does)."""

    def __init__(self, pid: int):
        self.fd = os.pidfd_open(pid)

    def wait(self, timeout: float) -> bool:
        import select

        ready, _, _ = select.select([self.fd], [], [], timeout)
        return bool(ready)

    def close(self) -> None:
        os.close(self.fd)


def _die_with_parent():
    """A pre-exec hook asking Linux to SIGTERM torchrun if this node dies, so training never outlives it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork: the child only calls it
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)


def main() -> int:
    try:
        settings = from_env()
    except SettingsError as exc:
        print(f"launcher node: {exc}", file=sys.stderr)
        return EXIT_BAD_ENV
    try:
        node = Node(settings)
        if node.run.get(status_key(settings.node)) is not None:
            # Checked before this node writes anything: the earlier attempt's records stay as they are.
            print(f"launcher node {settings.node}: run {settings.run_id} already has a status record for this node "
                  f"in {settings.run_url}: its run id was used before (a second `docker-compose up` of the same "
                  "file, a restarted node). Start a new run; nothing was written.", file=sys.stderr)
            return EXIT_BAD_ENV
    except StoreError as exc:
        print(f"launcher node {settings.node}: {exc}", file=sys.stderr)
        return EXIT_STORE
    return node.main()

