"""Example DDP training: a small MLP on scikit-learn's bundled handwritten digits (no downloads).

Runs under torchrun on any number of nodes and processes: gloo on CPU, nccl on GPU.
Writes a checkpoint per epoch (model, optimizer and data progress) into LAUNCHER_CHECKPOINT_DIR and
the final model to the outputs directory (LAUNCHER_OUTPUTS_DIR, set by the launcher node bootstrap,
or --output-dir), and resumes from the newest checkpoint found there. The data is handed out by
launcher.data.ElasticSampler: every sample is trained once per epoch even when nodes come and go. launcher copies that directory to the
run's work dir, WORK_DIR/RUN_ID/outputs/NODE/, which is where the model is after the run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from launcher.data import ElasticLoader, ElasticSampler


def load_digits_split(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """1,797 8x8 digit images shipped inside scikit-learn; a fixed 80/20 split, features scaled to [0, 1]."""
    pixels, target = read_digits()
    features = torch.tensor(pixels, dtype=torch.float32) / 16.0
    labels = torch.tensor(target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(order))
    train, test = order[:cut], order[cut:]
    return TensorDataset(features[train], labels[train]), TensorDataset(features[test], labels[test])


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits, read from the CSV file scikit-learn bundles, without importing scikit-learn: that import
    (scipy and the rest) adds about a second of CPU to every training process's start, every round. Where a
    scikit-learn release has moved the file, its own loader reads it."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    bundled = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if bundled is None or not bundled.is_file():
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.data, digits.target
    table = np.loadtxt(bundled, delimiter=",")  # 64 pixel columns (0..16), then the label
    return table[:, :-1], table[:, -1].astype(np.int64)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def parameter_digest(model: nn.Module) -> str:
    """A short hash of every parameter: equal on all ranks when DDP kept them in sync."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def latest_checkpoint(directory: Path) -> Path | None:
    checkpoints = sorted(directory.glob("epoch-*.pt"))
    return checkpoints[-1] if checkpoints else None


def kept_at(path: Path, outputs: Path) -> str:
    """Where a file written to the outputs directory is found after the run.

    launcher copies the directory it gives each node (LAUNCHER_OUTPUTS_DIR) to the run's work dir,
    WORK_DIR/RUN_ID/outputs/NODE/, and removes it when it was a temporary one; anywhere else the
    file stays where it was written."""
    given, work_dir, run_id, node = (os.environ.get(name) for name in (
        "LAUNCHER_OUTPUTS_DIR", "LAUNCHER_WORK_DIR", "LAUNCHER_RUN_ID", "LAUNCHER_NODE_NAME"))
    if not (given and work_dir and run_id and node) or Path(given).resolve() != outputs.resolve():
        return str(path)
    return f"{work_dir.rstrip('/')}/{run_id}/outputs/{node}/{path.relative_to(outputs).as_posix()}"


def evaluate(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    model.eval()
    with torch.no_grad():
        features, labels = data.tensors
        predictions = model(features.to(device)).argmax(dim=1)
        accuracy = (predictions == labels.to(device)).float().mean().item()
    model.train()
    return accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--output-dir", default=os.environ.get("LAUNCHER_OUTPUTS_DIR", "outputs"))
    args = parser.parse_args()

    # One process per GPU: LOCAL_RANK picks this process's GPU among those the node may use
    # (launcher gives each local node its own through CUDA_VISIBLE_DEVICES).
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # before the process group, so NCCL binds the right GPU
    dist.init_process_group(backend="nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    train_set, test_set = load_digits_split()
    # Each start of the training processes splits what the epoch has left among the ranks present, so a
    # membership change never repeats or skips a sample; the loader tells the sampler what was trained.
    sampler = ElasticSampler(len(train_set), shard_size=64, shuffle=True, seed=0)
    loader = ElasticLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = DistributedDataParallel(make_model().to(device), device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    outputs = Path(args.output_dir)
    # launcher's checkpoint contract: LAUNCHER_CHECKPOINT_DIR is synced to the work dir with the outputs and
    # restored before training starts again (a restart, a replacement node, a retry or --resume-from).
    checkpoints = Path(os.environ.get("LAUNCHER_CHECKPOINT_DIR") or outputs / "checkpoints")
    # Resume only from an epoch every rank has a checkpoint of; otherwise the ranks would disagree on
    # where to start and the collectives would fail.
    resume = latest_checkpoint(checkpoints)
    # Every tensor a collective sees lives on this process's device: nccl has no CPU tensors.
    agreed = torch.tensor([int(resume.stem.split("-")[1]) if resume else 0], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    start_epoch = int(agreed.item())
    if start_epoch > 0:
        checkpoint = checkpoints / f"epoch-{start_epoch:04d}.pt"
        state = torch.load(checkpoint, map_location=device)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.load_state_dict(state["sampler"])
        print(f"rank {rank}: resumed from {checkpoint.name} (continuing at epoch {start_epoch + 1})", flush=True)

    for epoch in sampler.epochs(start=start_epoch, end=args.epochs):
        started, seen, total_loss = time.perf_counter(), 0, 0.0
        # ElasticLoader gives every rank the same number of batches: DDP's collectives always match.
        for features, labels in loader:
            features, labels = features.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(features), labels)
            loss.backward()
            optimizer.step()
            seen += len(labels)
            total_loss += loss.item() * len(labels)
        progress = sampler.state_dict()  # collective: every rank calls it
        elapsed = time.perf_counter() - started
        accuracy = evaluate(model.module, test_set, device)
        print(f"rank {rank}: epoch {epoch + 1}/{args.epochs} loss {total_loss / max(seen, 1):.4f} "
              f"test_accuracy {accuracy:.4f} samples_per_s {seen / elapsed:.1f}", flush=True)
        if rank == 0:
            checkpoints.mkdir(parents=True, exist_ok=True)
            tmp = checkpoints / f".epoch-{epoch + 1:04d}.pt.tmp"
            torch.save({"epoch": epoch, "model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "sampler": progress}, tmp)
            tmp.replace(checkpoints / f"epoch-{epoch + 1:04d}.pt")

    accuracy = evaluate(model.module, test_set, device)
    print(f"rank {rank}: final parameters {parameter_digest(model.module)}", flush=True)
    if rank == 0:
        outputs.mkdir(parents=True, exist_ok=True)
        # Saved from CPU copies: the model loads on any machine, with or without a GPU.
        torch.save({name: tensor.cpu() for name, tensor in model.module.state_dict().items()}, outputs / "model.pt")
        print(f"final test accuracy {accuracy:.4f} ({len(test_set)} held-out digits); "
              f"model saved to {kept_at(outputs / 'model.pt', outputs)}", flush=True)
    # Tear down together: a rank that destroys its process group while a peer is still saving can
    # make the peer's gloo threads abort at exit (SIGABRT, seen with torch 2.13 on CPU).
    if use_cuda:
        dist.barrier(device_ids=[local_rank])
    else:
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
