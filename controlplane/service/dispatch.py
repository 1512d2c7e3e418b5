"""The dispatcher: load -> call the cluster -> apply. Never holds a transaction across a call."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.core.decision import EndCause
from controlplane.domain.model import WorkloadState
from controlplane.service.metrics import NO_METRICS, ClusterOperation, DispatchFailure, Metrics
from controlplane.service.ports import ClusterDriver, PermanentDispatchError, UnitOfWorkFactory
from controlplane.service.workloads import emit

log = logging.getLogger(__name__)


@dataclass
class DispatchStats:
    applied: int = 0
    already_present: int = 0
    torn_down: int = 0
    orphans_deleted: int = 0
    errors: list[str] = field(default_factory=list)


async def dispatch_once(
    uow_factory: UnitOfWorkFactory,
    drivers: Mapping[str, ClusterDriver],
    prefix: str,
    clock: Callable[[], datetime],
    batch: int = 100,
    metrics: Metrics = NO_METRICS,
) -> DispatchStats:
    stats = DispatchStats()
    # Only runs of clusters that have a driver: runs waiting for an unreachable or driverless
    # cluster must not fill every batch and hold up dispatch to the others (the dispatch
    # timeout requeues them).
    with uow_factory() as uow:
        orders = uow.runs.to_dispatch(batch, drivers.keys())
    for order in orders:
        driver = drivers.get(order.cluster)
        if driver is None:
            stats.errors.append(f"no driver for cluster {order.cluster}")
            metrics.dispatch_failed(order.cluster, ClusterOperation.APPLY, DispatchFailure.NO_DRIVER)
            continue
        with uow_factory() as uow:
            if uow.workloads.set_state(
                order.workload_id,
                (WorkloadState.ADMITTED,),
                WorkloadState.DISPATCHING,
                f"dispatching to {order.cluster}",
                clock(),
            ):
                uow.runs.set_state(order.run_id, ("admitted",), "dispatching", "", clock())
                emit(
                    uow,
                    prefix,
                    order.queue,
                    "dispatching",
                    order.workload_id,
                    clock(),
                    run_id=order.run_id,
                    cluster=order.cluster,
                )
            uow.commit()
        where = {"run": order.run_id, "workload": order.workload_id, "cluster": order.cluster, "epoch": order.epoch}
        called = time.perf_counter()
        try:
            created = await driver.apply(order)
        except PermanentDispatchError as exc:  # retrying the same order cannot help: fail the run
            log.warning("run %s cannot be dispatched to %s: %s", order.run_id, order.cluster, exc, extra=where)
            stats.errors.append(f"{order.run_id}: {exc}")
            _fail_undispatchable(
                uow_factory, order.run_id, order.workload_id, order.queue, order.cluster, str(exc), prefix, clock()
            )
            metrics.dispatch_failed(order.cluster, ClusterOperation.APPLY, DispatchFailure.PERMANENT)
            continue
        except Exception as exc:  # a failed call is retried next pass; the run stays pending
            log.warning("dispatch of run %s to %s failed: %s", order.run_id, order.cluster, exc, extra=where)
            stats.errors.append(f"{order.run_id}: {exc}")
            metrics.dispatch_failed(order.cluster, ClusterOperation.APPLY, DispatchFailure.TRANSIENT)
            continue
        seconds = time.perf_counter() - called
        with uow_factory() as uow:
            uow.runs.set_dispatch_state(order.run_id, "pending", "applied", clock())
            uow.commit()
        metrics.dispatched(order.cluster, seconds, created)
        log.debug("run %s applied to %s", order.run_id, order.cluster, extra=where)
        if created:
            stats.applied += 1
        else:
            stats.already_present += 1

    with uow_factory() as uow:
        teardowns = uow.runs.to_teardown(batch, drivers.keys())
    for teardown in teardowns:
        driver = drivers.get(teardown.cluster)
        if driver is None:
            continue
        try:
            await driver.delete(teardown.run_id)
        except Exception as exc:
            stats.errors.append(f"teardown {teardown.run_id}: {exc}")
            metrics.dispatch_failed(teardown.cluster, ClusterOperation.TEARDOWN, DispatchFailure.TRANSIENT)
            continue
        with uow_factory() as uow:
            uow.runs.set_dispatch_state(teardown.run_id, "teardown", "removed", clock())
            uow.commit()
        stats.torn_down += 1
        metrics.torn_down(teardown.cluster)
    return stats


def _fail_undispatchable(
    uow_factory: UnitOfWorkFactory,
    run_id: str,
    workload_id: str,
    queue: str,
    cluster: str,
    error: str,
    prefix: str,
    now: datetime,
) -> None:
    message = f"cannot dispatch to {cluster}: {error}"[:2000]
    with uow_factory() as uow:
        # Failing the run also schedules a teardown of whatever part of it reached the cluster.
        if uow.runs.set_state(
            run_id, ("admitted", "dispatching"), "failed", message, now, cause=EndCause.DISPATCH_FAILED
        ):
            uow.workloads.set_state(
                workload_id, (WorkloadState.ADMITTED, WorkloadState.DISPATCHING), WorkloadState.FAILED, message, now
            )
            emit(uow, prefix, queue, "failed", workload_id, now, run_id=run_id, cluster=cluster, message=message)
        uow.commit()
