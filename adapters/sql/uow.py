"""The SQL unit of work: one transaction; nested `with` blocks become savepoints."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Self

from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from adapters.sql.admin_repo import SqlAdminRepository
from adapters.sql.audit_repo import SqlAuditRepository
from adapters.sql.cloud_repo import SqlCloudRepository
from adapters.sql.idle_repo import SqlIdleRepository
from adapters.sql.messaging_repo import SqlAudit, SqlClusterCredentials, SqlInbox, SqlLeases, SqlOutbox, SqlTokens
from adapters.sql.report_repo import SqlReportRepository
from adapters.sql.run_repo import SqlRunRepository
from adapters.sql.serving_repo import SqlServingRepository
from adapters.sql.session_repo import SqlUiSessions
from adapters.sql.snapshot_changes import SqlSnapshotChanges
from adapters.sql.telemetry_repo import SqlTelemetryRepository
from adapters.sql.workload_repo import SqlWorkloadRepository
from controlplane.service.errors import StoreUnavailable, TransactionConflict

# What the drivers raise when the database is down, restarting, unreachable or (SQLite) locked:
# the request itself is fine and may be retried.
UNAVAILABLE = (OperationalError, InterfaceError)
# PostgreSQL's SQLSTATEs for a transaction it aborted to settle a conflict (psycopg raises them as
# OperationalError too): the same transaction run again is expected to succeed.
CONFLICTS = {"40P01": "deadlock", "40001": "serialization"}


class SqlUnitOfWork:
    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self._factory = session_factory
        self._session: Session | None = None
        self._levels: list[tuple[SessionTransaction | None, bool]] = []

    @property
    def session(self) -> Session:
        assert self._session is not None, "use the unit of work inside a `with` block"
        return self._session

    def __enter__(self) -> Self:
        if self._session is None:
            self._session = self._factory()
            self._levels.append((None, False))
            s = self._session
            self.admin = SqlAdminRepository(s)
            self.workloads = SqlWorkloadRepository(s)
            self.runs = SqlRunRepository(s)
            self.outbox = SqlOutbox(s)
            self.inbox = SqlInbox(s)
            self.leases = SqlLeases(s)
            self.tokens = SqlTokens(s)
            self.cluster_credentials = SqlClusterCredentials(s)
            self.audit = SqlAudit(s)
            self.snapshots = SqlSnapshotChanges(s)
            self.telemetry = SqlTelemetryRepository(s)
            self.idle = SqlIdleRepository(s)
            self.cloud = SqlCloudRepository(s)
            self.reports = SqlReportRepository(s)
            self.audit_facts = SqlAuditRepository(s)
            self.serving = SqlServingRepository(s)
            self.ui_sessions = SqlUiSessions(s)
        else:
            self._levels.append((self._session.begin_nested(), False))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        savepoint, committed = self._levels.pop()
        if savepoint is None:
            try:
                if not committed:
                    self.session.rollback()
            except UNAVAILABLE:
                if exc is None:
                    raise StoreUnavailable("the database is unavailable") from None
            finally:
                with contextlib.suppress(*UNAVAILABLE):  # the connection is gone; the pool discards it
                    self.session.close()
                self._session = None
            if isinstance(exc, UNAVAILABLE):
                cause = CONFLICTS.get(str(getattr(exc.orig, "sqlstate", "")))
                if cause is not None:
                    raise TransactionConflict(cause, f"the database aborted the transaction: {cause}") from exc
                raise StoreUnavailable(f"the database is unavailable: {type(exc.orig or exc).__name__}") from exc
            return
        if savepoint.is_active:
            if committed and exc_type is None:
                savepoint.commit()
            else:
                savepoint.rollback()

    def commit(self) -> None:
        savepoint, _ = self._levels[-1]
        if savepoint is None:
            self.session.commit()
        self._levels[-1] = (savepoint, True)
