"""The outbox relay: publish committed events, in order, with Nats-Msg-Id = outbox id."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from controlplane.service.metrics import NO_METRICS, Metrics
from controlplane.service.ports import EventPublisher, UnitOfWorkFactory

log = logging.getLogger(__name__)


async def relay_once(
    uow_factory: UnitOfWorkFactory,
    publisher: EventPublisher,
    clock: Callable[[], datetime],
    batch: int = 200,
    metrics: Metrics = NO_METRICS,
) -> int:
    """Publish up to `batch` events; stops at the first failure so no event overtakes another."""
    with uow_factory() as uow:
        rows = uow.outbox.unpublished(batch)
    published: list[str] = []
    failure: tuple[str, str] | None = None
    for event_id, subject, payload in rows:
        try:
            await publisher.publish(subject, payload.encode(), event_id)
        except Exception as exc:  # outcome unknown: the same msg id is reused next time
            failure = (event_id, f"{type(exc).__name__}: {exc}")
            break
        published.append(event_id)
    with uow_factory() as uow:
        if published:
            uow.outbox.mark_published(published, clock())
        if failure:
            uow.outbox.record_failure(*failure)
            log.warning("relay: publish of %s failed: %s", *failure)
        uow.commit()
    if published or failure:
        metrics.relayed(len(published), failure is not None)
    return len(published)


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
