"""The dispatcher loop: applies and tears down runs on the clusters while it holds the dispatcher
lease, and now and then collects orphaned cluster objects and requeues runs whose objects
vanished.

When the next pass starts: at once after a pass that found a full batch (more is waiting), else
after `DISPATCH_POLL` seconds: a look for admitted runs is one index range read (live runs), so the
loop can look as often as the scheduler looks at its change log, and a run admitted by a cycle waits
for that look, not for a fixed sleep. Teardowns (ended runs, whose objects only need removing) are
looked for every `interval` seconds (at once again while their batches are full) by a task of their
own, so that a teardown waiting for a row lock never holds up a dispatch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from controlplane.service.cluster_objects import reconcile_cluster_objects
from controlplane.service.dispatch import InFlight, dispatch_pending, tear_down_ended
from controlplane.service.gang_timeout import DEFAULT_VANISHED_GRACE
from controlplane.service.metrics import NO_METRICS, Metrics, Writer
from controlplane.service.ports import ClusterDriver, UnitOfWorkFactory
from controlplane.service.retries import count_store_retry
from controlplane.workers.lease_term import LeaseTerm, holder_id
from controlplane.workers.loops import Clock, sleep_or_stop

log = logging.getLogger(__name__)
DISPATCH_POLL = 0.05  # seconds between looks for admitted runs while there is nothing to dispatch


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
    leading = asyncio.Event()  # set while this process holds the lease
    in_flight = InFlight()  # what dispatch is applying: teardowns beside it leave those alone
    teardowns = asyncio.create_task(
        _teardown_loop(uow_factory, drivers, clock, stop, leading, interval, metrics, in_flight)
    )
    while not stop.is_set():
        more = False
        pause = DISPATCH_POLL
        try:
            now_leading = await term.ensure() is not None
            if now_leading != leading.is_set() and on_lead is not None:
                on_lead(now_leading)
            if now_leading:
                leading.set()
                stats = await dispatch_pending(
                    uow_factory, drivers(), prefix, clock, metrics=metrics, in_flight=in_flight
                )
                more = stats.full
                if stats.applied:
                    log.info("dispatch: %d applied", stats.applied)
                if loop.time() >= next_gc:
                    await reconcile_cluster_objects(uow_factory, drivers(), prefix, clock, vanished_grace, metrics)
                    next_gc = loop.time() + orphan_interval
            else:
                leading.clear()
                pause = interval  # standing by: only the lease is to be watched
        except Exception as exc:
            count_store_retry(metrics, Writer.DISPATCHER, exc)
            log.exception("dispatcher pass failed; retrying")
            pause = interval
        if more:
            await asyncio.sleep(0)  # let the event loop's other tasks run between full batches
        else:
            await sleep_or_stop(stop, pause)
    await teardowns
    await term.release()


async def _teardown_loop(
    uow_factory: UnitOfWorkFactory,
    drivers: Callable[[], Mapping[str, ClusterDriver]],
    clock: Clock,
    stop: asyncio.Event,
    leading: asyncio.Event,
    interval: float,
    metrics: Metrics,
    in_flight: InFlight,
) -> None:
    """Remove ended runs' objects every `interval` seconds (at once again after a full batch) while
    this process leads: beside dispatch, never in its way."""
    while not stop.is_set():
        more = False
        if leading.is_set():
            try:
                stats = await tear_down_ended(uow_factory, drivers(), clock, metrics=metrics, in_flight=in_flight)
                more = stats.full
                if stats.torn_down:
                    log.info("dispatch: %d torn down", stats.torn_down)
            except Exception:
                log.exception("teardown pass failed; retrying")
        if more:
            await asyncio.sleep(0)
        else:
            await sleep_or_stop(stop, interval)
