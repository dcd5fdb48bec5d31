"""``ElasticSampler``: the indices of an epoch, claimed shard by shard by whichever rank is ready."""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterator, Mapping

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Joinable, JoinHook
from torch.utils.data import Sampler

from launcher.data.claims import Claims, MemoryClaims
from launcher.data.epoch import EpochRun
from launcher.data.shards import (STATE_VERSION, complete, decode, encode, epoch_order, remaining_units,
                                  shard_length)

SETTINGS = ("size", "shard_size", "shuffle", "seed")


def attempt_key(env: Mapping[str, str]) -> str:
    """Which start of the training processes this is: launcher's membership round, torchrun's restart."""
    return f"{int(env.get('LAUNCHER_ROUND') or 0)}.{int(env.get('TORCHELASTIC_RESTART_COUNT') or 0)}"


def merge(base: dict[int, int], parts: list[dict[int, int]]) -> dict[int, int]:
    """The epoch's offsets: each shard of this attempt was claimed by one rank, whose part says how far it got."""
    offsets = dict(base)
    for part in parts:
        offsets.update(part)
    return offsets


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _work_dir_url(work_dir: str | None, world: int, env: Mapping[str, str]) -> str | None:
    """Where the claims live: ``work_dir``, else the run's work dir, else nowhere when one process is alone."""
    if work_dir:
        return work_dir
    root, run_id = env.get("LAUNCHER_WORK_DIR"), env.get("LAUNCHER_RUN_ID")
    if root and run_id:
        return f"{root.rstrip('/')}/{run_id}"
    if world == 1:
        return None
    missing = " and ".join(name for name, value in (("LAUNCHER_WORK_DIR", root), ("LAUNCHER_RUN_ID", run_id))
                           if not value)
    raise RuntimeError(
        f"ElasticSampler: {world} training processes must share their claims through a work dir, and {missing} "
        f"{'is' if ' and ' not in missing else 'are'} not set (launcher's nodes set them). Start the job with "
        f"`launcher run`, or pass work_dir= a directory or s3:// / oci:// URL every process can reach, "
        f"a new one for each run.")


class ElasticSampler(Sampler[int], Joinable):
    """Hands out the indices ``0..size-1`` of each epoch so that, across all ranks and through restarts and
    membership changes, the model lineage trains every index once per epoch.

    ``shard_size`` indices form a unit of claiming; ``prefetch`` units are claimed ahead in a background
    thread. ``checkpoint_every`` (steps) lets ranks that ran out of data inside ``Join([model, sampler])``
    take part in the collective ``state_dict()`` of the ranks still training (``checkpoint_due()``).
    """

    def __init__(self, size: int, shard_size: int = 256, shuffle: bool = True, seed: int = 0, *,
                 prefetch: int = 2, checkpoint_every: int | None = None, work_dir: str | None = None,
                 rank: int | None = None, world_size: int | None = None):
        Joinable.__init__(self)
        for name, value, least in (("size", size, 0), ("shard_size", shard_size, 1), ("prefetch", prefetch, 1),
                                   ("checkpoint_every", 1 if checkpoint_every is None else checkpoint_every, 1)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"ElasticSampler: {name} must be an integer >= {least}, not {value!r}")
        self.size, self.shard_size, self.shuffle, self.seed = size, shard_size, bool(shuffle), seed
        self.prefetch = prefetch
        self.checkpoint_every = checkpoint_every
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.attempt = attempt_key(os.environ)
        url = _work_dir_url(work_dir, self.world_size, os.environ)
        if url is None:
            self._store = None
        else:
            from launcher.node.store import WorkDir

            self._store = WorkDir(url)
        self._loaded: dict[str, Any] | None = None
        self._run: EpochRun | None = None
        self._epoch: int | None = None
        self.counted = False  # set by ElasticLoader: the loop's consumption is known, not only what was handed out
        self._in_join = False

    # -- epochs ------------------------------------------------------------------------------
    def epochs(self, start: int | None = None, end: int | None = None) -> Iterator[int]:
        """The epochs to train, ``start`` (default: where the loaded state left off) up to ``end``; an epoch
        the loaded state holds as complete is skipped. The body of each is the training of that epoch."""
        if end is None:
            raise TypeError("ElasticSampler.epochs() needs end= (the number of epochs)")
        first = self._resume_epoch() if start is None else start
        try:
            for epoch in range(first, end):
                loaded = self._loaded_offsets(epoch)
                if loaded is not None and complete(loaded, size=self.size, shard_size=self.shard_size):
                    continue
                self.set_epoch(epoch)
                yield epoch
        finally:
            self._close_run()

    def set_epoch(self, epoch: int) -> None:
        """Begin ``epoch`` (as with DistributedSampler); claiming starts at once, in the background."""
        self._close_run()
        base = self._loaded_offsets(epoch) or {}
        claims = MemoryClaims() if self._store is None else Claims(self._store, epoch, self.attempt, self.rank)
        self._epoch = epoch
        self._run = EpochRun(epoch=epoch, order=epoch_order(self.size, self.seed, epoch, self.shuffle), base=base,
                             size=self.size, shard_size=self.shard_size, claims=claims, rank=self.rank,
                             world=self.world_size, prefetch=self.prefetch)

    def __iter__(self) -> Iterator[int]:
        if self._run is None:
            self.set_epoch(self._resume_epoch())
        assert self._run is not None
        return self._run.indices(self.counted)

    def __len__(self) -> int:
        """An estimate (claims are dynamic): this rank's even share of what the epoch has left."""
        base = self._run.base if self._run else self._loaded_offsets(self._resume_epoch()) or {}
        left = sum(shard_length(self.size, self.shard_size, k) - offset
                   for k, offset in remaining_units(self.size, self.shard_size, base))
        return -(-left // self.world_size)

    # -- the loop's consumption (ElasticLoader) ---------------------------------------------
    def note_batch(self, length: int) -> None:
        """The loop received a batch of ``length`` indices (called by ElasticLoader)."""
        run = self._run
        if run is not None:
            run.steps += 1
            run.consume(run.consumed + length)

    def checkpoint_due(self) -> bool:
        """Whether this step is one where every rank, joined or not, takes part in ``state_dict()``."""
        run = self._run
        return bool(self.checkpoint_every and run and run.steps and run.steps % self.checkpoint_every == 0)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The merged progress of the current epoch over all ranks. Collective: every rank calls it (inside
        ``Join([model, sampler])``, at the steps ``checkpoint_due()`` names, or after the Join block)."""
        run = self._run
        if run is None:
            return self._loaded or self._state(self._resume_epoch(), {})
        if self._in_join and self.checkpoint_every and not self.checkpoint_due():
            raise RuntimeError(
                f"ElasticSampler.state_dict() inside Join at step {run.steps}: ranks that ran out of data take "
                f"part only every checkpoint_every={self.checkpoint_every} steps (use sampler.checkpoint_due())")
        if not self.counted and run.yielded and not run.exhausted:
            warnings.warn(
                "ElasticSampler.state_dict(): the sampler is not read through launcher.data.ElasticLoader, so it "
                "counts every index it handed out as trained. That is exact with DataLoader(num_workers=0); with "
                "worker processes, batches still prefetched now would be skipped after a restore. Use "
                "ElasticLoader (it takes DataLoader's arguments).", stacklevel=2)
        return self._state(run.epoch, merge(run.base, self._gather(run.offsets())))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state_dict(): the epoch's untrained rest is what the next attempt hands out."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"ElasticSampler.load_state_dict: unknown state version {state.get('version')!r}")
        for name in SETTINGS:
            if state.get(name) != getattr(self, name):
                raise ValueError(f"ElasticSampler.load_state_dict: the state was saved with {name}={state.get(name)!r}, "
                                 f"this sampler has {name}={getattr(self, name)!r}; the epoch's shards would differ")
        if self._run is not None and self._run.epoch == state.get("epoch"):
            raise RuntimeError("ElasticSampler.load_state_dict: epoch already started; load the state before it")
        self._loaded = dict(state)

    def _state(self, epoch: int, offsets: dict[int, int]) -> dict[str, Any]:
        encoded = encode(offsets, size=self.size, shard_size=self.shard_size)
        return {"version": STATE_VERSION, "epoch": epoch, **{name: getattr(self, name) for name in SETTINGS},
                "complete": complete(offsets, size=self.size, shard_size=self.shard_size), **encoded}

    def _loaded_offsets(self, epoch: int) -> dict[int, int] | None:
        if self._loaded is None or self._loaded["epoch"] != epoch:
            return None
        return decode(self._loaded, size=self.size, shard_size=self.shard_size)

    def _resume_epoch(self) -> int:
        if self._loaded is None:
            return 0
        return self._loaded["epoch"] + (1 if self._loaded.get("complete") else 0)

    def _gather(self, part: dict[int, int]) -> list[dict[int, int]]:
        if self.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return [part]
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, part)
        return parts

    def _close_run(self) -> None:
        if self._run is not None:
            self._run.close()

    # -- Join: ranks out of data shadow the state_dict() collectives of the others -------------
    def join_hook(self, **kwargs: Any) -> JoinHook:
        self._in_join = True
        return _SamplerJoinHook(self)

    @property
    def join_device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @property
    def join_process_group(self) -> Any:
        return dist.group.WORLD


class _SamplerJoinHook(JoinHook):
    """Runs once per step of the ranks still training (after DDP's hook): counts the step and, where a
    checkpoint is due, sends this rank's final progress into their state_dict() collective."""

    def __init__(self, sampler: ElasticSampler):
        self.sampler = sampler

    def main_hook(self) -> None:
        run = self.sampler._run
        if run is None:
            return
        run.steps += 1
        if self.sampler.checkpoint_due():
            self.sampler._gather(run.offsets())

    def post_hook(self, is_last_joiner: bool) -> None:
        self.sampler._in_join = False
