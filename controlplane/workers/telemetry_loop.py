"""The telemetry consumer: folds many telemetry batches in one transaction, acks after the
commit, dead-letters malformed or worn-out batches, and prunes old windows."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from controlplane.service import telemetry
from controlplane.service.errors import StoreUnavailable
from controlplane.service.metrics import Metrics
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.workers.consumers import message_lag, wait_for_store
from controlplane.workers.loops import Clock, sleep_or_stop

log = logging.getLogger(__name__)


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
        lag = message_lag(min(stamps)) if stamps else None
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
