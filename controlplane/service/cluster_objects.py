"""What a cluster lists against what SQL says, from one listing per cluster and pass:

- orphans: objects of runs gpufleet no longer considers live (ended while the dispatcher was down,
  a dispatch retried after a crash) are deleted;
- vanished runs: live runs applied more than `grace` seconds ago whose objects the cluster no longer
  lists (deleted behind gpufleet's back, a cluster restored from an older backup) are ended as
  `objects-lost` and their workloads requeued (`gang_timeout.requeue_run`).

Each cluster on its own: one that is deleted, unreachable or failing is logged and skipped (none of
its runs is judged), and the others are done all the same. The order of the reads matters:
applied runs are read *before* the listing, so a run applied in between is never taken for
vanished; live runs *after* it, so an object created in between is never taken for an orphan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controlplane.core.decision import EndCause
from controlplane.service.errors import StoreUnavailable
from controlplane.service.gang_timeout import DEFAULT_VANISHED_GRACE, OBJECTS_LOST_PREFIX, requeue_run
from controlplane.service.metrics import NO_METRICS, ClusterOperation, DispatchFailure, Metrics
from controlplane.service.ports import ClusterDriver, UnitOfWorkFactory

log = logging.getLogger(__name__)


@dataclass
class ObjectsPass:
    """What one pass did: orphan runs whose objects were deleted, vanished runs requeued."""

    deleted: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)


async def reconcile_cluster_objects(
    uow_factory: UnitOfWorkFactory,
    drivers: Mapping[str, ClusterDriver],
    prefix: str,
    clock: Callable[[], datetime],
    grace: float = DEFAULT_VANISHED_GRACE,
    metrics: Metrics = NO_METRICS,
) -> ObjectsPass:
    done = ObjectsPass()
    for cluster, driver in drivers.items():
        try:
            with uow_factory() as uow:
                expected = uow.cloud.applied_runs(cluster, clock() - timedelta(seconds=grace))
            owned = await driver.list_owned()
            with uow_factory() as uow:
                live = uow.runs.live_run_ids(cluster)
        except StoreUnavailable:
            raise  # nothing can be decided without the database, for any cluster
        except Exception as exc:
            metrics.dispatch_failed(cluster, ClusterOperation.LIST, DispatchFailure.TRANSIENT)
            log.warning(
                "cannot list the runs of %s (%s: %s); none of its objects or runs is judged, the other clusters go on",
                cluster,
                type(exc).__name__,
                exc,
                extra={"cluster": cluster},
            )
            continue
        try:
            for run_id in sorted(owned - live):
                log.info("deleting orphan run %s on %s", run_id, cluster, extra={"cluster": cluster, "run": run_id})
                await driver.delete(run_id)
                done.deleted.append(run_id)
        except StoreUnavailable:
            raise
        except Exception as exc:
            metrics.dispatch_failed(cluster, ClusterOperation.TEARDOWN, DispatchFailure.TRANSIENT)
            log.warning(
                "deleting orphans on %s failed (%s: %s); retried next pass",
                cluster,
                type(exc).__name__,
                exc,
                extra={"cluster": cluster},
            )
        for run in expected:
            if run.run_id in owned:
                continue
            reason = f"{OBJECTS_LOST_PREFIX} the objects of run {run.run_id} are gone from cluster {cluster}"
            if requeue_run(uow_factory, prefix, run, reason, EndCause.OBJECTS_LOST, clock(), running_too=True):
                log.warning(
                    "run %s vanished from %s; its workload %s is requeued",
                    run.run_id,
                    cluster,
                    run.workload_id,
                    extra={"cluster": cluster, "run": run.run_id, "workload": run.workload_id},
                )
                done.requeued.append(run.run_id)
    return done
