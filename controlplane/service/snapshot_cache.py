"""The scheduler's snapshot, kept across cycles: each cycle reads only what changed.

A full `load` reads every queued gang, live run and node (1.2 s at 12,000 queued gangs on
PostgreSQL). The cache loads once, then each `refresh` reads the change log since its cursor
(adapters/sql/snapshot_changes.py says why no change can be missed) and returns a new Snapshot in
which every object that did not change is the very same Python object as in the previous one
(the scheduling core diffs consecutive snapshots by identity), in the order `load` gives.

It rebuilds from a full `load` on first use, for a new leadership epoch, after any error (the
caller calls `invalidate`, or `refresh` does when it fails itself), when a priority class changed,
when the history window or rebalance flag it was built with changes, and every
`rebuild_interval` seconds as a safety net (Settings.snapshot_rebuild_interval).

It also remembers the pending reasons stored: read with each full load, then those it wrote this
term, so a cycle (the first of a term too) sends only those that changed.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from controlplane.core.history import UsageInterval
from controlplane.core.snapshot import LiveRun, PendingDelta, Snapshot
from controlplane.domain.model import Cluster, Node, Workload
from controlplane.service.ports import PendingRecord, UnitOfWorkFactory
from controlplane.service.snapshot_ports import ChangeCursor, SnapshotChanges

# Change-log rows older than this are pruned once read; a cache that has not refreshed for half
# of it rebuilds rather than trust a log that may have been pruned under it.
CHANGE_RETENTION = timedelta(hours=1)
PRUNE_EVERY = timedelta(minutes=1)
DEFAULT_REBUILD_INTERVAL = 600.0

T = TypeVar("T")


def _pending_order(workload: Workload) -> tuple[int, str]:
    return (workload.created_seq, workload.id)  # as `load` orders them (ids compared bytewise)


def _kept(old: T | None, new: T) -> T:
    """The old object when the re-read one equals it: identity is what tells the core 'unchanged'."""
    return old if old is not None and old == new else new


def _interned(old: Sequence[T], new: Iterable[T], key: Callable[[T], Hashable]) -> tuple[T, ...]:
    """`new` with each element equal to an old one of the same key replaced by that old one; `old`
    itself when nothing differs."""
    by_key = {key(item): item for item in old}
    merged = tuple(_kept(by_key.get(key(item)), item) for item in new)
    if len(merged) == len(old) and all(a is b for a, b in zip(merged, old, strict=True)):
        return tuple(old)
    return merged


@dataclass(frozen=True)
class _Shape:
    """What a snapshot was read for; a different request rebuilds."""

    history: bool
    last_rebalance: bool


class SnapshotCache:
    def __init__(self, rebuild_interval: float = DEFAULT_REBUILD_INTERVAL) -> None:
        self.rebuild_interval = timedelta(seconds=rebuild_interval)
        self.rebuilds = 0  # full loads done (tests and logs)
        self.last_refresh_was_full = False
        self._snapshot: Snapshot | None = None
        self._epoch: int | None = None
        self._shape: _Shape | None = None
        self._cursor: ChangeCursor | None = None
        self._built_at: datetime | None = None
        self._refreshed_at: datetime | None = None
        self._pruned_at: datetime | None = None
        self._history_since: datetime | None = None
        self._pending: dict[str, Workload] = {}
        self._order = _Ordered(())
        self._live: dict[str, LiveRun] = {}
        self._usage: dict[str, UsageInterval] = {}
        # Pending reasons as stored: read with the full load, then as last written this term
        # (text, kind) per workload; None until a full load.
        self._written: dict[str, tuple[str, str]] | None = None

    @property
    def epoch(self) -> int | None:
        return self._epoch

    @property
    def last_change_read(self) -> int | None:
        """The `seq` of the latest change the snapshot holds; None before a load."""
        return None if self._snapshot is None or self._cursor is None else self._cursor.seq

    def invalidate(self) -> None:
        """Forget everything: the next refresh is a full load."""
        self._snapshot = None
        self._written = None

    def refresh(
        self,
        uow_factory: UnitOfWorkFactory,
        epoch: int,
        now: datetime,
        history_since: datetime | None = None,
        last_rebalance: bool = False,
    ) -> Snapshot:
        """The current snapshot: from the changes since the last one, or a full load."""
        shape = _Shape(history_since is not None, last_rebalance)
        try:
            if self._must_rebuild(epoch, now, shape, history_since):
                self._rebuild(uow_factory, epoch, now, shape, history_since)
            else:
                with uow_factory() as uow:
                    assert self._cursor is not None
                    changes = uow.snapshots.changes_since(self._cursor, history_since, last_rebalance)
                if changes.classes_changed:
                    self._rebuild(uow_factory, epoch, now, shape, history_since)
                else:
                    self._apply(changes, history_since)
                    self.last_refresh_was_full = False
            self._refreshed_at = now
            self._prune(uow_factory, now)
        except BaseException:
            self.invalidate()
            raise
        assert self._snapshot is not None
        return self._snapshot

    def _must_rebuild(self, epoch: int, now: datetime, shape: _Shape, history_since: datetime | None) -> bool:
        if self._snapshot is None or self._cursor is None or self._built_at is None or self._refreshed_at is None:
            return True
        if epoch != self._epoch or shape != self._shape:
            return True
        if now < self._refreshed_at or now - self._built_at >= self.rebuild_interval:
            return True  # a clock gone back, or the safety net
        if now - self._refreshed_at >= CHANGE_RETENTION / 2:
            return True  # the log under the cursor may have been pruned by now
        # The history window only moves forward; runs leave it by time, enter it by a change.
        return self._history_since is not None and history_since is not None and history_since < self._history_since

    def _rebuild(
        self, uow_factory: UnitOfWorkFactory, epoch: int, now: datetime, shape: _Shape, history_since: datetime | None
    ) -> None:
        self.invalidate()
        with uow_factory() as uow:
            snapshot = uow.snapshots.load(last_rebalance=shape.last_rebalance)
            usage = uow.snapshots.usage_by_run(history_since) if history_since is not None else {}
            cursor = uow.snapshots.change_cursor()
            stored = uow.snapshots.stored_reasons()
        # What is stored now is what the first write compares with (the store compares again).
        self._written = dict(stored)
        self._usage = {run_id: interval for run_id, interval in usage.items() if interval is not None}
        self._pending = {w.id: w for w in snapshot.pending}
        self._order = _Ordered(snapshot.pending)
        self._live = {run.run_id: run for run in snapshot.live_runs}
        self._snapshot = Snapshot(
            clusters=snapshot.clusters,
            nodes=snapshot.nodes,
            queue_tree=snapshot.queue_tree,
            pending=snapshot.pending,
            live_runs=snapshot.live_runs,
            usage_history=tuple(self._usage.values()),
            last_rebalance_at=snapshot.last_rebalance_at,
        )
        self._epoch, self._shape, self._cursor = epoch, shape, cursor
        self._built_at, self._history_since = now, history_since
        self.rebuilds += 1
        self.last_refresh_was_full = True

    def _apply(self, changes: SnapshotChanges, history_since: datetime | None) -> None:
        old = self._snapshot
        assert old is not None
        pending, delta = old.pending, None
        if changes.workload_ids:
            pending, delta = self._merge_pending(changes)
        live_runs = old.live_runs
        if changes.workload_ids or changes.run_ids or changes.live_runs:
            live_runs = self._merge_live(changes)
        clusters = old.clusters if changes.clusters is None else _interned(old.clusters, changes.clusters, _id)
        nodes = old.nodes if changes.nodes is None else _interned(old.nodes, changes.nodes, _id)
        tree = old.queue_tree
        if changes.queue_tree is not None:
            merged = {key: _kept(tree.get(key), node) for key, node in changes.queue_tree.items()}
            same = merged.keys() == tree.keys() and all(merged[k] is tree[k] for k in merged)
            tree = tree if same else merged
        usage_history = self._merge_usage(changes, history_since, old.usage_history)
        self._snapshot = Snapshot(
            clusters=clusters,
            nodes=nodes,
            queue_tree=tree,
            pending=pending,
            live_runs=live_runs,
            usage_history=usage_history,
            last_rebalance_at=changes.last_rebalance_at if changes.last_rebalance_read else old.last_rebalance_at,
            pending_delta=delta,
        )
        self._cursor, self._history_since = changes.cursor, history_since

    def _merge_pending(self, changes: SnapshotChanges) -> tuple[tuple[Workload, ...], PendingDelta | None]:
        """The pending gangs after `changes`, in `load`'s order, and how they differ (None: not at
        all). The order is kept by bisection: a change costs a search and a move, not a sort."""
        assert self._snapshot is not None
        fresh = {w.id: w for w in changes.pending}
        changed: list[Workload] = []
        removed: set[str] = set()
        for workload_id in changes.workload_ids:
            old = self._pending.pop(workload_id, None)
            if self._written is not None:
                # Its state changed (or it was re-read): the reason stored may not be ours any more.
                self._written.pop(workload_id, None)
            new = fresh.get(workload_id)
            if new is not None:
                kept = self._pending[workload_id] = _kept(old, new)
                if kept is not old:
                    if old is not None:
                        self._order.remove(old)
                    self._order.insert(kept)
                    changed.append(kept)
            elif old is not None:
                self._order.remove(old)
                removed.add(workload_id)
        if not changed and not removed:
            return self._snapshot.pending, None  # every touched gang re-read equal
        pending = self._order.items()
        return pending, PendingDelta(self._snapshot.pending, tuple(changed), frozenset(removed))

    def _merge_live(self, changes: SnapshotChanges) -> tuple[LiveRun, ...]:
        touched = set(changes.run_ids)
        if changes.workload_ids:
            touched.update(r.run_id for r in self._live.values() if r.workload_id in changes.workload_ids)
        fresh = {run.run_id: run for run in changes.live_runs}
        touched.update(fresh)
        differ = False
        for run_id in touched:
            old = self._live.get(run_id)
            new = fresh.get(run_id)
            if new is None:
                differ |= self._live.pop(run_id, None) is not None
            elif old is None or old != new:
                self._live[run_id] = new  # a changed run keeps its place, a new one comes last
                differ = True
        assert self._snapshot is not None
        return tuple(self._live.values()) if differ else self._snapshot.live_runs

    def _merge_usage(
        self, changes: SnapshotChanges, since: datetime | None, previous: tuple[UsageInterval, ...]
    ) -> tuple[UsageInterval, ...]:
        if since is None:
            return ()
        differ = False
        if changes.usage_complete:
            fresh = {run_id: interval for run_id, interval in changes.usage.items() if interval is not None}
            merged = {run_id: _kept(self._usage.get(run_id), interval) for run_id, interval in fresh.items()}
            differ = merged.keys() != self._usage.keys() or any(merged[k] is not self._usage[k] for k in merged)
            self._usage = merged
        else:
            for run_id, interval in changes.usage.items():
                old = self._usage.get(run_id)
                if interval is None:
                    differ |= self._usage.pop(run_id, None) is not None
                elif old is None or old != interval:
                    self._usage[run_id] = interval
                    differ = True
        # Runs leave the window by time alone: the same test `load` applies (finished_at >= since).
        ended = [run_id for run_id, i in self._usage.items() if i.end is not None and i.end < since]
        for run_id in ended:
            del self._usage[run_id]
        return tuple(self._usage.values()) if differ or ended else previous

    def _prune(self, uow_factory: UnitOfWorkFactory, now: datetime) -> None:
        if self._pruned_at is not None and self._pruned_at <= now < self._pruned_at + PRUNE_EVERY:
            return
        assert self._cursor is not None
        with uow_factory() as uow:
            uow.snapshots.prune_changes(self._cursor, now - CHANGE_RETENTION)
            uow.commit()
        self._pruned_at = now

    # --- pending reasons --------------------------------------------------------------------------

    def pending_to_write(self, records: Sequence[PendingRecord]) -> list[PendingRecord]:
        """The reasons worth sending: all after a rebuild (the store compares them with what it
        holds), else only those that differ from what this term last wrote."""
        if self._written is None:
            return list(records)
        written = self._written
        return [r for r in records if written.get(r.workload_id) != _reason_key(r)]

    def pending_written(self, records: Sequence[PendingRecord]) -> None:
        """These reasons are stored now (written, or already equal): call after commit. A decision
        of the kept state lists only the reasons that changed; the rest stay as stored."""
        if self._written is not None:
            self._written.update((r.workload_id, _reason_key(r)) for r in records)


def _reason_key(record: PendingRecord) -> tuple[str, str]:
    return (record.text, record.kind)


class _Ordered:
    """The pending gangs in `load`'s order (`_pending_order`), kept sorted by bisection."""

    def __init__(self, pending: Sequence[Workload]) -> None:
        self._keys = [_pending_order(w) for w in pending]
        self._items = list(pending)
        self._tuple: tuple[Workload, ...] | None = tuple(pending)

    def insert(self, workload: Workload) -> None:
        key = _pending_order(workload)
        at = bisect.bisect_right(self._keys, key)
        self._keys.insert(at, key)
        self._items.insert(at, workload)
        self._tuple = None

    def remove(self, workload: Workload) -> None:
        at = bisect.bisect_left(self._keys, _pending_order(workload))
        assert self._items[at] is workload, "a gang the order does not hold"
        del self._keys[at], self._items[at]
        self._tuple = None

    def items(self) -> tuple[Workload, ...]:
        if self._tuple is None:
            self._tuple = tuple(self._items)
        return self._tuple


def _id(item: Cluster | Node) -> str:
    return item.id
