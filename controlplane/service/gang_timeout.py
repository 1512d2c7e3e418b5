"""Gang start timeout: a run whose pods are not all running `timeout` seconds after it was applied to
its cluster is torn down and its workload requeued as a unit (Kueue's waitForPodsReady). A partially
started gang holds GPUs without doing work, and may block another gang's pods from ever starting."""

from __future__ import annotations

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
NOT_RUNNING = (WorkloadState.ADMITTED, WorkloadState.DISPATCHING)


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
        if _requeue(uow_factory, prefix, run, reason, EndCause.GANG_START_TIMEOUT, now):
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
        if _requeue(uow_factory, prefix, run, reason, EndCause.DISPATCH_TIMEOUT, now):
            ended.append(run.run_id)
    return ended


def _requeue(
    uow_factory: UnitOfWorkFactory, prefix: str, run: StalledRun, reason: str, cause: EndCause, now: datetime
) -> bool:
    """End one run and requeue its workload in one transaction, announcing `requeued` with the reason;
    False when the run was no longer waiting (a pod report or the dispatcher got there first)."""
    with uow_factory() as uow:
        if not uow.cloud.requeue_run(run.run_id, reason, cause, now):
            return False
        uow.workloads.set_state(run.workload_id, NOT_RUNNING, WorkloadState.QUEUED, reason, now)
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
