"""The outbox relay: publish committed events, in order, with Nats-Msg-Id = outbox id."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from controlplane.service.messaging_ports import DeadLetters, Undeliverable
from controlplane.service.metrics import NO_METRICS, Metrics
from controlplane.service.ports import EventPublisher, UnitOfWorkFactory

log = logging.getLogger(__name__)


async def relay_once(
    uow_factory: UnitOfWorkFactory,
    publisher: EventPublisher,
    clock: Callable[[], datetime],
    batch: int = 200,
    metrics: Metrics = NO_METRICS,
    dead_letters: DeadLetters | None = None,
) -> int:
    """Publish up to `batch` events; stops at the first failure so no event overtakes another.

    An event the broker can never take (`Undeliverable`: larger than it accepts) must not stop the
    events behind it: it goes to `dead_letters` (bounded there) and leaves the queue with its
    reason, counted and alerted on (`gpufleet_outbox_dead_lettered_events_total`)."""
    with uow_factory() as uow:
        rows = uow.outbox.unpublished(batch)
    published: list[str] = []
    dead: list[tuple[str, str]] = []
    failure: tuple[str, str] | None = None
    for event_id, subject, payload in rows:
        try:
            await publisher.publish(subject, payload.encode(), event_id)
        except Undeliverable as exc:
            try:
                if dead_letters is not None:
                    await dead_letters.dead_letter(subject, payload.encode(), event_id, str(exc))
            except Exception as dead_exc:  # the dead letter's outcome is unknown: try it all again
                failure = (event_id, f"dead-lettering failed: {type(dead_exc).__name__}: {dead_exc}")
                break
            dead.append((event_id, str(exc)))
            continue
        except Exception as exc:  # outcome unknown: the same msg id is reused next time
            failure = (event_id, f"{type(exc).__name__}: {exc}")
            break
        published.append(event_id)
    with uow_factory() as uow:
        now = clock()
        if published:
            uow.outbox.mark_published(published, now)
        for event_id, reason in dead:
            uow.outbox.mark_dead_lettered(event_id, reason, now)
            log.error("relay: event %s can never be published and was dead-lettered: %s", event_id, reason)
        if failure:
            uow.outbox.record_failure(*failure)
            log.warning("relay: publish of %s failed: %s", *failure)
        uow.commit()
    for _ in dead:
        metrics.relay_dead_lettered()
    if published or failure:
        metrics.relayed(len(published), failure is not None)
    return len(published) + len(dead)


def relay_gap(uow_factory: UnitOfWorkFactory, now: datetime, patience: float) -> str | None:
    """None while events go out; otherwise a sentence (readiness: a relay that is down or stuck means
    nobody hears what happens to their workloads, even though submits are taken)."""
    with uow_factory() as uow:
        oldest = uow.outbox.oldest_unpublished()
    if oldest is None:
        return None
    waited = (now - oldest).total_seconds()
    if waited <= patience:
        return None
    return f"events are not going out: the oldest unpublished event was written {waited:.1f} s ago"


# Published events stay a day for inspection; inbox rows must outlive every redelivery, and the
# inbound stream keeps messages for 7 days.
KEEP_PUBLISHED = timedelta(days=1)
KEEP_INBOX = timedelta(days=8)


def housekeeping(uow_factory: UnitOfWorkFactory, now: datetime) -> tuple[int, int]:
    """Delete published outbox rows and inbox rows past their horizon; returns both counts."""
    with uow_factory() as uow:
        outbox = uow.outbox.prune(now - KEEP_PUBLISHED)
        inbox = uow.inbox.prune(now - KEEP_INBOX)
        uow.commit()
    return outbox, inbox
