"""Reading what changed in the scheduling snapshot since a cursor (the change log of migration 0009).

Triggers log every write that changes what `SqlSnapshotReader.load` returns in `snapshot_changes`:
(seq, entity, key, txid). The scheme a reader follows so that no change is ever lost:

SQLite. Every transaction begins IMMEDIATE (adapters/sql/engine.py): writers and this reader are
serialised, so `seq` (autoincrement, taken under the write lock) grows in commit order. The cursor
is the highest `seq` read; the next read takes `seq > cursor`.

PostgreSQL. `seq` comes from a sequence and is taken when the row is written, not when its
transaction commits: transaction A may take seq 10, B seq 11, B commit, a reader see 11 but not 10,
then A commit. A reader that went on from "seq > 11" would never see A's change. So the cursor is
not a seq but the read's own snapshot: each read, in one REPEATABLE READ snapshot, also notes that
snapshot's xmax (the first transaction id not yet assigned when it was taken) and its xip list (the
transactions in flight then). A row is visible to a snapshot exactly when its writer committed,
its id is below xmax and not in the xip list; the trigger stores its writer's top-level id
(`pg_current_xact_id()`, the xid8, 64 bits so it never wraps) in `txid`. So the next read takes
`txid >= previous xmax or txid in previous xip`: every change the previous read could not see and
none that it saw. (An earlier cursor took `txid >= previous xmin` and re-read the overlap; but the
horizon is cluster-wide, so one long transaction in any database of the server widened every
re-read, and a priority-class change inside that overlap rebuilt the cache at every refresh.)
Read-only transactions have no xid and never appear in either.

Pruning only removes rows below the pruning reader's own horizon (or seq) and older than a
retention (an hour, see SnapshotCache): another reader (a new leader) begins with a full load, and
a cache whose cursor is older than the retention rebuilds instead of reading the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, func, not_, or_, select, text

from adapters.sql.snapshot_repo import SqlSnapshotReader
from adapters.sql.tables import IdleFindingRow, RunRow, SnapshotChangeRow, WorkloadRow
from controlplane.core.history import UsageInterval
from controlplane.service.snapshot_ports import ChangeCursor, OwnChanges, SnapshotChanges

# The reader's snapshot: its xmin, xmax and in-flight transactions (ids as bigint: the xid8 of
# the triggers' `pg_current_xact_id()`, which never wraps).
_SNAPSHOT = text(
    "SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint,"
    " array(SELECT x::text::bigint FROM pg_snapshot_xip(s) AS x)"
    " FROM pg_current_snapshot() AS s"
)
# Up to this many changed keys are bound as a list (the indexes on ids are used); more (a burst of
# submits, a restart's first refresh) are selected from the log in the query itself (one scan),
# which also keeps under SQLite's limit of bound parameters.
_LISTED_KEYS = 900


def _keys(keys: frozenset[str], entity: str, after: ColumnElement[bool]) -> Any:
    if len(keys) <= _LISTED_KEYS:
        return sorted(keys)
    return select(SnapshotChangeRow.key).where(SnapshotChangeRow.entity == entity, after)


class SqlSnapshotChanges(SqlSnapshotReader):
    """The snapshot reader, with the change log: `load` then `change_cursor`, later `changes_since`."""

    def _postgresql(self) -> bool:
        return self.s.get_bind().dialect.name == "postgresql"

    def change_cursor(self) -> ChangeCursor:
        seq = int(self.s.scalar(select(func.coalesce(func.max(SnapshotChangeRow.seq), 0))) or 0)
        if not self._postgresql():
            return ChangeCursor(seq)
        xmin, xmax, in_flight = self.s.execute(_SNAPSHOT).one()
        return ChangeCursor(seq, int(xmin), int(xmax), frozenset(int(x) for x in in_flight))

    def latest_change(self) -> int:
        """The highest `seq` logged (one look-up at the end of the primary key's index)."""
        return int(self.s.scalar(select(func.coalesce(func.max(SnapshotChangeRow.seq), 0))) or 0)

    def own_changes(self, seq_before: int) -> OwnChanges:
        if self._postgresql():
            # The top-level transaction id, as the triggers store it; None when it wrote nothing.
            txid = self.s.scalar(text("SELECT pg_current_xact_id_if_assigned()::text::bigint"))
            return OwnChanges(txid=None if txid is None else int(txid))
        # Every transaction begins IMMEDIATE: nobody else logged a change since `seq_before`.
        return OwnChanges(seqs=(seq_before, self.latest_change()))

    def changed_besides(self, seq: int, own: Sequence[OwnChanges]) -> bool:
        # Scans only what was logged past `seq`: at most one cycle's own changes and what came after.
        others: list[ColumnElement[bool]] = [SnapshotChangeRow.seq > seq]
        txids = [mark.txid for mark in own if mark.txid is not None]
        if txids:
            others.append(SnapshotChangeRow.txid.not_in(txids))
        for mark in own:
            if mark.seqs is not None and mark.seqs[1] > mark.seqs[0]:
                others.append(not_(SnapshotChangeRow.seq.between(mark.seqs[0] + 1, mark.seqs[1])))
        return bool(self.s.scalar(select(exists().where(*others))))

    def _after(self, cursor: ChangeCursor) -> ColumnElement[bool]:
        if self._postgresql():
            assert cursor.unseen_from is not None, "a PostgreSQL cursor holds its read's snapshot"
            unseen = SnapshotChangeRow.txid >= cursor.unseen_from
            if not cursor.in_flight:
                return unseen
            return or_(unseen, SnapshotChangeRow.txid.in_(sorted(cursor.in_flight)))
        return SnapshotChangeRow.seq > cursor.seq

    def changes_since(
        self, cursor: ChangeCursor, history_since: datetime | None = None, last_rebalance: bool = False
    ) -> SnapshotChanges:
        self._repeatable_read()
        after = self._after(cursor)
        now_at = self.change_cursor()  # the same snapshot as every read below
        touched: dict[str, set[str]] = {}
        for entity, key in self.s.execute(
            select(SnapshotChangeRow.entity, SnapshotChangeRow.key).where(after).distinct()
        ):
            touched.setdefault(entity, set()).add(key)
        if "class" in touched:  # a class's preemptibility reaches every gang and run: the cache rebuilds
            return SnapshotChanges(now_at, classes_changed=True)
        workload_ids = frozenset(touched.get("workload", ()))
        run_ids = frozenset(touched.get("run", ()))
        changed_workloads = _keys(workload_ids, "workload", after)
        changed_runs = _keys(run_ids, "run", after)
        # The runs whose values may differ: those changed and those of changed workloads (a run
        # carries its workload's queue, priority and class).
        runs_touched = or_(RunRow.id.in_(changed_runs), RunRow.workload_id.in_(changed_workloads))
        pending: tuple[Any, ...] = ()
        live: tuple[Any, ...] = ()
        if workload_ids or run_ids:
            classes = self._classes()
            if workload_ids:
                pending = self._pending(classes, WorkloadRow.id.in_(changed_workloads))
                pending = self._without_evictions_after_idle_reclaim(pending, RunRow.workload_id.in_(changed_workloads))
            live = self._live(classes, runs_touched)
            live = self._with_idle_marks(live, IdleFindingRow.run_id.in_(select(RunRow.id).where(runs_touched)))
        fleet = self._fleet() if "fleet" in touched else None
        usage: dict[str, UsageInterval | None] = {}
        usage_complete = False
        if history_since is not None and (fleet is not None or workload_ids or run_ids):
            clusters, nodes = fleet or self._fleet()
            pools = {pool.id: pool for cluster in clusters for pool in cluster.pools}
            if fleet is not None:  # every run's GPU equivalents depend on the pools: the whole window
                usage, usage_complete = self._usage_of_runs(history_since, nodes, pools), True
            else:
                usage = dict.fromkeys(run_ids, None)  # a run no longer in the window
                usage.update(self._usage_of_runs(history_since, nodes, pools, runs_touched))
        rebalance_read = last_rebalance and bool(workload_ids or run_ids)
        return SnapshotChanges(
            cursor=now_at,
            workload_ids=workload_ids,
            run_ids=run_ids,
            pending=pending,
            live_runs=live,
            clusters=None if fleet is None else fleet[0],
            nodes=None if fleet is None else fleet[1],
            queue_tree=self._queue_tree() if "tree" in touched else None,
            usage=usage,
            usage_complete=usage_complete,
            last_rebalance_at=self._last_rebalance_at() if rebalance_read else None,
            last_rebalance_read=rebalance_read,
        )

    def usage_by_run(self, since: datetime) -> dict[str, UsageInterval | None]:
        clusters, nodes = self._fleet()
        return self._usage_of_runs(since, nodes, {pool.id: pool for cluster in clusters for pool in cluster.pools})

    def prune_changes(self, cursor: ChangeCursor, before: datetime) -> int:
        read = SnapshotChangeRow.seq <= cursor.seq
        if self._postgresql():
            assert cursor.horizon is not None
            read = SnapshotChangeRow.txid < cursor.horizon
        result = self.s.execute(delete(SnapshotChangeRow).where(read, SnapshotChangeRow.at < before))
        return int(result.rowcount or 0)  # type: ignore[attr-defined]
