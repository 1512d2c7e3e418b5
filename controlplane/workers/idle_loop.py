"""The idle loop: judges running runs from their telemetry windows, one process at a time."""

from __future__ import annotations

import asyncio
import logging

from controlplane.core.idle import IdleRules
from controlplane.service.idle import idle_pass
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.service.scheduling import (
    acquire_leadership,
)
from controlplane.workers.lease_term import holder_id
from controlplane.workers.loops import Clock, sleep_or_stop

log = logging.getLogger(__name__)


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
