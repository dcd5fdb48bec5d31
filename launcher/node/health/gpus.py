"""Each GPU's utilisation, memory, power and temperature, and which processes use it.

Through NVIDIA's own library, NVML (``nvidia-ml-py``, imported as ``pynvml``), where it imports and initialises;
else through ``nvidia-smi`` (one query per sample, which cannot tell the processes); else there are none. Which
of the three is decided once: a machine without a driver does not look for it again every sample. Only the GPUs
this node was given are read (``CUDA_VISIBLE_DEVICES``, as launcher.gpus resolves it); NVML and ``nvidia-smi``
both number GPUs as the machine does, whatever that variable says.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, Collection

SMI_FIELDS = "index,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"
SMI_TIMEOUT_SECONDS = 10
MIB = 1 << 20

GpuFigures = dict[str, Any]


def _number(text: str) -> float | None:
    """A figure of nvidia-smi's CSV; None for what it cannot tell (``[N/A]``, ``[Not Supported]``)."""
    try:
        return float(text)
    except ValueError:
        return None


def parse_smi(listing: str) -> list[GpuFigures]:
    """``nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits`` as GPU figures."""
    gpus = []
    for line in listing.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 7 or not fields[0].isdigit():
            continue
        used, total, power = _number(fields[3]), _number(fields[4]), _number(fields[5])
        gpus.append({"index": int(fields[0]), "name": fields[1], "util_percent": _number(fields[2]),
                     "mem_used_bytes": None if used is None else int(used * MIB),
                     "mem_total_bytes": None if total is None else int(total * MIB),
                     "power_watts": power, "temp_c": _number(fields[6])})
    return gpus


class GpuReader:
    """Reads this node's GPUs; ``allowed``: the machine's indices (as text) of the GPUs it was given, None: all."""

    def __init__(self, allowed: Collection[str] | None = None):
        self.allowed = None if allowed is None else set(allowed)
        self.nvml: Any = _nvml()
        self.smi = None if self.nvml else shutil.which("nvidia-smi")

    @property
    def source(self) -> str | None:
        return "nvml" if self.nvml else "nvidia-smi" if self.smi else None

    def read(self) -> tuple[list[GpuFigures], dict[int, int]]:
        """(the GPUs' figures, pid -> position in that list of the GPU it computes on, where NVML tells)."""
        if self.nvml:
            return self._read_nvml()
        if self.smi:
            return [gpu for gpu in parse_smi(self._query_smi()) if self._wanted(gpu["index"])], {}
        return [], {}

    def _wanted(self, index: int) -> bool:
        return self.allowed is None or str(index) in self.allowed

    def _query_smi(self) -> str:
        try:
            done = subprocess.run([self.smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=SMI_TIMEOUT_SECONDS)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout if done.returncode == 0 else ""

    def _read_nvml(self) -> tuple[list[GpuFigures], dict[int, int]]:
        nvml = self.nvml
        gpus: list[GpuFigures] = []
        users: dict[int, int] = {}
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception:  # noqa: BLE001 - the driver went away: no figures this time
            return [], {}
        for index in range(count):
            if not self._wanted(index):
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception:  # noqa: BLE001
                continue
            name = _ask(nvml.nvmlDeviceGetName, handle)
            utilisation = _ask(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = _ask(nvml.nvmlDeviceGetMemoryInfo, handle)
            power = _ask(nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
            gpus.append({"index": index, "name": name.decode() if isinstance(name, bytes) else name,
                         "util_percent": None if utilisation is None else float(utilisation.gpu),
                         "mem_used_bytes": None if memory is None else int(memory.used),
                         "mem_total_bytes": None if memory is None else int(memory.total),
                         "power_watts": None if power is None else power / 1000,
                         "temp_c": _ask(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)})
            for process in _ask(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or ():
                users.setdefault(int(process.pid), index)
        return gpus, users


def _ask(call: Any, *args: Any) -> Any:
    """One NVML query; None where this GPU or driver does not support it."""
    try:
        return call(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and its kin
        return None


def _nvml() -> Any:
    """The initialised ``pynvml`` module, or None without the library or a driver it can load."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - not installed, no libnvidia-ml, no driver
        return None
    return pynvml
