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

PostgreSQL: per chunk, one UPDATE of the stored rows that differ and one INSERT ... ON CONFLICT DO
NOTHING of the new ones, both reading the records from json_to_recordset(one JSON text)
(executemany would pay one round trip per row, and array parameters are adapted element by
element). Unchanged rows are neither written nor locked. SQLite, in-process: one executemany
of a one-row upsert with the same comparison and the same queued check.
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

# Gangs per statement: bounded statements however deep the backlog.
CHUNK = 50_000

# Two statements, neither of which reads the table it writes: changed rows are updated, new ones
# inserted (a row that exists is left to the first: DO NOTHING takes no lock). One upsert that
# also left out unchanged rows by a join on pending_reasons was planned, once ANALYZE had seen the
# table empty, as a sequential scan of it per record while the insert filled it: 22 s for the
# first 97,522 reasons instead of under 2.
_POSTGRESQL_UPDATE = text(
    "UPDATE pending_reasons AS p SET reason = v.r, kind = v.k, detail = v.d"
    " FROM json_to_recordset(CAST(:rows AS json)) AS v(i text, r text, k text, d json), workloads AS w"
    " WHERE p.workload_id = v.i AND w.id = v.i AND w.state = :queued"
    " AND (p.reason IS DISTINCT FROM v.r OR p.kind IS DISTINCT FROM v.k)"
)
_POSTGRESQL_INSERT = text(
    "INSERT INTO pending_reasons (workload_id, reason, kind, detail)"
    " SELECT v.i, v.r, v.k, v.d"
    " FROM json_to_recordset(CAST(:rows AS json)) AS v(i text, r text, k text, d json)"
    " JOIN workloads AS w ON w.id = v.i AND w.state = :queued"
    " ON CONFLICT (workload_id) DO NOTHING"
)

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
        return sum(_postgresql(session, records[i : i + CHUNK]) for i in range(0, len(records), CHUNK))
    return _sqlite(session, records)


def _postgresql(session: Session, records: Sequence[PendingRecord]) -> int:
    # One JSON text for the whole chunk: psycopg adapts a Python list element by element (about
    # 60 µs a gang for five text[] parameters, 5 s at 90,000), a single string costs nothing. It is
    # built from fragments: look-alike gangs share their reason's text and detail objects, so each
    # is serialised once (an id is not reused while `records` holds them).
    dumped: dict[int, str] = {}

    def dump(value: object) -> str:
        found = dumped.get(id(value))
        if found is None:
            found = dumped[id(value)] = json.dumps(value)
        return found

    rows = ",".join(
        f'{{"i":{json.dumps(r.workload_id)},"r":{dump(r.text)},"k":{dump(r.kind)},"d":{dump(r.detail)}}}'
        for r in records
    )
    parameters = {"rows": f"[{rows}]", "queued": WorkloadState.QUEUED.value}
    updated = session.execute(_POSTGRESQL_UPDATE, parameters)
    inserted = session.execute(_POSTGRESQL_INSERT, parameters)
    return int(updated.rowcount or 0) + int(inserted.rowcount or 0)  # type: ignore[attr-defined]


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
