"""The dispatcher loop: applies and tears down runs on the clusters while it holds the dispatcher
lease, and now and then collects orphaned cluster objects and requeues runs whose objects
vanished."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from controlplane.service.cluster_objects import reconcile_cluster_objects
from controlplane.service.dispatch import dispatch_once
from controlplane.service.gang_timeout import DEFAULT_VANISHED_GRACE
from controlplane.service.metrics import NO_METRICS, Metrics, Writer
from controlplane.service.ports import ClusterDriver, UnitOfWorkFactory
from controlplane.service.retries import count_store_retry
from controlplane.workers.lease_term import LeaseTerm, holder_id
from controlplane.workers.loops import Clock, sleep_or_stop

log = logging.getLogger(__name__)


DISPATCHER_LEASE = "dispatcher"


async def dispatcher_loop(
    uow_factory: UnitOfWorkFactory,
    drivers: Callable[[], Mapping[str, ClusterDriver]],
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    interval: float,
    orphan_interval: float,
    lease_ttl: float = 15.0,
    on_lead: Callable[[bool], None] | None = None,
    vanished_grace: float = DEFAULT_VANISHED_GRACE,
    metrics: Metrics = NO_METRICS,
) -> None:
    """One dispatcher works at a time (a lease, renewed while it works); others stand by and take
    over when its lease runs out. `on_lead(True/False)` is told when this process starts or stops
    dispatching (the simulated clusters live with the dispatcher that holds the lease). A deposed
    dispatcher that is mid-pass can only repeat applies, which are idempotent (objects are named
    after the run: AlreadyExists is success)."""
    term = LeaseTerm(uow_factory, DISPATCHER_LEASE, holder_id("dispatcher"), clock, lease_ttl, metrics)
    loop = asyncio.get_running_loop()
    next_gc = loop.time() + min(orphan_interval, 5.0)
    leading = False
    while not stop.is_set():
        try:
            now_leading = await term.ensure() is not None
            if now_leading != leading and on_lead is not None:
                on_lead(now_leading)
            leading = now_leading
            if leading:
                stats = await dispatch_once(uow_factory, drivers(), prefix, clock, metrics=metrics)
                if stats.applied or stats.torn_down:
                    log.info("dispatch: %d applied, %d torn down", stats.applied, stats.torn_down)
                if loop.time() >= next_gc:
                    await reconcile_cluster_objects(uow_factory, drivers(), prefix, clock, vanished_grace, metrics)
                    next_gc = loop.time() + orphan_interval
        except Exception as exc:
            count_store_retry(metrics, Writer.DISPATCHER, exc)
            log.exception("dispatcher pass failed; retrying")
        await sleep_or_stop(stop, interval)
    await term.release()
