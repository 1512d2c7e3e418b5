"""The scheduler loop: scheduling cycles while this process leads the scheduler lease, keeping the
snapshot cache and the core's fleet state across a leadership term.

When the next cycle starts: as soon as the snapshot's change log has a change the last cycle did
not read and did not write itself (polled every `CHANGE_POLL` seconds, one index range look-up),
and at the latest `interval` after the last cycle *started* (decisions that depend on time alone:
minimum runtimes, history decay). A cycle longer than the interval is followed at once by the
next. So a submit waits for the cycle under way to end plus its own cycle, not also a fixed sleep
after a long cycle (at 100,000 queued the sleep came after a 3 to 5 s cycle); an idle fleet logs
nothing and polls only. The cycle's own writes (admissions, evictions, reasons) wake nothing: the
kept state already holds them, and a cycle that followed each decision only to read it back kept
the loop busy, so a new submit usually waited for that echo too. The next cycle still reads them
with the changes it wakes for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from controlplane.core.incremental import IncrementalScheduler
from controlplane.core.snapshot import Policy
from controlplane.service.errors import LostLeadership
from controlplane.service.metrics import NO_METRICS, Metrics, Writer
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.service.retries import count_store_retry
from controlplane.service.scheduling import (
    LEASE_NAME,
    run_cycle,
)
from controlplane.service.snapshot_cache import DEFAULT_REBUILD_INTERVAL, SnapshotCache
from controlplane.service.snapshot_ports import OwnChanges
from controlplane.workers.lease_term import LeaseTerm, holder_id
from controlplane.workers.loops import Clock, sleep_or_stop

log = logging.getLogger(__name__)
CHANGE_POLL = 0.05  # seconds between looks at the change log while waiting for the next cycle


def _changed_since(uow_factory: UnitOfWorkFactory, seq: int, own: Sequence[OwnChanges]) -> bool:
    with uow_factory() as uow:
        return uow.snapshots.changed_besides(seq, own)


async def wait_for_next_cycle(
    uow_factory: UnitOfWorkFactory,
    stop: asyncio.Event,
    cycle_started: float,
    interval: float,
    seen: int | None,
    own: Sequence[OwnChanges] = (),
) -> None:
    """Until `interval` after `cycle_started` (time.monotonic), or sooner once the change log holds
    a change past `seen` (the last cycle's cursor; None: no cursor, wait the interval) that the
    transactions of `own` (the last cycle's writes) did not log."""
    deadline = cycle_started + interval
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if seen is not None:
            try:
                if await asyncio.to_thread(_changed_since, uow_factory, seen, own):
                    return
            except Exception:  # the poll is only a hint: the database is down, the cycle will say so
                seen = None
        await sleep_or_stop(stop, min(CHANGE_POLL, left) if seen is not None else left)


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
        started = time.monotonic()
        own: tuple[OwnChanges, ...] = ()
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
                own = result.own_changes
                if result.admitted:
                    log.info("cycle: admitted %d, %d pending", result.admitted, result.pending, extra={"epoch": epoch})
        except LostLeadership as exc:
            log.warning("%s", exc, extra={"epoch": term.epoch})
            term.lose()
            cache = None
        except Exception as exc:
            count_store_retry(metrics, Writer.SCHEDULER, exc)
            log.exception("scheduler cycle failed; retrying")
            cache = None
        seen = None if cache is None else cache.last_change_read
        await wait_for_next_cycle(uow_factory, stop, started, interval, seen, own)
    await term.release()
