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
import threading
import time
from typing import IO

from launcher.gpus import accelerator_report, visible_gpus
from launcher.node.address import node_address
from launcher.node.diagnosis.cause import Cause, diagnose, lost_a_peer
from launcher.node.diagnosis.hangwatch import HangWatch
from launcher.node.diagnosis.outcome import Ended, Outcome, decide
from launcher.node.diagnosis.stacks import live_training_pids
from launcher.node.health.milestones import RankMilestones
from launcher.node.health.sampler import HealthSampler, start_sampler
from launcher.node.leftovers import kill_groups
from launcher.node.netutil import free_port
from launcher.node.recovery.loop import RecoveryLoop, round_end_text, round_ended
from launcher.node.recovery.restore import restore_watched
from launcher.node.settings import NodeSettings, SettingsError, from_env
from launcher.node.threads import share_threads, usable_cores
from launcher.node.torchrun.childproc import ExitEvent, die_with_parent, terminate
from launcher.node.torchrun.ranklogs import RankLogs
from launcher.node.torchrun.spare import Spare
from launcher.node.torchrun.training_dirs import make_training_dir
from launcher.protocol import outputs as outputs_mod
from launcher.protocol.control import LEFT, ControlWatch, StopRequest, record_failure, record_limit
from launcher.protocol.events import DECIDED, REGISTERED, RESTORED, SYNCED, TORCHRUN, EventLog
from launcher.protocol.exits import EXIT_BAD_ENV, EXIT_CANCELLED, EXIT_PEER_FAILED, EXIT_STORE, signal_name
from launcher.protocol.logship import LogShipper
from launcher.protocol.recovery import LEAVE, RoundEnd
from launcher.protocol.rendezvous import (Decision, RendezvousError, RendezvousStopped,
                                          RendezvousTimeout, Registration, await_decision)
from launcher.protocol.rounds import Rounds
from launcher.protocol.status import HEARTBEAT_SECONDS, StatusRecord, status_key
from launcher.protocol.store import StoreError, WorkDir
from launcher.wording import plural

STOP_GRACE_SECONDS = float(os.environ.get("LAUNCHER_STOP_GRACE", "5"))
PEER_GRACE_SECONDS = 5.0  # how long a node whose ranks only lost a peer waits for that peer's failure marker
PEER_POLL_SECONDS = 0.5


class TooFewGpus(Exception):
    """processesPerNode asks for more GPUs than the node sees."""


class NothingToResume(Exception):
    """``--resume-from`` named a run that left no outputs: starting from scratch would hide that."""


class Stopped(Exception):
    """Raised by the signal handler while no training process is running yet."""


class Node:
    def __init__(self, settings: NodeSettings):
        self.settings = settings
        self.run = WorkDir(settings.run_url)
        self.shipper = LogShipper(self.run, settings.node, continues=settings.incarnation > 0).start()
        self.events = EventLog(self.run, settings.node, settings.incarnation)  # started with main(): see main()
        self.run.outage.say = self.say  # once when the work dir stops answering, once when it answers again
        self.status = StatusRecord(self.run, settings.node, settings.run_id, settings.incarnation)
        self.control = ControlWatch(self.run, settings.node)
        self.proc: subprocess.Popen | None = None
        self.stop_request: StopRequest | None = None
        self.rank: int | None = None
        self.torchrun_output: collections.deque[str] = collections.deque(maxlen=400)
        self.processes = 1
        self.started = time.monotonic()
        self.stacks_dir = ""
        self.spare = Spare(self.say)  # a torchrun with its imports done, for the next round
        self.sync = outputs_mod.OutputsSync(self.run, settings.node, settings.outputs_dir)
        self.ending = threading.Event()  # set by a signal: transfers under way (a restore) stop at their next chunk
        self.rank_logs: RankLogs | None = None
        self.milestones: RankMilestones | None = None  # this round's training processes' starts, first and last steps
        self.health: HealthSampler | None = None

    def say(self, message: str) -> None:
        print(f"[launcher {self.settings.node}] {message}", file=sys.stderr, flush=True)
        self.shipper.add("node", message)

    signalled: int | None = None  # the signal that stopped the node (see finish: lost or cancelled)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signalled = signum
        request = StopRequest("cancelled", f"received {signal_name(signum)}")
        if self.proc is None:
            self.ending.set()
            raise Stopped(request.reason)
        self.stop_request = self.stop_request or request

    def _on_time_limit_notice(self, seconds: int) -> None:
        """Slurm's notice that the job's time limit is ``seconds`` away: every node stops (the record is the run's
        cause for every reader and peer), training with SIGTERM and most of the notice to save."""
        from launcher.node.engines import slurm_limit
        from launcher.node.sigterm import SLURM_JOB
        from launcher.protocol.control import record_engine_end

        job = os.environ.get(SLURM_JOB, "?")
        reason = slurm_limit.notice_reason(job, seconds)
        grace = slurm_limit.node_grace(seconds)  # torchrun ends its ranks first
        self.say(f"time limit: {reason}; training is stopped with SIGTERM and has "
                 f"{slurm_limit.ranks_grace(seconds)}s to save")
        try:
            record_engine_end(self.run, job, self.settings.node, reason, grace=grace)
        except StoreError as exc:
            self.say(f"could not record the time limit in the work dir: {exc}")
        self.stop_request = self.stop_request or StopRequest("failed", f"stopped: {reason}", grace=grace)
        if self.proc is None:
            self.ending.set()  # a restore under way stops; the rendezvous stops on the record

    def main(self) -> int:
        from launcher.node.engines import slurm_limit

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        notice = slurm_limit.notice_seconds(os.environ)
        if notice:
            from launcher.node.sigterm import SLURM_JOB

            job = os.environ.get(SLURM_JOB, "")
            slurm_limit.watch(lambda: self._on_time_limit_notice(notice),
                              lambda: slurm_limit.stop_at(job, notice) if job else None, self.say)
        try:
            self.events.start()
            return self._main()
        except Stopped as stop:
            return self.finish("cancelled", str(stop), EXIT_CANCELLED)
        except RendezvousStopped as exc:
            cancelled = exc.request.state == "cancelled"
            return self.finish(exc.request.state, str(exc), EXIT_CANCELLED if cancelled else EXIT_PEER_FAILED)
        except RendezvousTimeout as exc:
            return self.finish("failed", str(exc), EXIT_PEER_FAILED, mark_failed=True)
        except NothingToResume as exc:
            return self.finish("failed", str(exc), EXIT_PEER_FAILED, mark_failed=True)
        except TooFewGpus as exc:
            return self.finish("failed", str(exc), EXIT_BAD_ENV, mark_failed=True)
        except (RendezvousError, StoreError) as exc:
            return self.finish("failed", str(exc), EXIT_STORE, mark_failed=True)
        finally:
            self.spare.discard()
            self.shipper.close()

    def _main(self) -> int:
        settings = self.settings
        gpus = visible_gpus()
        self.status.update(state="registering", accelerators=accelerator_report(gpus))
        self.health = start_sampler(self.run, self.status, settings.node, settings.incarnation, self._training_now,
                                    gpus, self.say)
        self.processes = self._processes(len(gpus))
        # before the spare: its warm interpreters size torch's thread pool as they import it
        threads = share_threads(os.environ, self.processes, settings.machine_nodes, usable_cores())
        self.spare.prepare(self.processes)  # its imports overlap the rendezvous
        chosen = node_address(timeout=settings.rendezvous_timeout, say=self.say)
        address = chosen.address
        port = settings.master_port or free_port(address)
        self.status.update(state="waiting", address=address, interface=chosen.interface,
                           outputs_dir=settings.outputs_dir, outputs_temporary=settings.outputs_temporary,
                           processes=self.processes)
        devices = plural(len(gpus), "GPU") if gpus else "no GPU"
        self.say(f"registering in {settings.run_url} as {address}:{port} ({plural(self.processes, 'training process')}, "
                 f"{devices}; {threads}); waiting for {plural(len(settings.nodes), 'node')}")
        me = Registration(settings.node, address, port, self.processes, incarnation=settings.incarnation)
        if settings.recovery:
            return RecoveryLoop(self).run(me)
        self.events.record(REGISTERED)
        decision = await_decision(self.run, me, settings.nodes, timeout=settings.rendezvous_timeout,
                                  progress=self._progress)
        self.start_round(decision)
        self.restore(0)
        return self.conclude(self.train(decision))

    def start_round(self, decision: Decision, number: int | None = None, restarts: int = 0) -> None:
        """Train in ``decision``; ``restarts``: those the attempt's rounds used (the run's count adds the attempts')."""
        from launcher.runs.attempts import restarts_before

        restarts += restarts_before(self.settings.recovery)
        self.rank = decision.ranks.get(self.settings.node)
        self.events.record(DECIDED, round=number, rank=self.rank)
        members = plural(len(decision.ranks), "node")
        self.status.update(rank=self.rank, main=decision.main,
                           **({} if number is None else {"round": number, "restarts": restarts,
                                                         "members": list(decision.ranks)}))
        role = "main" if decision.main == self.settings.node else "worker"
        where = "" if number is None else f" in round {number} ({plural(restarts, 'restart')} so far)"
        self.say(f"{role}: node rank {self.rank} of {members}{where}; MASTER_ADDR={decision.master_addr} "
                 f"MASTER_PORT={decision.master_port}")

    def _training_now(self) -> tuple[str, dict[int, float]]:
        """For the health sampler: where this round's ranks write their progress, when each wrote its last line."""
        return self.stacks_dir, self.rank_logs.last_line_at if self.rank_logs else {}

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

    def restore(self, number: int) -> None:
        """Before training in round ``number`` (0 outside rounds): the newest copy of every output file of the runs
        this one continues (``--resume-from``, the earlier attempts of a run retried whole) and, from round 1 on,
        of this run itself."""
        settings = self.settings
        sources = [WorkDir(url) for url in settings.earlier_runs] + ([self.run] if number > 0 else [])
        if not sources:
            return
        count = restore_watched(lambda progress: outputs_mod.restore_newest(sources, self.sync, progress),
                                stop=self.ending, say=self.say, stop_request=self._control_check)
        self.events.record(RESTORED, round=number, files=count)
        if count == 0 and number == 0 and settings.resume_from:
            raise NothingToResume(f"nothing to resume: {settings.resume_from}/{outputs_mod.OUTPUTS_PREFIX}/ holds "
                                  "no outputs")
        if count:
            self.say(f"restored {count} output files (the newest copy of each) of "
                     f"{', '.join(source.url for source in sources)} into {settings.outputs_dir}")

    def train(self, decision: Decision, rounds: Rounds | None = None, number: int = 0) -> Outcome:
        """One torchrun run with ``decision``; in a recovering run it also ends when the round does."""
        from launcher.node.torchrun.command import checkpoint_dir, torchrun_argv, training_env

        settings = self.settings
        # the contract promises both directories exist: programs save into them without creating them
        os.makedirs(checkpoint_dir(settings), exist_ok=True)
        log_dir = make_training_dir(settings.node)
        self.stacks_dir = os.path.join(log_dir, "stacks")
        os.makedirs(self.stacks_dir)
        argv = torchrun_argv(decision, settings, self.processes, log_dir=log_dir,
                             wait_seconds=settings.rendezvous_timeout)
        self.say(f"starting: {shlex.join(argv)}")
        env = training_env(os.environ, decision, settings, self.processes, self.stacks_dir, number)
        spare, imported = self.spare.take(argv, env)
        self.proc = spare or subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              start_new_session=True, preexec_fn=die_with_parent())
        self.events.record(TORCHRUN, round=number, spare=bool(spare) or None,
                           spare_imported=imported if spare else None)
        rank_logs = RankLogs(log_dir, self.shipper, sys.stdout.buffer, self.events.first_line(number),
                             self.events.rank_exited(number)).start()
        self.rank_logs = rank_logs
        self.milestones = RankMilestones(self.stacks_dir, self.processes, number, self.events.record)
        reader = threading.Thread(target=self._pump_torchrun, args=(self.proc.stdout,), daemon=True)
        reader.start()
        self.status.update(state="running", training_pgid=self.proc.pid, training_logs=log_dir)
        ended = self._supervise(rank_logs, rounds, number, list(decision.ranks))
        reader.join(timeout=10)
        rank_logs.close()
        self.milestones.check(final=True)
        self.events.training_ended(number, ended.code, rank_logs.last_line_at)
        try:
            return decide(ended, decision, node=settings.node, rendezvous_timeout=settings.rendezvous_timeout,
                          recovering=rounds is not None, stop_request=self.stop_request,
                          cause_here=lambda: diagnose(self.torchrun_output, rank_logs.tails, ended.code),
                          peer_stop=self._peer_stop)
        finally:  # not before: it holds the ranks' error files (torch's @record)
            shutil.rmtree(log_dir, ignore_errors=True)

    def conclude(self, outcome: Outcome) -> int:
        """The run is over for this node: say so first (peers stop at once), then sync, then the final status."""
        if outcome.mark_failed:  # before the outputs sync, which may take long: peers stop and learn why at once
            self._mark_failed(outcome.state, outcome.reason, outcome.exit_code, outcome.details)
        failure = self.sync_failure()
        self.events.record(SYNCED, failed=bool(failure) or None)
        if failure and outcome.state in ("succeeded", LEFT):  # what it trained for did not reach the work dir
            return self.finish("failed", failure, EXIT_STORE, mark_failed=True)
        if failure:  # it ends as it would have; this comes on top
            self.say(failure)
        return self.finish(outcome.state, outcome.reason, outcome.exit_code, details=outcome.details)

    def sync_failure(self, background: bool = False) -> str | None:
        """Sync the outputs (``background``: start a sync, and learn how the one before ended); None when that
        worked, else what failed and where the files it could not upload stay."""
        try:
            synced = self.sync.sync_in_background() if background else self.sync.sync()
        except StoreError as exc:
            return self._describe_sync_failure(exc)
        if synced:
            where = f"{self.run.url}/{outputs_mod.OUTPUTS_PREFIX}/{self.settings.node}/"
            self.say(f"synced {synced} output files to {where}")
        return None

    def _describe_sync_failure(self, exc: StoreError) -> str:
        """``outputs sync of checkpoints/ck.pt: No space left on device in WORK_DIR``: the file whose upload failed
        (where the error says) and the store's words, the same on every node that failed so; where each node's
        files stay is recorded beside it (``finish``), not in it."""
        prefix = f"{outputs_mod.OUTPUTS_PREFIX}/{self.settings.node}/"
        file = f" of {exc.key[len(prefix):]}" if exc.key and exc.key.startswith(prefix) else ""
        return f"outputs sync{file}: {exc.reason} in {self.run.url}"

    def _supervise(self, rank_logs: RankLogs, rounds: Rounds | None, number: int, members: list[str]) -> Ended:
        """Wait for torchrun to exit, meanwhile enforcing the limits, obeying stop requests and syncing; in a
        recovering run, also stop when the membership round ends."""
        assert self.proc is not None
        settings = self.settings
        next_sync = time.monotonic() + settings.outputs_sync_interval
        next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
        next_round_check = time.monotonic()
        training_started = time.monotonic()
        first_line: float | None = None  # when this round's first training line came
        exited = ExitEvent(self.proc.pid)
        hangs = HangWatch(settings.hang_timeout, self.processes, self.stacks_dir, node=settings.node,
                          nodes=settings.nodes, run=self.run, status=self.status, say=self.say)
        try:
            while not exited.wait(0.5):  # wakes when torchrun exits, or after 0.5 s for the periodic duties
                if self.milestones is not None:
                    self.milestones.check()
                if self.run.gone:  # its logs, status and outputs can no longer be saved: training here is lost
                    failure = f"the work dir {self.run.url} was {self.run.outage.describe()}"
                    self.say(f"stopping training: {failure}")
                    return Ended(self._terminate(), store_failure=failure)
                if self._runtime_exceeded():
                    limit = f"the run exceeded its maxRuntime ({settings.max_runtime:g}s)"
                    self._record_limit(limit)
                    self.say(f"stopping training: {limit}")
                    return Ended(self._terminate(), limit=limit)
                hang = hangs.check(rank_logs, training_started, self._await_stop)
                if hang and hang.stop:  # a hang whose culprit is another node, which named itself
                    self.stop_request = hang.stop
                elif hang:
                    self.say(f"stopping training: {hang.failure}")
                    return Ended(self._terminate(), own_failure=hang.failure)
                self.stop_request = self.stop_request or self._control_check()
                if self.stop_request and self._ranks_ended(rank_logs):
                    return self._await_training_exit()
                if self.stop_request:
                    self.say(f"stopping training: {self.stop_request.reason}")
                    if self.stop_request.state == LEFT and rounds is not None:  # the others re-form without it
                        rounds.end(number, RoundEnd(settings.node, LEAVE, self.stop_request.reason, None, time.time()))
                    return Ended(self._terminate(), stopped=True)
                if rounds is not None and time.monotonic() >= next_round_check:
                    next_round_check = time.monotonic() + rounds.timing.end_check
                    if round_ended(rounds, number, members, self.say):
                        self.say(f"round {number} ends ({round_end_text(rounds, number)}): stopping training")
                        return Ended(self._terminate(), round_over=True)
                if rounds is not None and rank_logs.last_line_at:
                    # Another round may follow: its torchrun imports while this one trains (not before its first
                    # line: on a machine with few cores it would slow the round's own start; LAUNCHER_SPARE_AFTER
                    # waits longer, so that a round that ends sooner never pays for one). Started from this
                    # thread, which lives as long as the node: a child dies with the thread that started it.
                    first_line = first_line or time.monotonic()
                    if time.monotonic() - first_line >= settings.spare_after:
                        self.spare.prepare(self.processes)
                now = time.monotonic()
                if now >= next_heartbeat:
                    self.status.heartbeat()
                    next_heartbeat = now + HEARTBEAT_SECONDS
                if now >= next_sync:
                    failure = self.sync_failure(background=True)
                    if failure:
                        self.say(f"stopping training: {failure}")
                        return Ended(self._terminate(), store_failure=failure)
                    next_sync = now + settings.outputs_sync_interval
            return Ended(self.proc.wait())
        finally:
            exited.close()

    def _ranks_ended(self, rank_logs: RankLogs) -> bool:
        """Every training process here has ended on its own, before the stop request was acted on: torchrun is
        only exiting, and its own outcome is what the node records (a rank's error here too: "also failed"; a success
        where docker-compose's --abort-on-container-exit stops the others once the main exits)."""
        if len(rank_logs.ended) < self.processes:
            return False
        self.say(f"{self.stop_request.reason}: every training process here had already ended; torchrun is let exit")
        return True

    def _await_training_exit(self) -> Ended:
        """torchrun's own exit, waited for up to the stop grace; then it is stopped as any other."""
        assert self.proc is not None
        try:
            return Ended(self.proc.wait(timeout=STOP_GRACE_SECONDS))
        except subprocess.TimeoutExpired:
            self.say(f"training did not exit within {STOP_GRACE_SECONDS:g}s: stopping it")
            return Ended(self._terminate(), stopped=True)

    def _runtime_exceeded(self) -> bool:
        max_runtime = self.settings.max_runtime
        return bool(max_runtime) and time.monotonic() - self.started >= max_runtime

    def _record_limit(self, limit: str) -> None:
        try:
            record_limit(self.run, limit, self.settings.node)
        except StoreError as exc:  # the peers' own timers stop them as well
            self.say(f"could not record the run's limit in the work dir: {exc}")

    def _peer_stop(self, cause: Cause) -> StopRequest | None:
        """A cancel or a peer's failure marker. When this node's ranks only lost a peer, the node whose
        rank raised is given PEER_GRACE_SECONDS to write its marker, so that it, not this node, is the cause."""
        alone = len(self.settings.nodes) == 1
        return self._await_stop(0 if alone or not lost_a_peer(cause) else PEER_GRACE_SECONDS)

    def _await_stop(self, seconds: float) -> StopRequest | None:
        """A cancel, a limit or a peer's failure marker, read at once and then for up to ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            request = self.stop_request or self._control_check(force=True)
            if request or time.monotonic() >= deadline:
                return request
            time.sleep(PEER_POLL_SECONDS)  # the work dir offers no change notification: poll it

    def _control_check(self, force: bool = False) -> StopRequest | None:
        try:
            return self.control.check(force=force)
        except StoreError as exc:  # keep training through a store outage; the next check may succeed
            self.say(f"could not read the run's control markers: {exc}")
            return None

    def _pump_torchrun(self, pipe: IO[bytes]) -> None:
        """torchrun's own messages (the training processes write to pipes, see RankLogs): kept for
        the cause of a failure and in the work dir as stream ``torchrun``, shown to users only with -v."""
        for raw in iter(pipe.readline, b""):
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.torchrun_output.append(text)
            self.shipper.add("torchrun", text)
        pipe.close()

    def _terminate(self) -> int:
        """Stop torchrun and its training processes; those that outlive it (torch starts each in a session of its own:
        one that is stopped, or ignores SIGTERM, is still there once torchrun is gone) get SIGKILL."""
        assert self.proc is not None
        grace = self.stop_request.grace if self.stop_request and self.stop_request.grace else STOP_GRACE_SECONDS
        code = terminate(self.proc, grace, self.say)
        left = live_training_pids(self.stacks_dir) if self.stacks_dir else []
        if left:
            self.say(f"{plural(len(left), 'training process')} outlived torchrun's stop (stopped, or ignoring SIGTERM): "
                     "sending SIGKILL")
            kill_groups(left)
        return code

    def _mark_failed(self, state: str, reason: str | None, exit_code: int, details: dict | None) -> None:
        """The failure marker: written first, so peers stop as early as possible."""
        try:
            record_failure(self.run, self.settings.node, self.rank, exit_code, reason or state, details)
        except StoreError:
            pass

    def finish(self, state: str, reason: str | None, exit_code: int, *, mark_failed: bool = False,
                details: dict | None = None) -> int:
        from launcher.node.sigterm import settle_signal

        state, reason, exit_code = settle_signal(self.run, self.signalled, state, reason, exit_code)
        kept = outputs_mod.kept_record(self.settings.outputs_dir, self.sync.unsynced())
        details = {**(details or {}), **kept}  # readers name each node's files the work dir did not get, and where
        if mark_failed:
            self._mark_failed(state, reason, exit_code, details)
        # however the node ends: a directory launcher chose is not left behind; the files the work dir lacks are named
        left = outputs_mod.tidy_temporary(self.sync) if self.settings.outputs_temporary else self.sync.unsynced()
        if left:
            self.say(f"the work dir did not get {plural(len(left), 'output file')}; they stay in "
                     f"{self.settings.outputs_dir}: {', '.join(left[:5])}{' ...' if len(left) > 5 else ''}")
        self.say(f"{state}" + (f": {reason}" if reason else "") + f" (exit status {exit_code})")
        self.shipper.flush()  # every log line is in the work dir before the final status says so
        self.events.close()  # and every event
        if self.health:
            self.health.stop()  # and the health record, whose last sample the final status carries
        refused = self.status.update(state=state, reason=reason, exit_code=exit_code, **(details or {}))
        if refused is None:
            return exit_code
        # Its parent (a supervisor) and the readers learn its end from its exit status and this console line: one
        # line, whatever lines the reason has (a cause with its frame), or the reader quotes a piece of it.
        ended = "; ".join(part.strip() for part in (state + (f": {reason}" if reason else "")).splitlines())
        ended += f"; {outputs_mod.kept_text(kept)}" if kept else ""
        print(f"[launcher {self.settings.node}] failed to record its end in the work dir ({ended}): {refused}",
              file=sys.stderr, flush=True)
        return exit_code or EXIT_STORE


def main() -> int:
    try:
        settings = from_env()
    except SettingsError as exc:
        print(f"launcher node: {exc}", file=sys.stderr)
        return EXIT_BAD_ENV
    try:
        node = Node(settings)
        if settings.incarnation == 0 and node.run.get(status_key(settings.node)) is not None:
            # Checked before this node writes anything: the earlier attempt's records stay as they are.
            print(f"launcher node {settings.node}: run {settings.run_id} already has a status record for this node "
                  f"in {settings.run_url}: its run id was used before (a second `docker-compose up` of the same "
                  "file, a restarted node). Start a new run; nothing was written.", file=sys.stderr)
            return EXIT_BAD_ENV
    except StoreError as exc:
        print(f"launcher node {settings.node}: {exc}", file=sys.stderr)
        return EXIT_STORE
    return node.main()

