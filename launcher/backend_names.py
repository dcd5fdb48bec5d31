"""The backends by name, in one place: the registry (:mod:`launcher.backends`) imports them from here, the CLI
offers them, and a run.json read back from a work dir may name any of them. Kept free of imports, so that the
CLI's start and the run records need none of the backends' code."""

from __future__ import annotations

BACKENDS = {  # name -> "module:class", imported only when the backend is used (their SDKs are heavy)
    "local": "launcher.backends.local:LocalBackend",
    "docker": "launcher.backends.docker:DockerBackend",
    "oci": "launcher.backends.oci:OciBackend",
    "slurm": "launcher.backends.slurm:SlurmBackend",
    "kubernetes": "launcher.backends.kubernetes:KubernetesBackend",
}
BY_INFRASTRUCTURE = {"local": "local", "docker": "docker", "dataScienceJob": "oci", "slurm": "slurm",
                     "kubernetes": "kubernetes"}  # the backend that infrastructure.type implies
