"""The ingest consumers: apply inbound messages (submits, cancels, pod reports, inventory) in
batches or one by one, ack after the commit, dead-letter what cannot be applied.

Each kind of message has its own durable consumer (`adapters.nats.topology.INGEST_CONSUMERS`) and
its own loops, so a submit backlog never stands between a pod report and its commit. Submits are
pulled by several loops at once on PostgreSQL (`submit_pullers`): the server hands each loop
different messages, one loop's transaction overlaps another's fetch, acks and Python work, and the
inbox keeps a message that two loops both got (a redelivery) applied once. Pod reports, cancels and
inventory keep one loop per process: a run's reports are applied in the order they were sent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

from controlplane.service import ingest
from controlplane.service.errors import StoreUnavailable
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.ingest import InboundMessage, Outcome
from controlplane.service.metrics import NO_METRICS, Metrics, Writer, retry_cause
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.service.retries import retrying
from controlplane.workers.consumers import message_lag, wait_for_store
from controlplane.workers.loops import Clock, sleep_or_stop

log = logging.getLogger(__name__)
# Messages fetched (and, when all are first deliveries, applied in one transaction) at a time: a
# batch's statements and commit are shared by its messages, and its acks go out together. A fetch
# returns what the consumer holds, up to this many, without waiting for a full batch.
FETCH_BATCH = 256
# Submits arrive in bursts and cost the most rows each: larger batches, pulled by several loops on
# PostgreSQL.
SUBMIT_FETCH_BATCH = 1000
SUBMIT_PULLERS_POSTGRESQL = 3


def submit_pullers(dialect: str) -> int:
    """Loops pulling the submit consumer in one process: one on SQLite, whose single writer would
    only make the others wait."""
    return SUBMIT_PULLERS_POSTGRESQL if dialect == "postgresql" else 1


class InboundDelivery(Protocol):
    message: InboundMessage

    @property
    def attempt(self) -> int:
        """How many times the message was delivered, this delivery included (1 the first time)."""
        ...

    async def ack(self) -> None:
        """Ack, confirmed by the server."""
        ...

    async def send_ack(self) -> None:
        """Ack without waiting: the source's `confirm` waits once for a batch of them."""
        ...

    async def retry_later(self, delay: float) -> None: ...
    async def hold(self) -> None:
        """Tell the server the message is still being worked on, so it is not redelivered yet."""
        ...


class InboundSource(Protocol):
    async def fetch(self, batch: int = 64, timeout: float = 1.0) -> Sequence[InboundDelivery]: ...
    async def dead_letter(self, message: InboundMessage, reason: str) -> None: ...
    async def confirm(self) -> None:
        """Wait until the server has read every ack sent so far."""
        ...

    def reset(self) -> None: ...


async def ingest_loop(
    source: InboundSource,
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    metrics: Metrics = NO_METRICS,
    fit: FleetFit | None = None,
    batch: int = FETCH_BATCH,
) -> None:
    """Pull `source` until `stop`; `fit` is the process's memo of the submit-time fleet check
    (shared by its loops; a new one when not given)."""
    failures = 0
    fit = fit or FleetFit()
    while not stop.is_set():
        try:
            deliveries = await source.fetch(batch=batch)
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
            except StoreUnavailable as exc:
                metrics.db_retry(Writer.INGEST, retry_cause(exc))
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
        results = await asyncio.to_thread(
            retrying,
            Writer.INGEST,
            lambda: ingest.handle_batch(uow_factory(), messages, prefix, clock(), fit, metrics),
            metrics,
        )
    except StoreUnavailable:
        raise
    except Exception:
        log.exception("a batch of %d inbound messages failed; applying them one by one", len(deliveries))
        return False
    # Dead letters go out first, concurrently (each waits for the stream's acknowledgement; a task
    # only for each of them: a batch of 1,000 applied submits needs none); then every message whose
    # settling did not fail is acked, and one round trip confirms the lot.
    settled = list(zip(deliveries, results, strict=True))
    dead = [(d, r) for d, r in settled if r.outcome.dead_letter]
    sent = await asyncio.gather(*(_dead_letter(source, d, r) for d, r in dead))
    not_sent = {id(d) for (d, _), ok in zip(dead, sent, strict=True) if not ok}
    acked = [(d, r) for d, r in settled if id(d) not in not_sent]
    try:
        for delivery, _ in acked:
            await delivery.send_ack()
        await source.confirm()
    except Exception:  # NATS trouble: redelivered, then found in the inbox or refused again
        log.exception("could not ack a batch of %d inbound messages; they will be redelivered", len(acked))
        return True
    for delivery, result in acked:
        metrics.ingested(ingest.CONSUMER, result.outcome.value, message_lag(getattr(delivery, "published_at", None)))
    return True


async def _dead_letter(source: InboundSource, delivery: InboundDelivery, result: ingest.Handled) -> bool:
    """Dead-letter one message of a committed batch; False when that failed (the message is handed
    back, and is refused again when it returns)."""
    try:
        await source.dead_letter(delivery.message, result.detail)
        log.warning("dead-lettered %s: %s", delivery.message.subject, result.detail)
        return True
    except Exception:
        log.exception("could not dead-letter %s; it will be redelivered", delivery.message.subject)
        with contextlib.suppress(Exception):
            await delivery.retry_later(2.0)
        return False


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
        metrics.ingested(ingest.CONSUMER, outcome.value, message_lag(getattr(delivery, "published_at", None)))
    return outcome


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
            result = await asyncio.to_thread(
                retrying,
                Writer.INGEST,
                lambda: ingest.handle(uow_factory(), message, prefix, clock(), fit, metrics),
                metrics,
            )
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
