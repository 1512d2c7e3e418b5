"""The dispatcher: load -> call the clusters -> apply. Never holds a transaction across a call.

A pass (`dispatch_pending`) takes up to `batch` runs to dispatch, marks them all dispatching in one
transaction, then calls the clusters in parallel (each cluster's runs in order, a few calls in
flight per cluster) and records each cluster's applied runs in one transaction as soon as that
cluster has answered. So a burst of admissions costs a handful of transactions instead of three per
run, and a slow cluster delays no other cluster's runs. Teardowns go the same way, in passes of
their own (`tear_down_ended`). The database work runs in a worker thread: the event loop stays free
for the calls (and, in the dispatcher process, for the simulated clusters' reports).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from controlplane.core.decision import EndCause
from controlplane.domain.model import WorkloadState
from controlplane.service.metrics import NO_METRICS, ClusterOperation, DispatchFailure, Metrics
from controlplane.service.ports import ClusterDriver, PermanentDispatchError, RunOrder, Teardown, UnitOfWorkFactory
from controlplane.service.workloads import emit

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_BATCH = 500  # runs (and teardowns) per pass
PER_CLUSTER_CALLS = 8  # calls in flight to one cluster at a time


@dataclass
class DispatchStats:
    applied: int = 0
    already_present: int = 0
    torn_down: int = 0
    orphans_deleted: int = 0
    errors: list[str] = field(default_factory=list)
    full: bool = False  # a batch was full: more is waiting, the next pass should follow at once


@dataclass
class InFlight:
    """The runs a dispatch pass has loaded and not finished applying, shared with the teardowns
    that run beside it in the same process. A run that ended between a pass's load and its apply
    (an earlier apply whose record failed, say, its pods already done) must not be torn down in
    between: the apply would then create its objects a second time. So teardowns leave the runs in
    flight for their next pass, and the two loads take turns (`loading`), so that a run a pass loaded
    as live is in `runs` before any teardown load that can see it ended."""

    runs: set[str] = field(default_factory=set)
    loading: asyncio.Lock = field(default_factory=asyncio.Lock)


def _load_orders(uow_factory: UnitOfWorkFactory, batch: int, clusters: Collection[str]) -> list[RunOrder]:
    # Only runs of clusters that have a driver: runs waiting for an unreachable or driverless
    # cluster must not fill every batch and hold up dispatch to the others (the dispatch
    # timeout requeues them).
    with uow_factory() as uow:
        return uow.runs.to_dispatch(batch, clusters)


def _load_teardowns(uow_factory: UnitOfWorkFactory, batch: int, clusters: Collection[str]) -> list[Teardown]:
    with uow_factory() as uow:
        return uow.runs.to_teardown(batch, clusters)


def _mark_dispatching(
    uow_factory: UnitOfWorkFactory, orders: Sequence[RunOrder], prefix: str, clock: Callable[[], datetime]
) -> None:
    """One transaction: each admitted workload of `orders` and its run become dispatching. Rows are
    taken in one order (workloads by id, each before its run), so no two such transactions wait on
    each other in a cycle."""
    with uow_factory() as uow:
        now = clock()
        uow.workloads.lock([order.workload_id for order in orders])  # all at once, in the one lock order
        for order in sorted(orders, key=lambda o: o.workload_id):
            if uow.workloads.set_state(
                order.workload_id,
                (WorkloadState.ADMITTED,),
                WorkloadState.DISPATCHING,
                f"dispatching to {order.cluster}",
                now,
            ):
                uow.runs.set_state(order.run_id, ("admitted",), "dispatching", "", now)
                emit(
                    uow,
                    prefix,
                    order.queue,
                    "dispatching",
                    order.workload_id,
                    now,
                    run_id=order.run_id,
                    cluster=order.cluster,
                )
        uow.commit()


def _mark(
    uow_factory: UnitOfWorkFactory, run_ids: Sequence[str], from_state: str, to_state: str, now: datetime
) -> None:
    with uow_factory() as uow:
        # The runs' workloads first, all at once (the one lock order: a run is written under its
        # workload's lock; locked run by run, they would be taken in the order of run ids).
        uow.workloads.lock(of_runs=run_ids)
        for run_id in sorted(run_ids):
            uow.runs.set_dispatch_state(run_id, from_state, to_state, now)
        uow.commit()


async def dispatch_once(
    uow_factory: UnitOfWorkFactory,
    drivers: Mapping[str, ClusterDriver],
    prefix: str,
    clock: Callable[[], datetime],
    batch: int = DEFAULT_BATCH,
    metrics: Metrics = NO_METRICS,
) -> DispatchStats:
    """One pass: dispatch what is pending, then remove what has ended."""
    stats = await dispatch_pending(uow_factory, drivers, prefix, clock, batch, metrics)
    torn = await tear_down_ended(uow_factory, drivers, clock, batch, metrics)
    stats.torn_down, stats.full = torn.torn_down, stats.full or torn.full
    stats.errors.extend(torn.errors)
    return stats


async def dispatch_pending(
    uow_factory: UnitOfWorkFactory,
    drivers: Mapping[str, ClusterDriver],
    prefix: str,
    clock: Callable[[], datetime],
    batch: int = DEFAULT_BATCH,
    metrics: Metrics = NO_METRICS,
    in_flight: InFlight | None = None,
) -> DispatchStats:
    """Apply up to `batch` admitted runs on their clusters."""
    stats = DispatchStats()
    in_flight = in_flight or InFlight()
    async with in_flight.loading:
        orders = await asyncio.to_thread(_load_orders, uow_factory, batch, drivers.keys())
        ids = {order.run_id for order in orders}
        in_flight.runs.update(ids)
    try:
        stats.full = len(orders) >= batch
        if orders:
            await asyncio.to_thread(_mark_dispatching, uow_factory, orders, prefix, clock)
            await asyncio.gather(
                *(
                    _apply_on(cluster, drivers.get(cluster), group, uow_factory, prefix, clock, metrics, stats)
                    for cluster, group in _by_cluster(orders, lambda o: o.cluster).items()
                )
            )
    finally:
        in_flight.runs.difference_update(ids)
    return stats


async def tear_down_ended(
    uow_factory: UnitOfWorkFactory,
    drivers: Mapping[str, ClusterDriver],
    clock: Callable[[], datetime],
    batch: int = DEFAULT_BATCH,
    metrics: Metrics = NO_METRICS,
    in_flight: InFlight | None = None,
) -> DispatchStats:
    """Remove the objects of up to `batch` ended runs from their clusters. Apart from dispatch, so
    that recording a teardown (which may wait for the row of a run ingest has just ended, until
    ingest's batch commits) never delays a new run's dispatch."""
    stats = DispatchStats()
    in_flight = in_flight or InFlight()
    async with in_flight.loading:
        loaded = await asyncio.to_thread(_load_teardowns, uow_factory, batch, drivers.keys())
        teardowns = [t for t in loaded if t.run_id not in in_flight.runs]  # the rest: next pass
    stats.full = len(teardowns) >= batch
    await asyncio.gather(
        *(
            _tear_down_on(cluster, drivers.get(cluster), group, uow_factory, clock, metrics, stats)
            for cluster, group in _by_cluster(teardowns, lambda t: t.cluster).items()
        )
    )
    return stats


def _by_cluster(items: Sequence[T], cluster_of: Callable[[T], str]) -> dict[str, list[T]]:
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(cluster_of(item), []).append(item)
    return groups


async def _apply_on(
    cluster: str,
    driver: ClusterDriver | None,
    orders: Sequence[RunOrder],
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Callable[[], datetime],
    metrics: Metrics,
    stats: DispatchStats,
) -> None:
    """Apply `orders` (all for `cluster`), then record the applied ones in one transaction."""
    if driver is None:
        stats.errors.extend(f"no driver for cluster {cluster}" for _ in orders)
        for _ in orders:
            metrics.dispatch_failed(cluster, ClusterOperation.APPLY, DispatchFailure.NO_DRIVER)
        return
    gate = asyncio.Semaphore(PER_CLUSTER_CALLS)
    applied: list[str] = []

    async def apply(order: RunOrder) -> None:
        where = {"run": order.run_id, "workload": order.workload_id, "cluster": cluster, "epoch": order.epoch}
        async with gate:
            called = time.perf_counter()
            try:
                created = await driver.apply(order)
            except PermanentDispatchError as exc:  # retrying the same order cannot help: fail the run
                log.warning("run %s cannot be dispatched to %s: %s", order.run_id, cluster, exc, extra=where)
                stats.errors.append(f"{order.run_id}: {exc}")
                await asyncio.to_thread(
                    _fail_undispatchable,
                    uow_factory,
                    order.run_id,
                    order.workload_id,
                    order.queue,
                    cluster,
                    str(exc),
                    prefix,
                    clock(),
                )
                metrics.dispatch_failed(cluster, ClusterOperation.APPLY, DispatchFailure.PERMANENT)
                return
            except Exception as exc:  # a failed call is retried next pass; the run stays pending
                log.warning("dispatch of run %s to %s failed: %s", order.run_id, cluster, exc, extra=where)
                stats.errors.append(f"{order.run_id}: {exc}")
                metrics.dispatch_failed(cluster, ClusterOperation.APPLY, DispatchFailure.TRANSIENT)
                return
        metrics.dispatched(cluster, time.perf_counter() - called, created)
        log.debug("run %s applied to %s", order.run_id, cluster, extra=where)
        applied.append(order.run_id)
        if created:
            stats.applied += 1
        else:
            stats.already_present += 1

    await asyncio.gather(*(apply(order) for order in orders))
    if applied:
        await asyncio.to_thread(_mark, uow_factory, applied, "pending", "applied", clock())


async def _tear_down_on(
    cluster: str,
    driver: ClusterDriver | None,
    teardowns: Sequence[Teardown],
    uow_factory: UnitOfWorkFactory,
    clock: Callable[[], datetime],
    metrics: Metrics,
    stats: DispatchStats,
) -> None:
    if driver is None:
        return
    gate = asyncio.Semaphore(PER_CLUSTER_CALLS)
    removed: list[str] = []

    async def delete(teardown: Teardown) -> None:
        async with gate:
            try:
                await driver.delete(teardown.run_id)
            except Exception as exc:
                stats.errors.append(f"teardown {teardown.run_id}: {exc}")
                metrics.dispatch_failed(cluster, ClusterOperation.TEARDOWN, DispatchFailure.TRANSIENT)
                return
        removed.append(teardown.run_id)
        stats.torn_down += 1
        metrics.torn_down(cluster)

    await asyncio.gather(*(delete(teardown) for teardown in teardowns))
    if removed:
        await asyncio.to_thread(_mark, uow_factory, removed, "teardown", "removed", clock())


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
