"""The long-running loops of gpufleet's processes, written against ports only.

This module holds what every loop shares (the clock type, the stoppable sleep, the generic
periodic loop); each loop family lives in its own module beside it: `lease_term`,
`scheduler_loop`, `dispatch_loop`, `idle_loop`, `report_loop`, `relay_loop`, `ingest_loop`,
`telemetry_loop` (shared consumer helpers in `consumers`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

log = logging.getLogger(__name__)


Clock = Callable[[], datetime]


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def periodic_loop(name: str, step: Callable[[], Awaitable[object]], stop: asyncio.Event, interval: float) -> None:
    """Run `step` every `interval` seconds until `stop`; a failed step is logged and retried."""
    while not stop.is_set():
        try:
            await step()
        except Exception:
            log.exception("%s pass failed; retrying", name)
        await sleep_or_stop(stop, interval)
