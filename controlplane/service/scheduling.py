"""The scheduler's imperative shell: lease, load snapshot, decide (pure), apply under the epoch."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from controlplane.core.decision import Decision, Eviction, EvictionKind, PendingReason
from controlplane.core.incremental import IncrementalScheduler
from controlplane.core.invariants import check_decision
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Policy
from controlplane.domain.model import WorkloadState
from controlplane.service.errors import LostLeadership
from controlplane.service.events import emit_each, emit_many
from controlplane.service.metrics import NO_METRICS, CyclePhase, Metrics, Writer, seconds_between
from controlplane.service.ports import PendingRecord, UnitOfWork, UnitOfWorkFactory
from controlplane.service.report_records import EVICTION_ACTION, IDLE_RECLAIM_ACTION
from controlplane.service.retries import retrying
from controlplane.service.snapshot_cache import SnapshotCache
from controlplane.service.snapshot_ports import OwnChanges
from controlplane.service.wording import eviction_fields, eviction_text, pending_fields, pending_text

log = logging.getLogger(__name__)
LEASE_NAME = "scheduler"
# Usage older than this many half-lives weighs under 0.4 % and is not read.
HISTORY_HALF_LIVES = 8
LIVE_RUN_STATES = ("admitted", "dispatching", "running")
LIVE_WORKLOAD_STATES = (WorkloadState.ADMITTED, WorkloadState.DISPATCHING, WorkloadState.RUNNING)


@dataclass(frozen=True)
class CycleResult:
    epoch: int
    pending: int
    admitted: int
    reasons_written: int
    evicted: int = 0
    # Seconds per phase of this cycle, in order (what the cycle metrics report), for benches and logs.
    phases: tuple[tuple[CyclePhase, float], ...] = ()
    # The changes this cycle's own writes logged: they do not wake the next cycle (the loop's poll
    # looks past them), since the kept state already holds what they say.
    own_changes: tuple[OwnChanges, ...] = ()


def acquire_leadership(
    uow_factory: UnitOfWorkFactory, holder: str, now: datetime, ttl: float, lease: str = LEASE_NAME
) -> int | None:
    """The epoch of this holder's term, or None while another holder's lease is live."""
    with uow_factory() as uow:
        epoch = uow.leases.acquire(lease, holder, now, ttl)
        uow.commit()
    return epoch


def renew_leadership(
    uow_factory: UnitOfWorkFactory, holder: str, epoch: int, now: datetime, ttl: float, lease: str = LEASE_NAME
) -> bool:
    """Extend this holder's term; False once another holder has taken the lease (deposed)."""
    with uow_factory() as uow:
        renewed = uow.leases.renew(lease, holder, epoch, now, ttl)
        uow.commit()
    return renewed


def expire_leases_of_dead_holders(uow_factory: UnitOfWorkFactory) -> int:
    """End every lease at once. Only for a caller that knows no holder is alive, e.g. the embedded
    `gpufleet up` holding its state directory's lock: a restart after a crash need not wait out the
    crashed process's leases."""
    with uow_factory() as uow:
        expired = uow.leases.expire_all()
        uow.commit()
    return expired


def lease_gap(uow_factory: UnitOfWorkFactory, lease: str, now: datetime) -> str | None:
    """None while some holder's `lease` is live; otherwise a sentence saying since when nobody holds
    it (readiness: a dead scheduler or dispatcher means no admissions or dispatch)."""
    with uow_factory() as uow:
        expires = uow.leases.expires_at(lease)
    if expires is None:
        return f"no {lease} has taken its lease yet"
    if expires > now:
        return None
    if expires.year == 1970:
        return f"no live {lease}: the last one stopped"
    return f"no live {lease}: its lease expired {(now - expires).total_seconds():.1f} s ago"


def release_leadership(uow_factory: UnitOfWorkFactory, holder: str, epoch: int, lease: str = LEASE_NAME) -> None:
    with uow_factory() as uow:
        uow.leases.release(lease, holder, epoch)
        uow.commit()


def _pending_records(reasons: Sequence[PendingReason]) -> list[PendingRecord]:
    """The pending reasons as stored. Waiting gangs share reasons (90,000 gangs, 20,000 reason
    objects, under 2,000 distinct values at 100,000 queued), so each distinct value is worded once
    and its record parts shared; the writer then serialises each distinct detail once. Looked up by
    identity first, so each reason object is hashed once, not once per gang (the decision holds
    every reason, so no id is reused meanwhile)."""
    by_identity: dict[tuple[int, int], tuple[str, str, dict[str, Any]]] = {}
    by_value: dict[tuple[object, object], tuple[str, str, dict[str, Any]]] = {}
    records = []
    for p in reasons:
        key = (id(p.why), id(p.reservation))
        found = by_identity.get(key)
        if found is None:
            value = (p.why, p.reservation)
            found = by_value.get(value)
            if found is None:
                found = by_value[value] = (pending_text(p), str(p.kind), pending_fields(p))
            by_identity[key] = found
        records.append(PendingRecord(p.workload_id, found[0], found[1], found[2]))
    return records


def settle_long_lived_objects() -> None:
    """Move every object alive now out of the cyclic garbage collector's reach (`gc.freeze`).

    After a full snapshot read and a state rebuild the process holds millions of long-lived
    objects (every queued gang, node and live run, the placement indexes); each full collection
    walked them all, about 40 % of a cycle at 100,000 queued gangs. They are acyclic and freed by
    reference counting when the next snapshot replaces them, which freezing does not prevent. The
    collection first frees the cyclic garbage alive now, so only what another thread holds at this
    instant (its unit of work, say) is frozen with them: a bounded amount once per rebuild."""
    gc.collect()
    gc.freeze()


@contextmanager
def collector_paused(settle: Callable[[], bool]) -> Iterator[None]:
    """Pause the cyclic garbage collector for a cycle: it builds large acyclic data (the snapshot
    read, the core's fleet state and indexes when rebuilt, the records it writes), and each full
    collection walks every object alive; at 100,000 queued a read triggered many of them (about
    1 s of the read, 1 s of the apply, and 0.6 s of a rebuilt state's first decision). Reference
    counting still frees what is dropped; cyclic garbage waits until after the cycle. When the
    cycle read in full or rebuilt its state (`settle()` says so once it ends), what it built is
    settled (`settle_long_lived_objects`) before the collector resumes: resumed first, it would
    walk all of it at the next allocation (0.24 s at 100,000 queued), then once more to settle."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if settle():
            settle_long_lived_objects()
    finally:
        if was_enabled:
            gc.enable()


def run_cycle(
    uow_factory: UnitOfWorkFactory,
    holder: str,
    epoch: int,
    policy: Policy,
    prefix: str,
    now: datetime,
    ttl: float,
    check_invariants: bool = False,
    metrics: Metrics = NO_METRICS,
    cache: SnapshotCache | None = None,
    scheduler: IncrementalScheduler | None = None,
) -> CycleResult:
    """One cycle. With the leadership term's `cache` the snapshot is refreshed from what changed
    since the last cycle; without one it is loaded in full (a throwaway cache). With the term's
    `scheduler` the core decides on the fleet state it kept from the last cycle; without one,
    one-shot `schedule()` (the same decision, built from scratch). The cyclic garbage collector is
    paused for the whole cycle (`collector_paused`), and what a full read or a rebuilt state made
    is settled once the decision has landed."""
    cache = cache if cache is not None else SnapshotCache()

    def built_anew() -> bool:
        return cache.last_refresh_was_full or (scheduler is not None and scheduler.last_sync.rebuilt)

    try:
        with collector_paused(built_anew):
            return _cycle(
                uow_factory,
                holder,
                epoch,
                policy,
                prefix,
                now,
                ttl,
                check_invariants,
                metrics,
                cache,
                scheduler,
            )
    except BaseException:
        # The decision may or may not have landed, the cache's view may be torn: rebuild next cycle.
        cache.invalidate()
        if scheduler is not None:
            scheduler.reset()
        raise


def _renew_under_epoch(uow: UnitOfWork, holder: str, epoch: int, now: datetime, ttl: float) -> None:
    """Renew the lease in the writing transaction: a deposed leader's write never lands."""
    if not uow.leases.renew(LEASE_NAME, holder, epoch, now, ttl):
        raise LostLeadership(f"scheduler epoch {epoch} is no longer current")


def _store_reasons(
    uow_factory: UnitOfWorkFactory,
    holder: str,
    epoch: int,
    now: datetime,
    ttl: float,
    cache: SnapshotCache,
    reasons: Sequence[PendingReason],
    metrics: Metrics = NO_METRICS,
) -> tuple[int, OwnChanges | None]:
    """Store these pending reasons in their own transaction, under the epoch as every decision;
    how many rows were written, and the changes the transaction logged."""
    records = _pending_records(reasons)
    to_write = cache.pending_to_write(records)
    if not to_write:
        return 0, None

    def write() -> tuple[int, OwnChanges]:
        with uow_factory() as uow:
            before = uow.snapshots.latest_change()
            written = uow.workloads.record_pending(to_write)
            _renew_under_epoch(uow, holder, epoch, now, ttl)
            own = uow.snapshots.own_changes(before)
            uow.commit()
        return written, own

    written, own = retrying(Writer.SCHEDULER, write, metrics)
    cache.pending_written(records)
    return written, own


def apply_decision(
    uow: UnitOfWork, decision: Decision, epoch: int, prefix: str, now: datetime
) -> tuple[list[Eviction], dict[str, str]]:
    """Write a decision's evictions and admissions (not its pending reasons) in the caller's
    transaction: the evictions that ended a run, and the queue of each workload admitted. Every
    workload it touches is locked first, all at once in the one lock order (the victims' and the
    admitted ones': adapters/sql/row_locks.py), so no writer can hold one of them while waiting
    for another this transaction already holds."""
    uow.workloads.lock([e.workload_id for e in decision.evictions] + [a.workload_id for a in decision.admissions])
    evictions_done = _write_evictions(uow, decision.evictions, epoch, prefix, now)
    queues = uow.workloads.admit_all(decision.admissions, epoch, now)
    emit_many(uow, prefix, "admitted", list(queues.items()), now, epoch=epoch)
    return evictions_done, queues


def _write_evictions(
    uow: UnitOfWork, evictions: Sequence[Eviction], epoch: int, prefix: str, now: datetime
) -> list[Eviction]:
    """Write a cycle's evictions in a bounded number of statements, not a handful per eviction:
    the runs still live end (one UPDATE; one that finished since the snapshot is left alone), their
    workloads go back to the queue, or fail when an idle policy says stop (one UPDATE), then every
    ended run's audit record and event (their data read in one query). Returns those that ended."""
    if not evictions:
        return []
    reasons = {eviction.run_id: eviction_text(eviction) for eviction in evictions}
    # Idle reclaims are rare and carry their evidence: their findings are read one by one.
    findings = {e.run_id: uow.idle.finding(e.run_id) for e in evictions if e.kind is EvictionKind.IDLE}
    ended = uow.runs.end_all(
        [(e.run_id, reasons[e.run_id], e.end_cause) for e in evictions], LIVE_RUN_STATES, "preempted", now
    )
    done = [eviction for eviction in evictions if eviction.run_id in ended]

    def stops(eviction: Eviction) -> bool:
        # An idle policy with action `stop` ends the workload instead of requeueing it.
        finding = findings.get(eviction.run_id)
        return finding is not None and finding.action == "stop"

    uow.workloads.set_states(
        [
            (e.workload_id, (WorkloadState.FAILED if stops(e) else WorkloadState.QUEUED).value, reasons[e.run_id])
            for e in done
        ],
        LIVE_WORKLOAD_STATES,
        now,
    )
    events: list[tuple[str, str, str, dict[str, Any]]] = []
    for eviction in done:
        finding = findings.get(eviction.run_id)
        if eviction.kind is EvictionKind.IDLE:
            # Every reclaim for idleness is audited with the evidence it rests on and the epoch.
            uow.audit.record(
                "scheduler",
                IDLE_RECLAIM_ACTION,
                "run",
                eviction.run_id,
                {
                    "epoch": epoch,
                    "workload_id": eviction.workload_id,
                    "beneficiary": eviction.beneficiary,
                    "action": "stop" if stops(eviction) else "requeue",
                    "finding": finding.reason if finding else "",
                    "idle_windows": finding.idle_windows if finding else 0,
                    "evidence": list(finding.evidence) if finding else [],
                },
                now,
            )
        else:
            # The beneficiary of every other eviction is kept too (events are pruned, the run
            # row has no column for it): the preemption report names the team that gained.
            uow.audit.record(
                "scheduler",
                EVICTION_ACTION,
                "run",
                eviction.run_id,
                {"epoch": epoch, "workload_id": eviction.workload_id, **eviction_fields(eviction)},
                now,
            )
        event = {EvictionKind.RECLAIM: "reclaimed", EvictionKind.IDLE: "reclaimed-idle"}.get(eviction.kind, "preempted")
        extra = {
            "run_id": eviction.run_id,
            "epoch": epoch,
            "beneficiary": eviction.beneficiary,
            "kind": str(eviction.kind),
            "reason": reasons[eviction.run_id],
            "detail": eviction_fields(eviction),
        }
        events.append((eviction.workload_id, eviction.victim_queue, event, extra))
    emit_each(uow, prefix, events, now)
    return done


def _cycle(
    uow_factory: UnitOfWorkFactory,
    holder: str,
    epoch: int,
    policy: Policy,
    prefix: str,
    now: datetime,
    ttl: float,
    check_invariants: bool,
    metrics: Metrics,
    cache: SnapshotCache,
    scheduler: IncrementalScheduler | None,
) -> CycleResult:
    started = mark = time.perf_counter()
    phases: list[tuple[CyclePhase, float]] = []

    def phase_done(phase: CyclePhase) -> None:
        nonlocal mark
        phases.append((phase, time.perf_counter() - mark))
        mark = time.perf_counter()

    since = None
    if policy.usage_history_weight > 0:
        since = now - timedelta(seconds=policy.usage_half_life_seconds * HISTORY_HALF_LIVES)
    snapshot = cache.refresh(uow_factory, epoch, now, history_since=since, last_rebalance=policy.rebalance)
    phase_done(CyclePhase.SNAPSHOT)
    parked_written = 0
    own: list[OwnChanges] = []
    if scheduler is not None:
        # What waits (behind its queue's heads, or parked) is known before any gang is decided in
        # order, and stored at once: a new gang behind its queue's heads learns so in a few
        # hundredths of a second, not after the ordered pass (0.3 to 1 s at 100,000 queued).
        parked_written, parked_own = _store_reasons(
            uow_factory, holder, epoch, now, ttl, cache, scheduler.park(snapshot, policy), metrics
        )
        own.extend([parked_own] if parked_own is not None else [])
        phase_done(CyclePhase.PARK)
    decision = scheduler.decide(snapshot, policy, now) if scheduler is not None else schedule(snapshot, policy, now)
    phase_done(CyclePhase.SCHEDULE)
    if check_invariants:
        check_decision(snapshot, decision)
        phase_done(CyclePhase.CHECK)
    records = _pending_records(decision.pending)

    def write() -> tuple[list[Eviction], dict[str, str], dict[str, datetime], int, OwnChanges]:
        with uow_factory() as uow:
            before = uow.snapshots.latest_change()  # first in the transaction (see `own_changes`)
            evictions_done, queues = apply_decision(uow, decision, epoch, prefix, now)
            submitted = uow.workloads.submitted_at(list(queues))
            written = uow.workloads.record_pending(cache.pending_to_write(records))
            # The epoch check and every write of this decision share one transaction: a deposed
            # leader's decision can never land. Checked last, so the lease row is locked only for
            # the commit, never while the decision is written (the background renewal and a standby
            # would otherwise wait behind a long write and find the lease expired).
            _renew_under_epoch(uow, holder, epoch, now, ttl)
            changes = uow.snapshots.own_changes(before)
            uow.commit()
        return evictions_done, queues, submitted, written, changes

    evictions_done, queues, submitted, written, changes = retrying(Writer.SCHEDULER, write, metrics)
    written += parked_written
    own.append(changes)
    admitted_waits = [(queue, seconds_between(submitted.get(wid), now)) for wid, queue in queues.items()]
    admitted = len(admitted_waits)
    cache.pending_written(records)
    phase_done(CyclePhase.APPLY)
    # Reported once the decision has landed: a deposed leader's cycle counts nothing.
    for phase, seconds in phases:
        metrics.cycle_phase(phase, seconds)
    for eviction in evictions_done:
        metrics.evicted(eviction.kind)
        log.info(
            "evicted run %s (%s): %s",
            eviction.run_id,
            eviction.kind,
            eviction_text(eviction),
            extra={"run": eviction.run_id, "workload": eviction.workload_id, "epoch": epoch},
        )
    for queue, waited in admitted_waits:
        metrics.admitted(queue, waited)
    # Every pending gang not admitted is left pending (the kept state's decision lists only the
    # reasons that changed, so its length is not that count).
    left_pending = len(snapshot.pending) - len(decision.admissions)
    metrics.cycle_done(time.perf_counter() - started, left_pending)
    return CycleResult(epoch, left_pending, admitted, written, len(evictions_done), tuple(phases), tuple(own))
