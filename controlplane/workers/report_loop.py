"""The report loop: writes the previous hour's utilization report and the day's audit, one process
at a time."""

from __future__ import annotations

import asyncio
import logging

from controlplane.core.audit import AuditThresholds
from controlplane.core.idle import IdleRules
from controlplane.service.audit import publish_daily_audit
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.service.reports import publish_hourly_report
from controlplane.service.scheduling import (
    acquire_leadership,
)
from controlplane.workers.lease_term import holder_id
from controlplane.workers.loops import Clock, sleep_or_stop

log = logging.getLogger(__name__)


REPORT_LEASE = "reports"
REPORT_INTERVAL_SECONDS = 300.0


async def report_loop(
    uow_factory: UnitOfWorkFactory,
    prefix: str,
    clock: Clock,
    stop: asyncio.Event,
    interval: float = REPORT_INTERVAL_SECONDS,
    lease_ttl: float = 15.0,
    audit: tuple[IdleRules, AuditThresholds] | None = None,
) -> None:
    """Every few minutes, write the previous hour's `utilization.report` event unless it exists,
    and, with `audit` (the idle policy and the audit's thresholds), the UTC day's `audit.report`
    unless it exists. One process at a time (a lease); each event is idempotent per hour or day."""
    holder = holder_id("reports")
    ttl = max(lease_ttl, 3 * interval)
    while not stop.is_set():
        try:
            epoch = await asyncio.to_thread(acquire_leadership, uow_factory, holder, clock(), ttl, REPORT_LEASE)
            if epoch is not None and await asyncio.to_thread(publish_hourly_report, uow_factory, prefix, clock()):
                log.info("utilization report of the previous hour written")
            if (
                epoch is not None
                and audit is not None
                and await asyncio.to_thread(publish_daily_audit, uow_factory, prefix, *audit, clock())
            ):
                log.info("audit of the day written")
        except Exception:
            log.exception("utilization report failed; retrying")
        await sleep_or_stop(stop, interval)
