"""The relay loop: publishes the outbox in commit order while it holds the relay lease, and prunes
the outbox and inbox now and then."""

from __future__ import annotations

import asyncio
import logging

from controlplane.service.messaging_ports import DeadLetters
from controlplane.service.metrics import NO_METRICS, Metrics
from controlplane.service.ports import EventPublisher, UnitOfWorkFactory
from controlplane.service.relay import housekeeping, relay_once
from controlplane.workers.lease_term import LeaseTerm, holder_id
from controlplane.workers.loops import Clock, sleep_or_stop

log = logging.getLogger(__name__)


RELAY_LEASE = "relay"
HOUSEKEEPING_SECONDS = 600.0


async def relay_loop(
    uow_factory: UnitOfWorkFactory,
    publisher: EventPublisher,
    clock: Clock,
    stop: asyncio.Event,
    interval: float,
    lease_ttl: float = 15.0,
    metrics: Metrics = NO_METRICS,
    dead_letters: DeadLetters | None = None,
) -> None:
    """One relay publishes at a time (a lease, renewed while it works, keeps events in commit
    order even when publishing stalls on a NATS outage); others stand by."""
    term = LeaseTerm(uow_factory, RELAY_LEASE, holder_id("relay"), clock, lease_ttl, metrics)
    loop = asyncio.get_running_loop()
    next_housekeeping = loop.time()
    while not stop.is_set():
        sent = 0
        try:
            if await term.ensure() is not None:
                sent = await relay_once(uow_factory, publisher, clock, metrics=metrics, dead_letters=dead_letters)
                if loop.time() >= next_housekeeping:
                    pruned = await asyncio.to_thread(housekeeping, uow_factory, clock())
                    log.info("housekeeping: pruned %d outbox and %d inbox rows", *pruned)
                    next_housekeeping = loop.time() + HOUSEKEEPING_SECONDS
        except Exception:
            log.exception("relay pass failed; retrying")
        if not sent:
            await sleep_or_stop(stop, interval)
    await term.release()
