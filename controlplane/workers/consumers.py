"""What the ingest and telemetry consumers share: holding fetched messages through a database
outage, and the lag of a message since the stream stored it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from controlplane.workers.loops import sleep_or_stop

log = logging.getLogger(__name__)


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


def message_lag(published_at: float | None) -> float | None:
    """Seconds since the stream stored a message (None when the source does not say)."""
    return None if published_at is None else max(0.0, time.time() - published_at)
