"""What recovery means for a spec on OCI, in words, for ``validate``, ``--dry-run`` and ``run``. Asks no service and
imports no SDK (the launch mode ``auto`` reads the installed SDK's version from its metadata)."""

from __future__ import annotations

from launcher.backends.oci.bodies import launch_mode
from launcher.spec.model import DataScienceJobInfra, Spec


def recovery_notes(spec: Spec) -> tuple[str, ...]:
    """What recovery means in the spec's launch mode (nothing for a run that does not recover)."""
    cluster = spec.cluster
    if not cluster.recovery or not isinstance(spec.infra, DataScienceJobInfra):
        return ()
    restarts = f"up to {cluster.recovery.max_restarts} restarts"
    who = "by whichever launcher command is following or asked about the run (run, watch, status)"
    if launch_mode(spec.infra) == "perNode":
        return (f"recovery: a lost node (its job run ended before the node reported its end) gets a new job run "
                f"for it alone, {restarts}, created {who}; the other job runs keep running",)
    retried = (f"the run is retried as a whole, {restarts}: a new job run, its next attempt, whose nodes first "
               f"restore the newest outputs (checkpoints) of the attempts before, created {who}")
    if cluster.elastic:
        return ("recovery: in launchMode native a lost replica is not replaced (the service starts a job run's "
                f"replicas together, not one alone); the others go on down to minNodes {cluster.elastic.min_nodes}; "
                f"when the job run fails all the same, {retried} (restarts are shared with the rounds)",)
    return ("recovery: in launchMode native a lost replica cannot be replaced alone (the service starts a job run's "
            f"replicas together), so the nodes of an attempt fail fast and, when the job run fails, {retried}",)
