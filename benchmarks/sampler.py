"""launcher.data's cost: (a) training throughput of the example (templates/pytorch/train.py's model on the
digits data) with ElasticSampler + ElasticLoader against DistributedSampler + DataLoader, side by side in one
2-process gloo group, alternating; (b) how fast the work dir takes launcher.data's records (a rank's progress,
written off the training thread) on a local directory and on loopback S3 (moto).

    .venv/bin/python benchmarks/sampler.py [--repeats 5] [--epochs 3] [--records 300]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time

from common import REPO, median

sys.path.insert(0, str(REPO / "templates" / "pytorch"))
sys.path.insert(0, str(REPO / "tests"))


def _epochs(sampler, loader, model, optimizer, epochs: int, first: int) -> int:
    """The example's loop, with a sampler state_dict() per epoch (what its checkpoint holds) for both."""
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    seen = 0
    for epoch in range(first, first + epochs):
        sampler.set_epoch(epoch)
        for features, labels in loader:
            optimizer.zero_grad()
            loss_fn(model(features), labels).backward()
            optimizer.step()
            seen += len(labels)
        if hasattr(sampler, "state_dict"):
            sampler.state_dict()
    return seen


def _model(hidden: int):
    """The example's MLP (hidden 0), or a wider one whose step is long enough to time steadily."""
    from torch import nn

    from train import make_model

    if not hidden:
        return make_model()
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def _rank(rank: int, world: int, init: str, work_dir: str, repeats: int, epochs: int, shard_size: int,
          hidden: int, out) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from launcher.data import ElasticLoader, ElasticSampler
    from train import load_digits_split

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    train_set, _ = load_digits_split()
    torch.manual_seed(0)
    model = DistributedDataParallel(_model(hidden))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    plain = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
    elastic = ElasticSampler(len(train_set), shard_size=shard_size, shuffle=True, seed=0, work_dir=work_dir)
    plain_loader = DataLoader(train_set, batch_size=32, sampler=plain)
    loaders = {"distributed": (plain, plain_loader),
               "elastic": (elastic, ElasticLoader(train_set, batch_size=32, sampler=elastic))}
    totals: dict[str, list[float]] = {name: [] for name in loaders}
    for sampler, loader in loaders.values():  # warm-up
        _epochs(sampler, loader, model, optimizer, 1, 0)
    for repeat in range(repeats):
        order = list(loaders.items())
        for name, (sampler, loader) in order if repeat % 2 == 0 else order[::-1]:  # ABBA: drift cancels
            dist.barrier()
            started = time.perf_counter()
            seen = torch.tensor([_epochs(sampler, loader, model, optimizer, epochs, 1 + repeat * epochs)])
            elapsed = torch.tensor([time.perf_counter() - started])
            dist.all_reduce(seen)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            totals[name].append(seen.item() / elapsed.item())
    if rank == 0:
        out.put(totals)
    dist.barrier()


def throughput(repeats: int, epochs: int, shard_size: int, hidden: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [context.Process(target=_rank, args=(r, 2, f"{tmp}/init", f"{tmp}/wd", repeats, epochs,
                                                                shard_size, hidden, out))
                 for r in range(2)]
        for proc in procs:
            proc.start()
        totals = out.get(timeout=600)
        for proc in procs:
            proc.join(timeout=60)
    rates = {name: median(values) for name, values in totals.items()}
    # Each repeat runs the two side by side, so their ratio is steadier than the ratio of medians when other
    # work on the machine comes and goes.
    rates["ratio"] = median([e / d for e, d in zip(totals["elastic"], totals["distributed"])])
    rates["ratio_low"], rates["ratio_high"] = (min(e / d for e, d in zip(totals["elastic"], totals["distributed"])),
                                               max(e / d for e, d in zip(totals["elastic"], totals["distributed"])))
    return rates


def records_per_second(url: str, count: int) -> float:
    """Progress records written one after another, as the background writer does (without its pacing)."""
    import json

    from launcher.data.records import progress_key
    from launcher.protocol.store import WorkDir

    store = WorkDir(url)
    started = time.perf_counter()
    for consumed in range(count):
        store.put(progress_key(0, "0.0", 0), json.dumps({"consumed": consumed, "of": count}).encode())
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per variant per repeat")
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--shard-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, nargs="*", default=[0, 1024],
                        help="hidden width of the MLP; 0 = the example's own model")
    args = parser.parse_args()

    for hidden in args.hidden:
        rates = throughput(args.repeats, args.epochs, args.shard_size, hidden)
        model = "the example's MLP" if not hidden else f"an MLP of hidden width {hidden}"
        print(f"training throughput, 2 processes (gloo, CPU), {model} on digits, batch 32, shard_size "
              f"{args.shard_size}, median of {args.repeats} x {args.epochs} epochs each:")
        print(f"  DistributedSampler + DataLoader            {rates['distributed']:10.0f} samples/s")
        print(f"  ElasticSampler + ElasticLoader             {rates['elastic']:10.0f} samples/s")
        print(f"  ratio elastic / distributed, per repeat    {rates['ratio']:10.3f} (median; "
              f"{rates['ratio_low']:.3f}-{rates['ratio_high']:.3f})")

    from s3server import MotoServer

    moto = MotoServer()
    try:
        os.environ.update(moto.env())  # before fsspec is imported: it reads FSSPEC_* variables then
        moto.make_bucket("bench-records")
        s3 = records_per_second("s3://bench-records/runs/r1", args.records)
    finally:
        moto.stop()
    with tempfile.TemporaryDirectory() as tmp:
        local = records_per_second(f"{tmp}/run", args.records)
    print(f"progress records per second, one writer, {args.records} writes (in training: off the training "
          f"thread, at most 2 per second per rank):")
    print(f"  local directory                            {local:10.0f} records/s ({1000 / local:.2f} ms each)")
    print(f"  S3 (moto_server on loopback)               {s3:10.0f} records/s ({1000 / s3:.2f} ms each)")


if __name__ == "__main__":
    main()
