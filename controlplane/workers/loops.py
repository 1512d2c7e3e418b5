"""The long-running loops of gpufleet's processes, written against ports only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from controlplane.core.idle import IdleRules
from controlplane.core.incremental import IncrementalScheduler
from controlplane.core.snapshot import Policy
from controlplane.service import ingest, telemetry
from controlplane.service.cluster_objects import reconcile_cluster_objects
from controlplane.service.dispatch import dispatch_once
from controlplane.service.errors import LostLeadership, StoreUnavailable
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.gang_timeout import DEFAULT_VANISHED_GRACE
from controlplane.service.idle import idle_pass
from controlplane.service.ingest import InboundMessage, Outcome
from controlplane.service.metrics import NO_METRICS, Metrics
from controlplane.service.ports import ClusterDriver, EventPublisher, UnitOfWorkFactory
from controlplane.service.relay import housekeeping, relay_once
from controlplane.service.reports import publish_hourly_report
from controlplane.service.scheduling import (
    LEASE_NAME,
    acquire_leadership,
    release_leadership,
    renew_leadership,
    run_cycle,
)
from controlplane.service.snapshot_cache import DEFAULT_REBUILD_INTERVAL, SnapshotCache

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def holder_id(component: str) -> str:
    return f"{component}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseTerm:
    """This process's term under a named lease. Once acquired, a background task renews it every
    third of its TTL for as long as the term lasts, so a cycle (or dispatch pass) longer than the
    TTL keeps its lease and a standby never takes a lease that is being worked. The term ends when a
    renewal finds another holder's epoch (deposed) or when `lose`/`release` is called. Renewal only
    narrows overlap: every scheduling write still checks the epoch in its own transaction."""

    def __init__(
        self,
        uow_factory: UnitOfWorkFactory,
        lease: str,
        holder: str,
        clock: Clock,
        ttl: float,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.uow_factory, self.lease, self.holder, self.clock, self.ttl = uow_factory, lease, holder, clock, ttl
        self.metrics = metrics
        self.epoch: int | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._standing_by = False

    async def ensure(self) -> int | None:
        """The current epoch, acquiring the lease if it is free; None while another holder has it."""
        if self.epoch is not None and self._renewer is not None and self._renewer.done():
            self.epoch = None  # the renewer found us deposed
        if self.epoch is None:
            self.epoch = await asyncio.to_thread(
                acquire_leadership, self.uow_factory, self.holder, self.clock(), self.ttl, self.lease
            )
            if self.epoch is not None:
                log.info("%s leads %s with epoch %d", self.holder, self.lease, self.epoch, extra={"epoch": self.epoch})
                self.metrics.lease(self.lease, self.epoch)
                self._renewer = asyncio.create_task(self._renew(self.epoch), name=f"{self.lease}-lease")
                self._standing_by = False
            elif not self._standing_by:
                log.info("%s stands by: another holder has the %s lease", self.holder, self.lease)
                self._standing_by = True
        return self.epoch

    async def _renew(self, epoch: int) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                renewed = await asyncio.to_thread(
                    renew_leadership, self.uow_factory, self.holder, epoch, self.clock(), self.ttl, self.lease
                )
            except Exception as exc:  # database unreachable: keep trying; the epoch check fences writes
                log.warning("%s could not renew its %s lease: %s", self.holder, self.lease, exc)
                continue
            if not renewed:
                log.warning("%s lost its %s lease (epoch %d)", self.holder, self.lease, epoch, extra={"epoch": epoch})
                self.metrics.lease(self.lease, None)
                return
            self.metrics.lease(self.lease, epoch)

    def lose(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        if self.epoch is not None:
            self.metrics.lease(self.lease, None)
        self._renewer, self.epoch = None, None

    async def release(self) -> None:
        epoch = self.epoch
        self.lose()
        if epoch is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(release_leadership, self.uow_factory, self.holder, epoch, self.lease)


async def scheduler_loop(
    uow_factory: UnitOfWorkFactory,
    policy: Policy,
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    interval: float,
    lease_ttl: float,
    check_invariants: bool = False,
    metrics: Metrics = NO_METRICS,
    snapshot_rebuild_interval: float = DEFAULT_REBUILD_INTERVAL,
) -> None:
    term = LeaseTerm(uow_factory, LEASE_NAME, holder_id("scheduler"), clock, lease_ttl, metrics)
    # The snapshot and the core's fleet state kept across this leadership term's cycles; a new
    # term or any error starts afresh.
    cache: SnapshotCache | None = None
    scheduler = IncrementalScheduler()
    while not stop.is_set():
        try:
            epoch = await term.ensure()
            if epoch is None:
                cache = None
            else:
                if cache is None or cache.epoch not in (None, epoch):
                    cache = SnapshotCache(snapshot_rebuild_interval)
                    scheduler.reset()
                result = await asyncio.to_thread(
                    run_cycle,
                    uow_factory,
                    term.holder,
                    epoch,
                    policy,
                    prefix,
                    clock(),
                    lease_ttl,
                    check_invariants,
                    metrics,
                    cache,
                    scheduler,
                )
                if result.admitted:
                    log.info("cycle: admitted %d, %d pending", result.admitted, result.pending, extra={"epoch": epoch})
        except LostLeadership as exc:
            log.warning("%s", exc, extra={"epoch": term.epoch})
            term.lose()
            cache = None
        except Exception:
            log.exception("scheduler cycle failed; retrying")
            cache = None
        await sleep_or_stop(stop, interval)
    await term.release()


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
        except Exception:
            log.exception("dispatcher pass failed; retrying")
        await sleep_or_stop(stop, interval)
    await term.release()


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
    metrics: Metrics = NO_METRICS,
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
                sent = await relay_once(uow_factory, publisher, clock, metrics=metrics)
                if loop.time() >= next_housekeeping:
                    pruned = await asyncio.to_thread(housekeeping, uow_factory, clock())
                    log.info("housekeeping: pruned %d outbox and %d inbox rows", *pruned)
                    next_housekeeping = loop.time() + HOUSEKEEPING_SECONDS
        except Exception:
            log.exception("relay pass failed; retrying")
        if not sent:
            await sleep_or_stop(stop, interval)
    await term.release()


class InboundDelivery(Protocol):
    message: InboundMessage

    @property
    def attempt(self) -> int:
        """How many times the message was delivered, this delivery included (1 the first time)."""
        ...

    async def ack(self) -> None: ...
    async def retry_later(self, delay: float) -> None: ...
    async def hold(self) -> None:
        """Tell the server the message is still being worked on, so it is not redelivered yet."""
        ...


class InboundSource(Protocol):
    async def fetch(self, batch: int = 64, timeout: float = 1.0) -> Sequence[InboundDelivery]: ...
    async def dead_letter(self, message: InboundMessage, reason: str) -> None: ...
    def reset(self) -> None: ...


# While the database is down, a consumer keeps the messages it fetched (telling the server they
# are in progress, which does not spend a delivery) and retries them with this backoff, instead
# of letting them be redelivered: an outage must not use up the bounded redelivery budget.
STORE_RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)


async def wait_for_store(stop: asyncio.Event, attempt: int, hold: Callable[[], Awaitable[None]], what: str) -> None:
    if attempt == 0:
        log.warning("database unavailable; holding %s and retrying", what)
    try:
        await hold()
    except Exception as exc:
        log.warning("could not hold %s (%s); they will be redelivered", what, exc)
    await sleep_or_stop(stop, STORE_RETRY_SECONDS[min(attempt, len(STORE_RETRY_SECONDS) - 1)])


async def ingest_loop(
    source: InboundSource,
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    metrics: Metrics = NO_METRICS,
) -> None:
    failures = 0
    fit = FleetFit()  # this consumer's memo of the submit-time fleet check
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
        waiting = list(deliveries)
        outage = 0
        # A batch of first deliveries goes in one transaction; redeliveries, and a batch that failed, one by one.
        batched = len(waiting) > 1 and all(d.attempt == 1 for d in waiting)
        while waiting and not stop.is_set():
            try:
                if batched:
                    batched = False
                    if await handle_deliveries(source, waiting, uow_factory, prefix, clock, fit, metrics):
                        waiting = []
                        continue
                await handle_delivery(source, waiting[0], uow_factory, prefix, clock, fit, metrics)
            except StoreUnavailable:
                held = tuple(waiting)

                async def hold_all(held: tuple[InboundDelivery, ...] = held) -> None:
                    for delivery in held:
                        await delivery.hold()

                await wait_for_store(stop, outage, hold_all, f"{len(held)} inbound messages")
                outage += 1
                continue
            outage = 0
            waiting.pop(0)
        for delivery in waiting:  # stopping: hand the rest back at once rather than after ack_wait
            with contextlib.suppress(Exception):
                await delivery.retry_later(0.0)


async def handle_deliveries(
    source: InboundSource,
    deliveries: Sequence[InboundDelivery],
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Clock,
    fit: FleetFit | None = None,
    metrics: Metrics = NO_METRICS,
) -> bool:
    """Apply a batch of first deliveries in one transaction (`ingest.handle_batch`), then settle (ack, or
    dead-letter and ack) each message after the commit. False when the batch failed and nothing was
    settled: the caller applies its messages one by one (`handle_delivery`), so a poison message costs
    its batch one retry, never a stop. Raises `StoreUnavailable` before anything was settled."""
    try:
        messages = [d.message for d in deliveries]
        results = await asyncio.to_thread(ingest.handle_batch, uow_factory(), messages, prefix, clock(), fit, metrics)
    except StoreUnavailable:
        raise
    except Exception:
        log.exception("a batch of %d inbound messages failed; applying them one by one", len(deliveries))
        return False
    for delivery, result in zip(deliveries, results, strict=True):
        try:
            if result.outcome.dead_letter:
                await source.dead_letter(delivery.message, result.detail)
                log.warning("dead-lettered %s: %s", delivery.message.subject, result.detail)
            await delivery.ack()
            metrics.ingested(ingest.CONSUMER, result.outcome.value, _lag(getattr(delivery, "published_at", None)))
        except Exception:  # NATS trouble: redelivered, then found in the inbox or refused again
            log.exception("could not settle %s; it will be redelivered", delivery.message.subject)
            with contextlib.suppress(Exception):
                await delivery.retry_later(2.0)
    return True


async def handle_delivery(
    source: InboundSource,
    delivery: InboundDelivery,
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Clock,
    fit: FleetFit | None = None,
    metrics: Metrics = NO_METRICS,
) -> Outcome | None:
    outcome = await _handle_delivery(source, delivery, uow_factory, prefix, clock, fit, metrics)
    if outcome is not None:
        metrics.ingested(ingest.CONSUMER, outcome.value, _lag(getattr(delivery, "published_at", None)))
    return outcome


def _lag(published_at: float | None) -> float | None:
    """Seconds since the stream stored a message (None when the source does not say)."""
    return None if published_at is None else max(0.0, time.time() - published_at)


async def _handle_delivery(
    source: InboundSource,
    delivery: InboundDelivery,
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Clock,
    fit: FleetFit | None,
    metrics: Metrics,
) -> Outcome | None:
    """Apply one message; ack only after the commit; never let one message stop the consumer.

    A message that failed on `ingest.MAX_DELIVERIES` deliveries (an exception, or the consumer died
    on it) is dead-lettered instead of being tried again. Raises `StoreUnavailable` when the
    database is down: the caller holds the message and retries, and no delivery is spent.
    Returns None when the message was handed back for redelivery.
    """
    message = delivery.message
    try:
        if delivery.attempt > ingest.MAX_DELIVERIES:
            reason = f"delivered {delivery.attempt} times without being applied (the consumer failed or died on it)"
            await source.dead_letter(message, reason)
            log.warning("dead-lettered %s: %s", message.subject, reason, extra={"consumer": ingest.CONSUMER})
            await delivery.ack()
            return Outcome.MALFORMED
        try:
            result = await asyncio.to_thread(ingest.handle, uow_factory(), message, prefix, clock(), fit, metrics)
        except StoreUnavailable:
            raise
        except Exception as exc:
            if delivery.attempt < ingest.MAX_DELIVERIES:
                raise
            reason = f"failed on {delivery.attempt} deliveries; last error {type(exc).__name__}: {exc}"
            await source.dead_letter(message, reason[:1000])
            log.warning("dead-lettered %s: %s", message.subject, reason[:1000], extra={"consumer": ingest.CONSUMER})
            await delivery.ack()
            return Outcome.MALFORMED
        if result.outcome.dead_letter:
            await source.dead_letter(message, result.detail)
            log.warning("dead-lettered %s: %s", message.subject, result.detail, extra={"consumer": ingest.CONSUMER})
        await delivery.ack()
        return result.outcome
    except StoreUnavailable:
        raise
    except Exception:
        log.exception("ingest of %s failed (delivery %d); it will be redelivered", message.subject, delivery.attempt)
        try:
            await delivery.retry_later(2.0)
        except Exception:
            log.warning("could not nak %s; it returns after ack_wait", message.subject)
        return None


class TelemetryDelivery(Protocol):
    @property
    def message(self) -> telemetry.BatchMessage: ...

    @property
    def published_at(self) -> float | None: ...

    @property
    def attempt(self) -> int: ...


class TelemetrySource(Protocol):
    async def fetch(self, batch: int, timeout: float) -> Sequence[TelemetryDelivery]: ...
    # Each source acks its own deliveries (the ones its fetch returned), hence `Any` here.
    async def ack(self, deliveries: Sequence[Any]) -> None: ...
    async def retry_later(self, deliveries: Sequence[Any], delay: float) -> None: ...
    async def hold(self, deliveries: Sequence[Any]) -> None: ...
    async def dead_letter(self, message: telemetry.BatchMessage, reason: str) -> None: ...
    def reset(self) -> None: ...


TELEMETRY_FETCH = 10_000
TELEMETRY_GATHER_SECONDS = 2.0
TELEMETRY_PRUNE_SECONDS = 600.0
# Told after each committed batch: the deliveries and what became of them (metrics, benchmarks).
BatchObserver = Callable[[Sequence[TelemetryDelivery], telemetry.BatchResult], None]


def metered_telemetry(metrics: Metrics, then: BatchObserver | None = None) -> BatchObserver:
    """A `BatchObserver` that reports each committed batch (outcomes, samples, windows, the lag of
    its oldest message) to `metrics`, then tells `then`."""

    def observe(deliveries: Sequence[TelemetryDelivery], result: telemetry.BatchResult) -> None:
        counts: dict[str, int] = {}
        for outcome, _ in result.outcomes:
            counts[outcome.value] = counts.get(outcome.value, 0) + 1
        stamps = [d.published_at for d in deliveries if d.published_at is not None]
        lag = _lag(min(stamps)) if stamps else None
        for outcome_name, count in sorted(counts.items()):
            metrics.ingested(telemetry.CONSUMER, outcome_name, lag, count)
            lag = None  # once per batch
        metrics.telemetry_batch(len(deliveries), result.samples, result.windows)
        if then is not None:
            then(deliveries, result)

    return observe


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
        outage = 0
        while deliveries and not stop.is_set():
            try:
                await handle_telemetry(source, deliveries, uow_factory, prefix, clock, window_seconds, observer)
            except StoreUnavailable:
                held = tuple(deliveries)

                async def hold_all(held: tuple[TelemetryDelivery, ...] = held) -> None:
                    await source.hold(held)

                await wait_for_store(stop, outage, hold_all, f"{len(held)} telemetry batches")
                outage += 1
                continue
            break
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
    """One transaction for the whole fetch; malformed batches dead-lettered; acks only after commit.

    A failing transaction is retried later as a whole the first time; when it holds messages
    delivered before, each is tried alone so one poison message cannot hold back the others, and
    a message that failed on `telemetry.MAX_DELIVERIES` deliveries is dead-lettered. Raises
    `StoreUnavailable` when the database is down (the caller holds the messages and retries).
    Returns None when (some) messages were handed back or handled one by one.
    """
    worn = [d for d in deliveries if d.attempt > telemetry.MAX_DELIVERIES]
    if worn:
        for delivery in worn:
            await _dead_letter_telemetry(source, delivery, f"delivered {delivery.attempt} times without being applied")
        deliveries = [d for d in deliveries if d.attempt <= telemetry.MAX_DELIVERIES]
        if not deliveries:
            return None
    messages = [d.message for d in deliveries]
    try:
        result = await asyncio.to_thread(
            telemetry.handle_batch, uow_factory(), messages, prefix, clock(), window_seconds
        )
    except StoreUnavailable:
        raise
    except Exception as exc:
        if len(deliveries) > 1 and any(d.attempt > 1 for d in deliveries):
            log.warning("telemetry batch of %d messages failed again; trying them one by one", len(deliveries))
            for delivery in deliveries:
                await handle_telemetry(source, [delivery], uow_factory, prefix, clock, window_seconds, observer)
            return None
        if len(deliveries) == 1 and deliveries[0].attempt >= telemetry.MAX_DELIVERIES:
            reason = f"failed on {deliveries[0].attempt} deliveries; last error {type(exc).__name__}: {exc}"
            await _dead_letter_telemetry(source, deliveries[0], reason[:1000])
            return None
        log.exception("telemetry batch of %d messages failed; they will be redelivered", len(deliveries))
        try:
            await source.retry_later(deliveries, 2.0)
        except Exception:
            log.warning("could not nak telemetry; it returns after ack_wait")
        return None
    to_ack: list[TelemetryDelivery] = []
    for delivery, (outcome, detail) in zip(deliveries, result.outcomes, strict=True):
        if outcome.dead_letter:
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


async def _dead_letter_telemetry(source: TelemetrySource, delivery: TelemetryDelivery, reason: str) -> None:
    try:
        await source.dead_letter(delivery.message, reason)
        await source.ack([delivery])
    except Exception:
        log.warning("could not dead-letter %s; it will be redelivered", delivery.message.subject)
        return
    log.warning("dead-lettered %s: %s", delivery.message.subject, reason)
