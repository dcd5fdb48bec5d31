"""``ElasticSampler``: each epoch's indices, split afresh at every start of the training processes among the
ranks present, so that across restarts and membership changes every index is trained once per epoch."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any, Iterator, Mapping

from torch.utils.data import Sampler

from launcher.data.epoch import EpochRun
from launcher.data.intervals import Interval, complement, normalize, total
from launcher.data.plan import Plan, epoch_order
from launcher.data.records import Recorder, plan_key, plan_record

STATE_VERSION = 2
SETTINGS = ("size", "shuffle", "seed")


def attempt_key(env: Mapping[str, str]) -> str:
    """Which start of the training processes this is: launcher's membership round, torchrun's restart."""
    return f"{int(env.get('LAUNCHER_ROUND') or 0)}.{int(env.get('TORCHELASTIC_RESTART_COUNT') or 0)}"


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _work_dir_url(work_dir: str | None, env: Mapping[str, str]) -> str | None:
    """Where progress is recorded: ``work_dir``, else the run's work dir, else nowhere."""
    if work_dir:
        return work_dir
    root, run_id = env.get("LAUNCHER_WORK_DIR"), env.get("LAUNCHER_RUN_ID")
    return f"{root.rstrip('/')}/{run_id}" if root and run_id else None


class ElasticSampler(Sampler[int]):
    """Hands out the indices ``0..size-1`` of each epoch so that the model lineage, across all ranks and
    through restarts and membership changes, trains every index once per epoch.

    At each start of the training processes, the epoch's untrained positions are split into one contiguous
    stretch per rank, with the same number of steps for every rank (so DDP needs no ``Join``). What the loop
    consumed goes into ``state_dict()``, which travels in the checkpoint with the model: after a restart
    from that checkpoint exactly the untrained rest is split among the ranks then present.

    Read it through ``ElasticLoader``: it batches each rank's stretch into the agreed number of steps and
    counts what reached the loop. ``shard_size`` is the unit in which `launcher data` reports progress;
    ``records=False`` keeps a second sampler of the run (validation, say) from recording progress there too.
    """

    def __init__(self, size: int, shard_size: int = 256, shuffle: bool = True, seed: int = 0, *,
                 records: bool = True, work_dir: str | None = None, rank: int | None = None,
                 world_size: int | None = None):
        for name, value, least in (("size", size, 1), ("shard_size", shard_size, 1)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"ElasticSampler: {name} must be an integer >= {least}, not {value!r}")
        self.size, self.shard_size, self.shuffle, self.seed = size, shard_size, bool(shuffle), seed
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.attempt = attempt_key(os.environ)
        url = _work_dir_url(work_dir, os.environ) if records else None
        if url is None:
            self._recorder = None
        else:
            from launcher.protocol.store import WorkDir

            self._recorder = Recorder(WorkDir(url))
        self._loaded: dict[str, Any] | None = None
        self._checked = False
        self._run: EpochRun | None = None
        self.counted = False  # set by ElasticLoader: the loop's consumption is known, not only what was handed out

    # -- epochs ------------------------------------------------------------------------------
    def epochs(self, start: int | None = None, end: int | None = None) -> Iterator[int]:
        """The epochs to train, ``start`` (default: where the loaded state left off) up to ``end``; an epoch
        the loaded state holds as complete is skipped. The body of each is the training of that epoch."""
        if end is None:
            raise TypeError("ElasticSampler.epochs() needs end= (the number of epochs)")
        first = self._resume_epoch() if start is None else start
        self._record_loaded_complete()
        try:
            for epoch in range(first, end):
                if total(self._loaded_done(epoch)) == self.size:
                    continue
                self.set_epoch(epoch)
                yield epoch
                self._warn_if_left_early()
        finally:
            self._close_run()
            if self._recorder is not None:
                self._recorder.flush()

    def _record_loaded_complete(self) -> None:
        """A start from a checkpoint that holds its epoch as complete trains none of it. The attempt that trained
        it may have been stopped before its last progress records were written, so rank 0 records the epoch
        under this attempt too, with nothing left (the checkpoint's word): `launcher data` reads the newest
        attempt's record of each epoch."""
        loaded = self._loaded
        if self._recorder is None or self.rank != 0 or loaded is None or total(loaded["done"]) != self.size:
            return
        self._recorder.create(plan_key(int(loaded["epoch"]), self.attempt), plan_record(
            size=self.size, shard_size=self.shard_size, world=self.world_size, remaining=[], batch_size=None,
            steps=0))

    def set_epoch(self, epoch: int) -> None:
        """Begin ``epoch`` (as with DistributedSampler)."""
        self._close_run()
        done = self._loaded_done(epoch)
        if not self._checked:
            self._check_same_start(epoch, done)
        self._run = EpochRun(epoch=epoch, attempt=self.attempt, shard_size=self.shard_size,
                             order=epoch_order(self.size, self.seed, epoch, self.shuffle),
                             plan=Plan(complement(done, self.size), self.world_size, self.size), rank=self.rank,
                             recorder=self._recorder)

    def _warn_if_left_early(self) -> None:
        run = self._run
        if run is not None and run.consumed < run.count:
            warnings.warn(
                f"ElasticSampler: epoch {run.epoch} ended with {run.count - run.consumed} of this rank's "
                f"{run.count} samples untrained (the loop left early?). They are trained only if a restart restores a "
                f"checkpoint taken before; the next epoch starts now.", stacklevel=3)

    def _close_run(self) -> None:
        if self._run is not None:
            self._run.close()

    def _current(self) -> EpochRun:
        if self._run is None:
            self.set_epoch(self._resume_epoch())
        assert self._run is not None
        return self._run

    def __iter__(self) -> Iterator[int]:
        if self.world_size > 1 and not self.counted:
            raise RuntimeError(
                f"ElasticSampler with {self.world_size} training processes must be read through "
                f"launcher.data.ElasticLoader (it takes DataLoader's arguments): it gives every rank the same "
                f"number of batches, which a DataLoader with sampler= cannot")
        return self._current().indices()

    def batches(self, batch_size: int) -> Iterator[list[int]]:
        """This rank's batches of the current epoch; every rank gets as many (used by ElasticLoader)."""
        return self._current().batches(batch_size)

    def __len__(self) -> int:
        """How many indices this rank trains in the current epoch."""
        return self._current().count

    def steps(self, batch_size: int) -> int:
        return self._current().plan.steps(batch_size)

    def note_batch(self) -> None:
        """The loop received the next batch (called by ElasticLoader)."""
        assert self._run is not None
        self._run.note_batch()

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The epoch's progress over all ranks. Collective: every rank calls it, at the same step."""
        run = self._run
        if run is None:
            return self._loaded or self._state(self._resume_epoch(), [])
        if not run.counted and 0 < run.handed_out < run.count:
            warnings.warn(
                "ElasticSampler.state_dict(): the sampler is not read through launcher.data.ElasticLoader, so it "
                "counts every index it handed out as trained. That is exact with DataLoader(num_workers=0); with "
                "worker processes, batches still prefetched now would be skipped after a restore. Use "
                "ElasticLoader (it takes DataLoader's arguments).", stacklevel=2)
        return self._state(run.epoch, run.plan.done(self._gather(run.consumed)))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state_dict(): the epoch's untrained rest is what the next start splits."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"ElasticSampler.load_state_dict: unknown state version {state.get('version')!r} "
                             f"(this launcher writes version {STATE_VERSION})")
        for name in SETTINGS:
            if state.get(name) != getattr(self, name):
                raise ValueError(f"ElasticSampler.load_state_dict: the state was saved with "
                                 f"{name}={state.get(name)!r}, this sampler has {name}={getattr(self, name)!r}; the epoch's order would differ")
        if self._run is not None and self._run.epoch == state.get("epoch"):
            raise RuntimeError("ElasticSampler.load_state_dict: epoch already started; load the state before it")
        self._loaded = {**state, "done": normalize(state.get("done", []))}

    def _state(self, epoch: int, done: list[Interval]) -> dict[str, Any]:
        return {"version": STATE_VERSION, "epoch": epoch, **{name: getattr(self, name) for name in SETTINGS},
                "complete": total(done) == self.size, "done": [list(interval) for interval in done]}

    def _loaded_done(self, epoch: int) -> list[Interval]:
        if self._loaded is None or self._loaded["epoch"] != epoch:
            return []
        return self._loaded["done"]

    def _resume_epoch(self) -> int:
        if self._loaded is None:
            return 0
        return self._loaded["epoch"] + (1 if self._loaded.get("complete") else 0)

    def _gather(self, value: int) -> list[int]:
        """Every rank's ``value``: one all_gather of an int64 tensor (on the GPU under nccl)."""
        if self.world_size == 1:
            return [value]
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"ElasticSampler with {self.world_size} training processes needs torch.distributed "
                               f"initialized (init_process_group) before its first epoch: the ranks agree on "
                               f"their start and their progress through it")
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        mine = torch.tensor([value], dtype=torch.int64, device=device)
        values = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(values, mine)
        return [int(tensor.item()) for tensor in values]

    def _check_same_start(self, epoch: int, done: list[Interval]) -> None:
        """Ranks that start from different states would split different rests: some samples twice, some
        never. Checked once per process start (one collective), never per step."""
        self._checked = True
        digest = int(hashlib.sha256(json.dumps([epoch, done]).encode()).hexdigest()[:15], 16)
        digests = self._gather(digest)
        if len(set(digests)) > 1:
            ranks = [rank for rank, other in enumerate(digests) if other != digests[0]]
            raise RuntimeError(
                f"ElasticSampler: the ranks start from different states (ranks {', '.join(map(str, ranks))} "
                f"differ from rank 0 at epoch {epoch}): they would train some samples twice and skip others. "
                f"Load every rank's sampler state from the same checkpoint and start the same epoch")
