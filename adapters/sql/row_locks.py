"""The one lock order of every writer of workloads and runs (docs/concepts/reliability-security.md,
"One lock order").

A transaction that writes workloads or runs first locks every workload it will touch (for a run:
the run's workload), all in one pass in id order, and only then writes. A run is written only by
a transaction that holds its workload's lock, so a workload's lock guards its runs too, and two
writers can only ever wait on each other in the order of workload ids: no cycle, no deadlock.

`FOR NO KEY UPDATE` is the lock an UPDATE of non-key columns takes anyway: it does not block the
`FOR KEY SHARE` a foreign key check takes when a run, a pod set or an outbox row is inserted.
`COLLATE "C"` orders by bytes, as Python sorts the ids, so a set locked in chunks is locked in one
order whichever chunk boundaries two writers happen to have. SQLite has one writer at a time
(`BEGIN IMMEDIATE`, adapters/sql/engine.py): nothing to order there.

What a transaction locked (and the workload of each run it looked up) is remembered on its session,
so the writing methods that each lock what they write cost no further statement after a batch
locked it all first. Only locks taken outside a savepoint are remembered: rolling back to a
savepoint releases the locks taken after it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, SessionTransaction

from adapters.sql.tables import RunRow, WorkloadRow

CHUNK = 500  # ids per IN list
_HELD = "gpufleet_row_locks"


@dataclass
class _Held:
    transaction: SessionTransaction | None
    workloads: set[str] = field(default_factory=set)
    owners: dict[str, str] = field(default_factory=dict)  # run id -> its workload's (never changes)


def lock_workloads(session: Session, workload_ids: Collection[str] = (), of_runs: Collection[str] = ()) -> None:
    """Lock these workloads and the workloads of these runs, in the one order (see the module)."""
    if session.get_bind().dialect.name != "postgresql" or not (workload_ids or of_runs):
        return
    session.connection()  # begins the transaction, if the session has not yet: what is held is per transaction
    held: _Held | None = session.info.get(_HELD)
    if held is None or held.transaction is not session.get_transaction():
        held = session.info[_HELD] = _Held(session.get_transaction())
    unknown = sorted(set(of_runs) - held.owners.keys())
    for start in range(0, len(unknown), CHUNK):
        rows = session.execute(
            select(RunRow.id, RunRow.workload_id).where(RunRow.id.in_(unknown[start : start + CHUNK]))
        )
        held.owners.update((run_id, workload_id) for run_id, workload_id in rows)
    wanted = set(workload_ids) | {held.owners[run_id] for run_id in of_runs if run_id in held.owners}
    ordered = sorted(wanted - held.workloads)
    for start in range(0, len(ordered), CHUNK):
        session.execute(
            select(WorkloadRow.id)
            .where(WorkloadRow.id.in_(ordered[start : start + CHUNK]))
            .order_by(WorkloadRow.id.collate("C"))
            .with_for_update(key_share=True)
        )
    if not session.in_nested_transaction():
        held.workloads.update(ordered)
