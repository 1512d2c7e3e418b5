"""The long-running loops of gpufleet's processes, written against ports only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from controlplane.core.snapshot import Policy
from controlplane.service import ingest
from controlplane.service.dispatch import collect_orphans, dispatch_once
from controlplane.service.errors import LostLeadership
from controlplane.service.ingest import InboundMessage, Outcome
from controlplane.service.ports import ClusterDriver, EventPublisher, UnitOfWorkFactory
from controlplane.service.relay import housekeeping, relay_once
from controlplane.service.scheduling import acquire_leadership, release_leadership, run_cycle

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def holder_id(component: str) -> str:
    return f"{component}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def scheduler_loop(
    uow_factory: UnitOfWorkFactory,
    policy: Policy,
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    interval: float,
    lease_ttl: float,
    check_invariants: bool = False,
) -> None:
    holder = holder_id("scheduler")
    epoch: int | None = None
    while not stop.is_set():
        try:
            if epoch is None:
                epoch = await asyncio.to_thread(acquire_leadership, uow_factory, holder, clock(), lease_ttl)
                if epoch is not None:
                    log.info("scheduler %s leads with epoch %d", holder, epoch)
            if epoch is not None:
                result = await asyncio.to_thread(
                    run_cycle, uow_factory, holder, epoch, policy, prefix, clock(), lease_ttl, check_invariants
                )
                if result.admitted:
                    log.info("cycle: admitted %d, %d pending", result.admitted, result.pending)
        except LostLeadership as exc:
            log.warning("%s", exc)
            epoch = None
        except Exception:
            log.exception("scheduler cycle failed; retrying")
        await sleep_or_stop(stop, interval)
    if epoch is not None:
        await asyncio.to_thread(release_leadership, uow_factory, holder, epoch)


async def dispatcher_loop(
    uow_factory: UnitOfWorkFactory,
    drivers: Callable[[], Mapping[str, ClusterDriver]],
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    interval: float,
    orphan_interval: float,
) -> None:
    loop = asyncio.get_running_loop()
    next_gc = loop.time() + min(orphan_interval, 5.0)
    while not stop.is_set():
        try:
            stats = await dispatch_once(uow_factory, drivers(), prefix, clock)
            if stats.applied or stats.torn_down:
                log.info("dispatch: %d applied, %d torn down", stats.applied, stats.torn_down)
            if loop.time() >= next_gc:
                await collect_orphans(uow_factory, drivers())
                next_gc = loop.time() + orphan_interval
        except Exception:
            log.exception("dispatcher pass failed; retrying")
        await sleep_or_stop(stop, interval)


RELAY_LEASE = "relay"
HOUSEKEEPING_SECONDS = 600.0


async def relay_loop(
    uow_factory: UnitOfWorkFactory,
    publisher: EventPublisher,
    clock: Clock,
    stop: asyncio.Event,
    interval: float,
    lease_ttl: float = 15.0,
) -> None:
    """One relay publishes at a time (a lease keeps events in commit order); others stand by."""
    holder = holder_id("relay")
    loop = asyncio.get_running_loop()
    next_housekeeping = loop.time()
    renew_at = loop.time()
    epoch: int | None = None
    while not stop.is_set():
        sent = 0
        try:
            if epoch is None or loop.time() >= renew_at:
                epoch = await asyncio.to_thread(
                    acquire_leadership, uow_factory, holder, clock(), lease_ttl, RELAY_LEASE
                )
                renew_at = loop.time() + lease_ttl / 3
            if epoch is not None:
                sent = await relay_once(uow_factory, publisher, clock)
                if loop.time() >= next_housekeeping:
                    pruned = await asyncio.to_thread(housekeeping, uow_factory, clock())
                    log.info("housekeeping: pruned %d outbox and %d inbox rows", *pruned)
                    next_housekeeping = loop.time() + HOUSEKEEPING_SECONDS
        except Exception:
            log.exception("relay pass failed; retrying")
        if not sent:
            await sleep_or_stop(stop, interval)
    if epoch is not None:
        await asyncio.to_thread(release_leadership, uow_factory, holder, epoch, RELAY_LEASE)


class InboundDelivery(Protocol):
    message: InboundMessage

    async def ack(self) -> None: ...
    async def retry_later(self, delay: float) -> None: ...


class InboundSource(Protocol):
    async def fetch(self, batch: int = 64, timeout: float = 1.0) -> Sequence[InboundDelivery]: ...
    async def dead_letter(self, message: InboundMessage, reason: str) -> None: ...
    def reset(self) -> None: ...


async def ingest_loop(
    source: InboundSource, uow_factory: UnitOfWorkFactory, prefix: str, clock: Clock, stop: asyncio.Event
) -> None:
    failures = 0
    while not stop.is_set():
        try:
            deliveries = await source.fetch()
            failures = 0
        except Exception as exc:
            failures += 1
            log.warning("ingest fetch failed (%s); rebinding", exc)
            source.reset()  # a pull subscription can go deaf after a server restart
            await sleep_or_stop(stop, min(5.0, 0.2 * failures))
            continue
        for delivery in deliveries:
            await handle_delivery(source, delivery, uow_factory, prefix, clock)


async def handle_delivery(
    source: InboundSource, delivery: InboundDelivery, uow_factory: UnitOfWorkFactory, prefix: str, clock: Clock
) -> Outcome | None:
    """Apply one message; ack only after the commit; never let one message stop the consumer."""
    try:
        result = await asyncio.to_thread(ingest.handle, uow_factory(), delivery.message, prefix, clock())
        if result.outcome is Outcome.MALFORMED:
            await source.dead_letter(delivery.message, result.detail)
            log.warning("dead-lettered %s: %s", delivery.message.subject, result.detail)
        await delivery.ack()
        return result.outcome
    except Exception:
        log.exception("ingest of %s failed; it will be redelivered", delivery.message.subject)
        try:
            await delivery.retry_later(2.0)
        except Exception:
            log.warning("could not nak %s; it returns after ack_wait", delivery.message.subject)
        return None
