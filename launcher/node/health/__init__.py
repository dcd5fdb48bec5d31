"""The node's health sampler (issue 39): every few seconds, what its machine, its GPUs and its training processes
are doing, as one sample of the health record (launcher.protocol.health).

- procfs: CPU and memory of the node's process tree and the machine, from Linux's /proc.
- gpus: each GPU's utilisation, memory, power and temperature, through NVML or ``nvidia-smi``.
- ranks: each rank's progress (launcher.data.rankprogress writes it) turned into rates and work per step.
- sampler: the thread that takes a sample every interval and hands it to the record and the status.
"""
