"""The node's entries for engines that start every node alike (Slurm, Kubernetes, PyTorchJob) and its address on
OCI."""
