"""Writing the scheduler's pending reasons: set-based, only where they changed, into a narrow table.

A cycle on a deep backlog decides a reason for every waiting gang (about 97,000 at 100,000
queued). They go to `pending_reasons` (workload id, reason, kind, detail; migration 0014), not to
the wide `workloads` rows: an UPDATE there is not HOT (it rewrites every one of the table's
indexes), 2 to 4 s of a fresh backlog's first cycle on PostgreSQL; an upsert of the narrow rows is a
fraction of that. `workloads.reason` keeps the text of the last transition, and readers show the
pending row only while the workload is queued (every change of state deletes it:
adapters/sql/workload_repo.py).

The database itself compares the reasons with what is stored (`IS DISTINCT FROM` on reason and
kind): an unchanged row is not written, so a restarted leader whose decision matches its
predecessor's writes only the differences, without first reading 100,000 stored reasons back
into Python. Only queued workloads get a row (one cancelled or admitted since the snapshot keeps
its own reason). A cancel racing this write (it commits while the statement runs) may leave a row
behind for its now cancelled workload: a finished workload is never queued again, so no reader
shows it.

PostgreSQL: the records are streamed with COPY into a temporary table of the session
(`pending_reasons_batch`, created once per connection, emptied at every commit), then one UPDATE of
the stored rows that differ and one INSERT ... ON CONFLICT DO NOTHING of the new ones read it.
COPY costs about 0.5 µs a record; the JSON text this replaced cost twice that to build and, parsed
by `json_to_recordset` in each of the two statements, 0.4 s per statement at 97,000 records (a
fresh backlog's first cycle wrote its reasons in 2.7 s, now in about 0.6 s: the inserts; the
table's foreign key, which looked up each row's workload a second time, went in migration 0015).
Unchanged rows are neither written nor locked. SQLite, in-process: one executemany of a one-row
upsert with the same comparison and the same queued check.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.orm import Session

from adapters.sql.tables import PendingReasonRow
from controlplane.domain.model import WorkloadState
from controlplane.service.ports import PendingRecord

# The session's batch table: temporary (never logged, private to the connection), emptied by every
# commit, so a pooled connection reuses it and a rolled-back cycle leaves nothing in it.
_BATCH_TABLE = text(
    "CREATE TEMPORARY TABLE IF NOT EXISTS pending_reasons_batch"
    " (workload_id text, reason text, kind text, detail json) ON COMMIT DELETE ROWS"
)
_COPY_BATCH = "COPY pending_reasons_batch (workload_id, reason, kind, detail) FROM STDIN"
# Two statements, neither of which reads the table it writes: changed rows are updated, new ones
# inserted (a row that exists is left to the first: DO NOTHING takes no lock). One upsert that
# also left out unchanged rows by a join on pending_reasons was planned, once ANALYZE had seen the
# table empty, as a sequential scan of it per record while the insert filled it: 22 s for the
# first 97,522 reasons instead of under 2.
_POSTGRESQL_UPDATE = text(
    "UPDATE pending_reasons AS p SET reason = v.reason, kind = v.kind, detail = v.detail"
    " FROM pending_reasons_batch AS v, workloads AS w"
    " WHERE p.workload_id = v.workload_id AND w.id = v.workload_id AND w.state = :queued"
    " AND (p.reason IS DISTINCT FROM v.reason OR p.kind IS DISTINCT FROM v.kind)"
)
_POSTGRESQL_INSERT = text(
    "INSERT INTO pending_reasons (workload_id, reason, kind, detail)"
    " SELECT v.workload_id, v.reason, v.kind, v.detail FROM pending_reasons_batch AS v"
    " JOIN workloads AS w ON w.id = v.workload_id AND w.state = :queued"
    " ON CONFLICT (workload_id) DO NOTHING"
)
_EMPTY_BATCH = text("TRUNCATE pending_reasons_batch")

# `WHERE EXISTS` also settles SQLite's parsing ambiguity of INSERT ... SELECT ... ON CONFLICT.
_SQLITE = text(
    "INSERT INTO pending_reasons (workload_id, reason, kind, detail)"
    " SELECT :wid, :reason, :rkind, :detail"
    " WHERE EXISTS (SELECT 1 FROM workloads WHERE id = :wid AND state = :queued)"
    " ON CONFLICT (workload_id) DO UPDATE SET reason = excluded.reason, kind = excluded.kind, detail = excluded.detail"
    " WHERE pending_reasons.reason IS NOT excluded.reason OR pending_reasons.kind IS NOT excluded.kind"
).bindparams(bindparam("detail", type_=PendingReasonRow.__table__.c.detail.type))


def write_pending(session: Session, records: Sequence[PendingRecord]) -> int:
    """Store each record's reason where it differs from the stored one (only for workloads still
    queued); returns how many rows were written."""
    if not records:
        return 0
    if session.get_bind().dialect.name == "postgresql":
        return _postgresql(session, records)
    return _sqlite(session, records)


def _postgresql(session: Session, records: Sequence[PendingRecord]) -> int:
    connection = session.connection()
    connection.execute(_BATCH_TABLE)
    driver = connection.connection.driver_connection
    assert driver is not None
    # Look-alike gangs share their reason's detail object: each is serialised once (an id is not
    # reused while `records` holds them).
    dumped: dict[int, str] = {}
    with driver.cursor() as cursor, cursor.copy(_COPY_BATCH) as copy:
        for r in records:
            found = dumped.get(id(r.detail))
            if found is None:
                found = dumped[id(r.detail)] = json.dumps(r.detail)
            copy.write_row((r.workload_id, r.text, r.kind, found))
    parameters = {"queued": WorkloadState.QUEUED.value}
    updated = connection.execute(_POSTGRESQL_UPDATE, parameters)
    inserted = connection.execute(_POSTGRESQL_INSERT, parameters)
    # Emptied now too, not only at commit: a second write in the same transaction starts empty.
    connection.execute(_EMPTY_BATCH)
    return int(updated.rowcount or 0) + int(inserted.rowcount or 0)


def _sqlite(session: Session, records: Sequence[PendingRecord]) -> int:
    queued = WorkloadState.QUEUED.value
    result = session.connection().execute(_SQLITE, [_parameters(r, queued) for r in records])
    return int(result.rowcount or 0)


def _parameters(record: PendingRecord, queued: str) -> dict[str, Any]:
    return {
        "wid": record.workload_id,
        "reason": record.text,
        "rkind": record.kind,
        "detail": dict(record.detail),
        "queued": queued,
    }
