"""NVIDIA GPUs of this machine, without importing torch: counted by ``nvidia-smi`` (or the
driver's ``/proc/driver/nvidia/gpus``), filtered by ``CUDA_VISIBLE_DEVICES`` as CUDA would.

Used by the client (to share a machine's GPUs out among local nodes or containers: one
partition for every backend) and by each node (``processesPerNode: auto``, its status record,
and the early check that it sees the GPUs it is asked to use).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from launcher.wording import plural

if TYPE_CHECKING:
    from launcher.spec.model import Spec

PROC_GPUS = Path("/proc/driver/nvidia/gpus")
QUERY = "index,uuid,name,memory.total,driver_version"
SMI_TIMEOUT_SECONDS = 20


@dataclass(frozen=True)
class Gpu:
    index: str
    uuid: str = ""
    name: str = "NVIDIA GPU"
    memory_mib: int | None = None
    driver: str | None = None


def _smi(*args: str) -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def installed_gpus() -> list[Gpu]:
    """Every GPU the driver knows, whatever CUDA_VISIBLE_DEVICES says."""
    listing = _smi(f"--query-gpu={QUERY}", "--format=csv,noheader,nounits")
    if listing is not None:
        gpus = []
        for line in listing.splitlines():
            fields = [field.strip() for field in line.split(",")]
            if len(fields) == 5 and fields[0].isdigit():
                memory = int(fields[3]) if fields[3].isdigit() else None
                gpus.append(Gpu(fields[0], fields[1], fields[2], memory, fields[4]))
        return gpus
    if PROC_GPUS.is_dir():  # a driver without nvidia-smi on PATH (e.g. a slim container)
        return [Gpu(str(i)) for i, _ in enumerate(sorted(PROC_GPUS.iterdir()))]
    return []


def visible_gpus(env: Mapping[str, str] | None = None) -> list[Gpu]:
    """The GPUs a CUDA program started with ``env`` would see, in CUDA's order."""
    env = os.environ if env is None else env
    gpus = installed_gpus()
    wanted = env.get("CUDA_VISIBLE_DEVICES")
    if wanted is None:
        return gpus
    chosen = []
    for item in (part.strip() for part in wanted.split(",")):
        match = next((g for g in gpus if item and (g.index == item or (g.uuid and g.uuid.startswith(item)))), None)
        if match is None:
            break  # CUDA stops at the first entry it cannot resolve
        chosen.append(match)
    return chosen


def partition(nodes: int, processes: int | None, gpus: Sequence[str]) -> tuple[list[str] | None, str | None]:
    """Share ``gpus`` (their ids) out among ``nodes`` nodes of one machine.

    Returns a CUDA_VISIBLE_DEVICES value per node (None: leave it alone) and a note for the
    user. ``processes`` None means ``auto``: as many per node as the GPUs allow, at least one.
    When the GPUs cannot give every process its own, no node gets one: a mix of nccl and gloo
    ranks, or two ranks on one GPU, would hang or fail at the first collective.
    """
    if not gpus:
        return None, None
    per_node = processes if processes is not None else len(gpus) // nodes
    if per_node >= 1 and nodes * per_node <= len(gpus):
        shares: list[str] = []
        for _ in range(nodes):
            shares.append(free_share(gpus, shares, per_node) or "")  # never None: there are enough
        return shares, f"{plural(len(gpus), 'GPU')} here: {per_node} per node"
    wanted = nodes * (processes or 1)
    return [""] * nodes, (f"{wanted} processes but {plural(len(gpus), 'GPU')}: "
                          "running on CPU")


def free_share(gpus: Sequence[str], taken: Iterable[str], size: int) -> str | None:
    """``size`` of ``gpus`` (their ids, in order) that none of the ``taken`` shares ("0,1") holds, as a
    CUDA_VISIBLE_DEVICES value; None when fewer are free. How :func:`partition` shares a machine out, and how a
    node added to a running run (``launcher scale``) gets GPUs beside its nodes."""
    held = {gpu for share in taken for gpu in share.split(",") if gpu}
    free = [gpu for gpu in gpus if gpu not in held]
    return ",".join(free[:size]) if len(free) >= size else None


def pins_devices(spec: "Spec") -> bool:
    """Whether the spec sets CUDA_VISIBLE_DEVICES itself: then launcher leaves the GPUs alone."""
    variables = (*spec.cluster.env, *spec.runtime.env, *(var for group in spec.cluster.groups for var in group.env))
    return any(var.name == "CUDA_VISIBLE_DEVICES" for var in variables)


def node_gpu_shares(spec: "Spec") -> tuple[list[str] | None, str | None]:
    """This machine's GPUs shared out among the spec's nodes when they all run here (local processes,
    containers on this engine): a device list per node ("" for none), or None to leave devices alone."""
    if pins_devices(spec):
        return None, None
    return partition(spec.cluster.node_count, spec.cluster.processes_per_node, [gpu.index for gpu in visible_gpus()])


def cuda_driver_version() -> str | None:
    header = _smi() or ""
    found = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return found.group(1) if found else None


def _package_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def accelerator_report(gpus: Sequence[Gpu]) -> dict:
    """What a node records in its status: GPUs, driver and CUDA, torch and NCCL (no torch import)."""
    return {
        "gpus": [asdict(gpu) for gpu in gpus],
        "count": len(gpus),
        "driver": gpus[0].driver if gpus else None,
        "cuda": cuda_driver_version() if gpus else None,
        "torch": _package_version("torch"),
        "nccl": _package_version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"),
    }


def describe(report: Mapping) -> str:
    """``2 x NVIDIA H100 80GB HBM3 (81559 MiB), driver 580.65, CUDA 13.0`` or ``CPU only``."""
    gpus = report.get("gpus") or []
    if not gpus:
        return "CPU only"
    names = sorted({gpu["name"] for gpu in gpus})
    memory = gpus[0].get("memory_mib")
    text = f"{len(gpus)} x {' / '.join(names)}" + (f" ({memory} MiB)" if memory else "")
    for label, key in (("driver", "driver"), ("CUDA", "cuda"), ("NCCL", "nccl")):
        if report.get(key):
            text += f", {label} {report[key]}"
    return text
