"""The scheduler loop: one scheduling cycle per interval while this process leads the scheduler
lease, keeping the snapshot cache and the core's fleet state across a leadership term."""

from __future__ import annotations

import asyncio
import gc
import logging

from controlplane.core.incremental import IncrementalScheduler
from controlplane.core.snapshot import Policy
from controlplane.service.errors import LostLeadership
from controlplane.service.metrics import NO_METRICS, Metrics
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.service.scheduling import (
    LEASE_NAME,
    run_cycle,
)
from controlplane.service.snapshot_cache import DEFAULT_REBUILD_INTERVAL, SnapshotCache
from controlplane.workers.lease_term import LeaseTerm, holder_id
from controlplane.workers.loops import Clock, sleep_or_stop

log = logging.getLogger(__name__)


def settle_long_lived_objects() -> None:
    """Move every object alive now out of the cyclic garbage collector's reach (`gc.freeze`).

    After a full snapshot read and a state rebuild the process holds millions of long-lived
    objects (every queued gang, node and live run, the placement indexes); each full collection
    walked them all, about 40 % of a cycle at 100,000 queued gangs. They are acyclic and freed by
    reference counting when the next snapshot replaces them, which freezing does not prevent; what
    freezing does cost is that cyclic garbage alive at this instant (another thread's unit of
    work, say) is never collected: a bounded amount once per rebuild (every few minutes)."""
    gc.collect()
    gc.freeze()


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
                    settle_long_lived_objects,
                )
                if result.admitted:
                    log.info("cycle: admitted %d, %d pending", result.admitted, result.pending, extra={"epoch": epoch})
                if scheduler.last_sync.rebuilt:
                    settle_long_lived_objects()  # the state and indexes it built are long-lived too
        except LostLeadership as exc:
            log.warning("%s", exc, extra={"epoch": term.epoch})
            term.lose()
            cache = None
        except Exception:
            log.exception("scheduler cycle failed; retrying")
            cache = None
        await sleep_or_stop(stop, interval)
    await term.release()
