"""The hang watchdog (``hangTimeout``): when every training process of this node has been silent that long (no line
written and no step counted: most scripts print from rank 0 only, and the ranks that train in silence are not
hung), take
every rank's Python stack without stopping it (:mod:`launcher.node.diagnosis.stacks`) and name the culprit: a rank here
whose process cannot run (stopped, traced, in uninterruptible sleep), else one outside any collective, is what the
others wait for; ranks that all wait in collectives give the culprit's node
time to name itself, else point at peers whose ranks returned early, else at mismatched collectives."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from launcher.node.health.ranks import counted_steps, read_progress
from launcher.protocol.control import StopRequest
from launcher.node.torchrun.ranklogs import RankLogs
from launcher.procinfo import FROZEN_STATES
from launcher.protocol.status import HEARTBEAT_SECONDS, StatusRecord, status_key
from launcher.protocol.store import StoreError, WorkDir

PROGRESS_READ_SECONDS = 1.0  # a training process writes its step count at most once a second
HANG_PEER_GRACE_SECONDS = 10.0  # how long a hung node whose ranks all wait in collectives waits for the culprit's
STACK_LINES_SHOWN = 12


@dataclass(frozen=True)
class Verdict:
    """A hang seen: this node's failure, or the stop a peer asked for meanwhile (the culprit named itself)."""

    failure: str | None = None
    stop: StopRequest | None = None


class HangWatch:
    def __init__(self, timeout: float | None, processes: int, stacks_dir: str, *, node: str, nodes: list[str],
                 run: WorkDir, status: StatusRecord, say: Callable[[str], None]):
        self.timeout = timeout
        self.processes = processes
        self.stacks_dir = stacks_dir
        self.node = node
        self.nodes = nodes
        self.run = run
        self.status = status
        self.say = say
        self.ranks_ended = False  # every training process here ended well; torchrun waits for the other nodes
        self._steps: dict[int, tuple[int, int]] = {}  # local rank -> (its pid, the steps it had counted)
        self._stepped: dict[int, float] = {}  # local rank -> monotonic time its step count was seen to grow
        self._progress_read = float("-inf")

    def check(self, rank_logs: RankLogs, training_started: float,
              await_stop: Callable[[float], StopRequest | None]) -> Verdict | None:
        """None while no hang is seen (or the ranks here ended well); else what it means for this node."""
        timeout = self.timeout
        now = time.monotonic()
        if not timeout or self.ranks_ended:
            return None
        self._note_steps(now)
        if any(now - max(rank_logs.last_output.get(local, training_started), self._stepped.get(local, float("-inf")))
               < timeout for local in range(self.processes)):
            return None
        return self._diagnose(rank_logs, timeout, await_stop)

    def _note_steps(self, now: float) -> None:
        """When each training process here last counted a step (its progress record, :mod:`launcher.data.rankprogress`)."""
        if now - self._progress_read < PROGRESS_READ_SECONDS:
            return
        self._progress_read = now
        for local, record in read_progress(self.stacks_dir).items():
            seen = (record["pid"], counted_steps(record)[0])
            if seen != self._steps.get(local) and seen[1] > 0:
                self._stepped[local] = now
            self._steps[local] = seen

    def _diagnose(self, rank_logs: RankLogs, timeout: float,
                  await_stop: Callable[[float], StopRequest | None]) -> Verdict | None:
        from launcher.node.diagnosis.stacks import capture

        def label(local: int) -> str:
            rank = rank_logs.global_rank(local)
            return f"local rank {local}" if rank is None else f"rank {rank}"

        self.status.heartbeat()  # what follows may take HANG_PEER_GRACE_SECONDS: no peer may think this node frozen
        captured = capture(self.stacks_dir, range(self.processes))
        if len(captured.gone) == self.processes:  # they ended well (torchrun reports failures at once): torchrun
            self.ranks_ended = True               # waits at its exit barrier for the other nodes; not a hang here
            self.say("every training process here has ended (exit status 0); torchrun waits for the other nodes")
            self.status.update(training_processes="ended")
            return None
        stacks = captured.stacks
        for local, stack in sorted(stacks.items()):
            state = "waits in a collective" if stack.waiting else "is not in any collective"
            self.say(f"hung for {timeout:g}s: {label(local)} {state}; its stack, most recent call first:")
            for frame in stack.frames[:STACK_LINES_SHOWN]:
                self.say(f"  {frame}")
        for local, state in sorted(captured.frozen.items()):
            self.say(f"hung for {timeout:g}s: {label(local)}'s process is {FROZEN_STATES[state]}: it cannot show a stack")
        waiting = [label(local) for local, stack in sorted(stacks.items()) if stack.waiting]
        waits = f" ({', '.join(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for it)" if waiting else ""
        if captured.frozen:  # it cannot run at all: whatever the others do, they wait for it
            local, state = min(captured.frozen.items())
            return Verdict(f"hung: {label(local)} made no progress for {timeout:g}s: its process is "
                           f"{FROZEN_STATES[state]}{waits}")
        stuck = [stack for _, stack in sorted(stacks.items()) if not stack.waiting]
        if stuck:
            where = stuck[0].innermost_user_frame or (stuck[0].frames[0] if stuck[0].frames else "an unknown place")
            return Verdict(f"hung: {label(stuck[0].local_rank)} made no progress for {timeout:g}s outside any "
                           f"collective, at {where}{waits}")
        silent = ", ".join(label(local) for local in range(self.processes))
        if not stacks:
            return Verdict(f"hung: no training process wrote a line for {timeout:g}s (silent: {silent}); no stack "
                           "could be read")
        stop = await_stop(HANG_PEER_GRACE_SECONDS)  # the culprit's node names itself
        if stop:
            return Verdict(stop=stop)
        self.status.heartbeat()
        ended = self._peers_that_ended()
        frozen = self._peers_gone_quiet()
        if frozen and not ended:
            return Verdict(f"hung: {silent} waited {timeout:g}s in a collective for {', '.join(frozen)}: a node that "
                           "trains writes its status every "
                           f"{HEARTBEAT_SECONDS:g}s, so it is frozen, or cut off from the work dir")
        if ended:
            return Verdict(f"hung: {silent} waited {timeout:g}s in a collective for {', '.join(ended)}, whose "
                           "training processes ended with exit status 0: the entry point returned there before "
                           "training was over (e.g. before init_process_group)")
        return Verdict(f"hung: {silent} waited {timeout:g}s in a collective and no node has a rank outside one "
                       "(mismatched collectives across ranks, or a rank that is gone)")

    def _peers_gone_quiet(self) -> list[str]:
        """Peers that train and whose status is older than one and a half heartbeats (a node whose hang watch
        looks writes its status as it begins, and again before it looks at its peers): ``NODE (no status for 31s)``."""
        statuses = self._peer_statuses()
        now = time.time()
        quiet = {node: now - float(status.get("updated_at") or now) for node, status in statuses.items()
                 if status.get("state") == "running"}
        return [f"{node} (no status for {age:.0f}s)" for node, age in sorted(quiet.items())
                if age > 1.5 * HEARTBEAT_SECONDS]

    def _peers_that_ended(self) -> list[str]:
        """Peers whose training processes all ended well, while this node's wait for them."""
        return [node for node, status in self._peer_statuses().items()
                if status.get("state") == "succeeded" or status.get("training_processes") == "ended"]

    def _peer_statuses(self) -> dict[str, dict]:
        try:
            return {node: self.run.get_record(status_key(node)) for node in self.nodes if node != self.node}
        except StoreError:
            return {}
