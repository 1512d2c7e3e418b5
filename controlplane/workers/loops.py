"""The long-running loops of gpufleet's processes, written against ports only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from controlplane.core.idle import IdleRules
from controlplane.core.snapshot import Policy
from controlplane.service import ingest, telemetry
from controlplane.service.dispatch import collect_orphans, dispatch_once
from controlplane.service.errors import LostLeadership
from controlplane.service.idle import idle_pass
from controlplane.service.ingest import InboundMessage, Outcome
from controlplane.service.ports import ClusterDriver, EventPublisher, UnitOfWorkFactory
from controlplane.service.relay import housekeeping, relay_once
from controlplane.service.reports import publish_hourly_report
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


IDLE_LEASE = "idle"


async def idle_loop(
    uow_factory: UnitOfWorkFactory,
    rules: IdleRules,
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    interval: float,
    lease_ttl: float,
) -> None:
    """Judge running runs from their telemetry windows every `interval` seconds. One process at a
    time (a lease), so each stage change is announced once."""
    holder = holder_id("idle")
    ttl = max(lease_ttl, 3 * interval)
    while not stop.is_set():
        try:
            epoch = await asyncio.to_thread(acquire_leadership, uow_factory, holder, clock(), ttl, IDLE_LEASE)
            if epoch is not None:
                stats = await asyncio.to_thread(idle_pass, uow_factory, rules, prefix, clock())
                if stats.events:
                    log.info("idle pass: %d runs, %d stage changes announced", stats.runs, stats.events)
        except Exception:
            log.exception("idle pass failed; retrying")
        await sleep_or_stop(stop, interval)


REPORT_LEASE = "reports"
REPORT_INTERVAL_SECONDS = 300.0


async def report_loop(
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    interval: float = REPORT_INTERVAL_SECONDS,
    lease_ttl: float = 15.0,
) -> None:
    """Every few minutes, write the previous hour's `utilization.report` event unless it exists.
    One process at a time (a lease); the event itself is idempotent per hour."""
    holder = holder_id("reports")
    ttl = max(lease_ttl, 3 * interval)
    while not stop.is_set():
        try:
            epoch = await asyncio.to_thread(acquire_leadership, uow_factory, holder, clock(), ttl, REPORT_LEASE)
            if epoch is not None and await asyncio.to_thread(publish_hourly_report, uow_factory, prefix, clock()):
                log.info("utilization report of the previous hour written")
        except Exception:
            log.exception("utilization report failed; retrying")
        await sleep_or_stop(stop, interval)


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


async def periodic_loop(name: str, step: Callable[[], Awaitable[object]], stop: asyncio.Event, interval: float) -> None:
    """Run `step` every `interval` seconds until `stop`; a failed step is logged and retried."""
    while not stop.is_set():
        try:
            await step()
        except Exception:
            log.exception("%s pass failed; retrying", name)
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
        if result.outcome in (Outcome.MALFORMED, Outcome.REFUSED):
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


class TelemetryDelivery(Protocol):
    @property
    def message(self) -> telemetry.BatchMessage: ...

    @property
    def published_at(self) -> float | None: ...


class TelemetrySource(Protocol):
    async def fetch(self, batch: int, timeout: float) -> Sequence[TelemetryDelivery]: ...
    # Each source acks its own deliveries (the ones its fetch returned), hence `Any` here.
    async def ack(self, deliveries: Sequence[Any]) -> None: ...
    async def retry_later(self, deliveries: Sequence[Any], delay: float) -> None: ...
    async def dead_letter(self, message: telemetry.BatchMessage, reason: str) -> None: ...
    def reset(self) -> None: ...


TELEMETRY_FETCH = 10_000
TELEMETRY_GATHER_SECONDS = 2.0
TELEMETRY_PRUNE_SECONDS = 600.0
# Told after each committed batch: the deliveries and what became of them (metrics, benchmarks).
BatchObserver = Callable[[Sequence[TelemetryDelivery], telemetry.BatchResult], None]


async def telemetry_loop(
    source: TelemetrySource,
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    batch: int = TELEMETRY_FETCH,
    window_seconds: int = telemetry.DEFAULT_WINDOW_SECONDS,
    observer: BatchObserver | None = None,
) -> None:
    """Fetch many telemetry batches, fold them in one transaction, ack after the commit."""
    failures = 0
    loop = asyncio.get_running_loop()
    next_prune = loop.time() + 30.0
    while not stop.is_set():
        try:
            deliveries = list(await source.fetch(batch, 1.0))
            # Under a backlog a fetch can end on its deadline with part of a batch; top it up while
            # messages keep coming: one transaction then covers more scrapes of each GPU, so it
            # writes fewer window rows per sample. Without a backlog this costs one short poll.
            deadline = loop.time() + TELEMETRY_GATHER_SECONDS
            while 0 < len(deliveries) < batch and loop.time() < deadline:
                try:
                    more = await source.fetch(batch - len(deliveries), 0.05)
                except Exception:
                    break  # handle what we have; the next round's fetch deals with the failure
                if not more:
                    break
                deliveries.extend(more)
            failures = 0
        except Exception as exc:
            failures += 1
            log.warning("telemetry fetch failed (%s); rebinding", exc)
            source.reset()  # a pull subscription can go deaf after a server restart
            await sleep_or_stop(stop, min(5.0, 0.2 * failures))
            continue
        if deliveries:
            await handle_telemetry(source, deliveries, uow_factory, prefix, clock, window_seconds, observer)
        if loop.time() >= next_prune:
            next_prune = loop.time() + TELEMETRY_PRUNE_SECONDS
            try:
                windows, inbox = await asyncio.to_thread(telemetry.prune, uow_factory(), clock())
                if windows or inbox:
                    log.info("telemetry: pruned %d windows and %d inbox rows", windows, inbox)
            except Exception:
                log.exception("telemetry pruning failed; next try in %.0f s", TELEMETRY_PRUNE_SECONDS)


async def handle_telemetry(
    source: TelemetrySource,
    deliveries: Sequence[TelemetryDelivery],
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Clock,
    window_seconds: int = telemetry.DEFAULT_WINDOW_SECONDS,
    observer: BatchObserver | None = None,
) -> telemetry.BatchResult | None:
    """One transaction for the whole fetch; malformed batches dead-lettered; acks only after commit."""
    messages = [d.message for d in deliveries]
    try:
        result = await asyncio.to_thread(
            telemetry.handle_batch, uow_factory(), messages, prefix, clock(), window_seconds
        )
    except Exception:
        log.exception("telemetry batch of %d messages failed; they will be redelivered", len(deliveries))
        try:
            await source.retry_later(deliveries, 2.0)
        except Exception:
            log.warning("could not nak telemetry; it returns after ack_wait")
        return None
    to_ack: list[TelemetryDelivery] = []
    for delivery, (outcome, detail) in zip(deliveries, result.outcomes, strict=True):
        if outcome is telemetry.Outcome.MALFORMED:
            try:
                await source.dead_letter(delivery.message, detail)
            except Exception:
                # Not acked: it comes back and is dead-lettered then, rather than lost now.
                log.warning("could not dead-letter %s; it will be redelivered", delivery.message.subject)
                continue
            log.warning("dead-lettered %s: %s", delivery.message.subject, detail)
        to_ack.append(delivery)
    try:
        await source.ack(to_ack)
    except Exception:
        log.warning("acking %d telemetry messages failed; redeliveries will be duplicates", len(to_ack))
    if observer is not None:
        observer(deliveries, result)
    return result
