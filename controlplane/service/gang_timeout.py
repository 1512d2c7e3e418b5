"""The rescues of a run that will not finish on its own; each ends the run as `preempted` and puts its
workload back in its queue as a unit (`workload.requeued` with the reason):

- gang start timeout: pods not all running `timeout` seconds after the run was applied to its cluster
  (Kueue's waitForPodsReady). A partially started gang holds GPUs without doing work, and may block
  another gang's pods from ever starting;
- dispatch timeout: a run admitted long ago that no dispatcher could apply;
- vanished run: a run applied to its cluster whose objects the cluster no longer has (deleted behind
  gpufleet's back, a cluster restored from an older backup). No pod report will ever come for it, so
  without this its workload would stay `running` forever (found by `cluster_objects.py`, which
  lists each cluster once for this and for orphans).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from controlplane.core.decision import EndCause
from controlplane.domain.model import WorkloadState
from controlplane.service.cloud_state import StalledRun
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.service.workloads import emit

DEFAULT_GANG_START_TIMEOUT = 600.0
# An admitted run that no dispatcher applied to its cluster within this long (a cluster without a
# driver, unreachable, or refusing every call) gives its capacity back and waits in its queue again.
DEFAULT_DISPATCH_TIMEOUT = 300.0
# A run applied this recently may not be listed by its cluster yet (a cache, a slow controller).
DEFAULT_VANISHED_GRACE = 60.0
NOT_RUNNING = (WorkloadState.ADMITTED, WorkloadState.DISPATCHING)
LIVE = (*NOT_RUNNING, WorkloadState.RUNNING)
OBJECTS_LOST_PREFIX = "objects-lost:"

log = logging.getLogger(__name__)


def requeue_stalled_gangs(
    uow_factory: UnitOfWorkFactory, prefix: str, clock: Callable[[], datetime], timeout: float
) -> list[str]:
    """Requeue every gang dispatched more than `timeout` seconds ago that is not running; returns the
    run ids ended. One transaction per run, each re-checking the run's state (a pod report may have
    made it run meanwhile)."""
    now = clock()
    with uow_factory() as uow:
        stalled = uow.cloud.stalled_runs(now - timedelta(seconds=timeout))
    ended: list[str] = []
    for run in stalled:
        waited = (now - run.dispatched_at).total_seconds()
        reason = (
            f"{EndCause.GANG_START_TIMEOUT}: pods not all running {waited:.0f}s after dispatch to {run.cluster}"
            f" (limit {timeout:g}s)"
        )
        if requeue_run(uow_factory, prefix, run, reason, EndCause.GANG_START_TIMEOUT, now):
            ended.append(run.run_id)
    return ended


def requeue_undispatched(
    uow_factory: UnitOfWorkFactory, prefix: str, clock: Callable[[], datetime], timeout: float
) -> list[str]:
    """Requeue every run admitted more than `timeout` seconds ago that was never applied to its
    cluster; returns the run ids ended. The reason names the cluster, so an operator sees which one
    takes no work. Its teardown is harmless if nothing reached the cluster, and removes what did."""
    now = clock()
    with uow_factory() as uow:
        stuck = uow.cloud.undispatched_runs(now - timedelta(seconds=timeout))
    ended: list[str] = []
    for run in stuck:
        waited = (now - run.dispatched_at).total_seconds()
        reason = (
            f"{EndCause.DISPATCH_TIMEOUT}: cluster {run.cluster} did not take the run {waited:.0f}s after admission"
            f" (limit {timeout:g}s; no driver for it, or it is unreachable)"
        )
        if requeue_run(uow_factory, prefix, run, reason, EndCause.DISPATCH_TIMEOUT, now):
            ended.append(run.run_id)
    return ended


def requeue_run(
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    run: StalledRun,
    reason: str,
    cause: EndCause,
    now: datetime,
    running_too: bool = False,
) -> bool:
    """End one run and requeue its workload in one transaction, announcing `requeued` with the reason;
    False when the run was no longer live (or, without `running_too`, no longer waiting): a pod report
    or the dispatcher got there first."""
    with uow_factory() as uow:
        if not uow.cloud.requeue_run(run.run_id, reason, cause, now, running_too=running_too):
            return False
        uow.workloads.set_state(
            run.workload_id, LIVE if running_too else NOT_RUNNING, WorkloadState.QUEUED, reason, now
        )
        emit(
            uow,
            prefix,
            run.queue,
            "requeued",
            run.workload_id,
            now,
            run_id=run.run_id,
            cluster=run.cluster,
            reason=reason,
        )
        uow.commit()
    return True
