"""launcher.data's cost: (a) training throughput of the example (templates/pytorch/train.py's model on the
digits data) with ElasticSampler + ElasticLoader (+ Join) against DistributedSampler, side by side in one
2-process gloo group, alternating; (b) claims per second on a local directory and on loopback S3 (moto).

    .venv/bin/python benchmarks/sampler.py [--repeats 5] [--epochs 3] [--claims 300]
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


def _epochs(variant: str, sampler, loader, model, optimizer, epochs: int, first: int) -> int:
    import torch
    from torch.distributed.algorithms.join import Join

    loss_fn = torch.nn.CrossEntropyLoss()
    seen = 0
    for epoch in range(first, first + epochs):
        if variant == "elastic":
            sampler.set_epoch(epoch)
            context = Join([model, sampler])
        else:
            sampler.set_epoch(epoch)
            context = Join([model], enable=variant == "distributed+join")
        with context:
            for features, labels in loader:
                optimizer.zero_grad()
                loss_fn(model(features), labels).backward()
                optimizer.step()
                seen += len(labels)
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
    loaders = {"distributed": (plain, plain_loader), "distributed+join": (plain, plain_loader),
               "elastic": (elastic, ElasticLoader(train_set, batch_size=32, sampler=elastic))}
    totals = {name: [] for name in loaders}
    _epochs("distributed", plain, loaders["distributed"][1], model, optimizer, 1, 0)  # warm-up
    for repeat in range(repeats):
        for name, (sampler, loader) in loaders.items():
            dist.barrier()
            started = time.perf_counter()
            seen = torch.tensor([_epochs(name, sampler, loader, model, optimizer, epochs, 1 + repeat * epochs)])
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
    return {name: median(values) for name, values in totals.items()}


def claims_per_second(url: str, count: int) -> float:
    from launcher.data.claims import Claims
    from launcher.node.store import WorkDir

    claims = Claims(WorkDir(url), 0, "0.0", 0)
    started = time.perf_counter()
    won = sum(claims.claim(f"{unit}-0") for unit in range(count))
    elapsed = time.perf_counter() - started
    assert won == count
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per variant per repeat")
    parser.add_argument("--claims", type=int, default=300)
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
        print(f"  DistributedSampler + DataLoader + Join     {rates['distributed+join']:10.0f} samples/s")
        print(f"  ElasticSampler + ElasticLoader + Join      {rates['elastic']:10.0f} samples/s")
        print(f"  ratio elastic / distributed                {rates['elastic'] / rates['distributed']:10.3f}")

    from s3server import MotoServer

    moto = MotoServer()
    try:
        os.environ.update(moto.env())  # before fsspec is imported: it reads FSSPEC_* variables then
        moto.make_bucket("bench-claims")
        s3 = claims_per_second("s3://bench-claims/runs/r1", args.claims)
    finally:
        moto.stop()
    with tempfile.TemporaryDirectory() as tmp:
        local = claims_per_second(f"{tmp}/run", args.claims)
    print(f"claims per second, one claimer, {args.claims} units:")
    print(f"  local directory                            {local:10.0f} claims/s ({1000 / local:.2f} ms each)")
    print(f"  S3 (moto_server on loopback)               {s3:10.0f} claims/s ({1000 / s3:.2f} ms each)")


if __name__ == "__main__":
    main()
