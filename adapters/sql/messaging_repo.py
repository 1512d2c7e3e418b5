"""Outbox, inbox, leader lease, API tokens, cluster credentials and the audit log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Result, Select, case, delete, func, insert, literal, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from adapters.sql.insert_or_skip import insert_or_skip
from adapters.sql.tables import (
    ApiTokenRow,
    AuditRow,
    ClusterCredentialRow,
    ClusterRow,
    InboxRow,
    LeaderLeaseRow,
    OutboxRow,
)
from controlplane.service.messaging_ports import OutboxEvent
from controlplane.service.views import ClusterCredential, TokenView

# A lease released or expired by hand: its epoch is kept, so the next term's still rises.
_EXPIRED = datetime(1970, 1, 1, tzinfo=UTC)

# Rows that can be revoked: API tokens and cluster credentials (a NATS user may be either).
_Revocable = type[ApiTokenRow] | type[ClusterCredentialRow]


def _rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE touched (the generic Result type does not declare rowcount)."""
    return int(result.rowcount)  # type: ignore[attr-defined]


def _unrevoked_ids(session: Session, row: _Revocable, *where: ColumnElement[bool]) -> list[str]:
    return list(session.scalars(select(row.id).where(*where, row.revoked_at.is_(None))))


def _revoke(session: Session, row: _Revocable, now: datetime, *where: ColumnElement[bool]) -> None:
    session.execute(update(row).where(*where).values(revoked_at=now).execution_options(synchronize_session=False))


class SqlOutbox:
    def __init__(self, session: Session) -> None:
        self.s = session

    def add(self, subject: str, event_id: str, payload: str, now: datetime) -> None:
        self.s.add(OutboxRow(id=event_id, subject=subject, payload=payload, created_at=now, attempts=0))

    def add_many(self, events: Sequence[tuple[str, str, str]], now: datetime) -> None:
        if not events:
            return
        self.s.flush()  # events `add`ed before these keep their place in the outbox's order
        self.s.execute(
            insert(OutboxRow.__table__),  # type: ignore[arg-type]
            [
                {"id": event_id, "subject": subject, "payload": payload, "created_at": now, "attempts": 0}
                for subject, event_id, payload in events
            ],
        )

    def unpublished(self, limit: int) -> list[tuple[str, str, str]]:
        rows = self.s.execute(
            select(OutboxRow.id, OutboxRow.subject, OutboxRow.payload)
            .where(OutboxRow.published_at.is_(None))
            .order_by(OutboxRow.seq)
            .limit(limit)
        )
        return list(rows)

    def oldest_unpublished(self) -> datetime | None:
        return self.s.scalar(
            select(OutboxRow.created_at).where(OutboxRow.published_at.is_(None)).order_by(OutboxRow.seq).limit(1)
        )

    def mark_published(self, event_ids: Sequence[str], now: datetime) -> None:
        self.s.execute(
            update(OutboxRow)
            .where(OutboxRow.id.in_(list(event_ids)))
            .values(published_at=now, attempts=OutboxRow.attempts + 1)
            .execution_options(synchronize_session=False)
        )

    def record_failure(self, event_id: str, error: str) -> None:
        self.s.execute(
            update(OutboxRow)
            .where(OutboxRow.id == event_id)
            .values(attempts=OutboxRow.attempts + 1, last_error=error[:2000])
            .execution_options(synchronize_session=False)
        )

    def mark_dead_lettered(self, event_id: str, reason: str, now: datetime) -> None:
        self.s.execute(
            update(OutboxRow)
            .where(OutboxRow.id == event_id)
            .values(published_at=now, attempts=OutboxRow.attempts + 1, last_error=f"dead-lettered: {reason}"[:2000])
            .execution_options(synchronize_session=False)
        )

    def prune(self, published_before: datetime) -> int:
        return _rowcount(self.s.execute(delete(OutboxRow).where(OutboxRow.published_at < published_before)))

    def recent(self, subject_prefixes: Sequence[str], after_seq: int, limit: int) -> list[OutboxEvent]:
        if not subject_prefixes or limit <= 0:
            return []
        # autoescape: a `_` or `%` in a team or cluster name is matched as itself, not as a wildcard
        matches = or_(*(OutboxRow.subject.startswith(prefix, autoescape=True) for prefix in subject_prefixes))
        rows = self.s.execute(
            select(OutboxRow.seq, OutboxRow.subject, OutboxRow.payload, OutboxRow.created_at)
            .where(matches, OutboxRow.seq > after_seq)
            .order_by(OutboxRow.seq.desc())
            .limit(limit)
        )
        return [OutboxEvent(int(seq), subject, payload, created_at) for seq, subject, payload, created_at in rows]


class SqlInbox:
    def __init__(self, session: Session) -> None:
        self.s = session

    def first_time(self, consumer: str, msg_id: str, now: datetime) -> bool:
        # One statement: a row already there (a redelivery, or a concurrent consumer's) is skipped,
        # not an error, so no savepoint is needed around it.
        statement = insert_or_skip(self.s, InboxRow.__table__, ("consumer", "msg_id")).returning(InboxRow.msg_id)
        inserted = self.s.execute(statement, {"consumer": consumer, "msg_id": msg_id, "processed_at": now})
        return inserted.first() is not None

    def first_times(self, consumer: str, msg_ids: Sequence[str], now: datetime) -> set[str]:
        if not msg_ids:
            return set()
        statement = insert_or_skip(self.s, InboxRow.__table__, ("consumer", "msg_id")).returning(InboxRow.msg_id)
        rows = [{"consumer": consumer, "msg_id": msg_id, "processed_at": now} for msg_id in msg_ids]
        return set(self.s.scalars(statement, rows))

    def prune(self, processed_before: datetime) -> int:
        return _rowcount(self.s.execute(delete(InboxRow).where(InboxRow.processed_at < processed_before)))


class SqlLeases:
    def __init__(self, session: Session) -> None:
        self.s = session

    def acquire(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> int | None:
        row = self.s.scalars(select(LeaderLeaseRow).where(LeaderLeaseRow.name == name).with_for_update()).first()
        expires = now + timedelta(seconds=ttl_seconds)
        if row is None:
            try:
                with self.s.begin_nested():
                    self.s.add(LeaderLeaseRow(name=name, holder=holder, epoch=1, expires_at=expires))
                    self.s.flush()
            except IntegrityError:
                return None
            return 1
        if row.holder == holder and row.expires_at > now:
            row.expires_at = expires
            return row.epoch
        if row.expires_at > now:
            return None
        row.holder, row.epoch, row.expires_at = holder, row.epoch + 1, expires
        self.s.flush()
        return row.epoch

    def renew(self, name: str, holder: str, epoch: int, now: datetime, ttl_seconds: float) -> bool:
        # Never moves the expiry back: a cycle renews with the time its decision was taken, which
        # can be older than the background renewal that ran while the cycle worked.
        expires = now + timedelta(seconds=ttl_seconds)
        later = literal(expires, type_=LeaderLeaseRow.__table__.c.expires_at.type)
        result = self.s.execute(
            update(LeaderLeaseRow)
            .where(LeaderLeaseRow.name == name, LeaderLeaseRow.holder == holder, LeaderLeaseRow.epoch == epoch)
            .values(expires_at=case((LeaderLeaseRow.expires_at < expires, later), else_=LeaderLeaseRow.expires_at))
            .execution_options(synchronize_session=False)
        )
        return bool(_rowcount(result))

    def release(self, name: str, holder: str, epoch: int) -> None:
        # Expire rather than delete: the epoch must keep rising across terms.
        self.s.execute(
            update(LeaderLeaseRow)
            .where(LeaderLeaseRow.name == name, LeaderLeaseRow.holder == holder, LeaderLeaseRow.epoch == epoch)
            .values(expires_at=_EXPIRED)
            .execution_options(synchronize_session=False)
        )

    def expire_all(self) -> int:
        """End every term at once (epochs are kept, so they keep rising); returns how many."""
        return _rowcount(
            self.s.execute(
                update(LeaderLeaseRow).values(expires_at=_EXPIRED).execution_options(synchronize_session=False)
            )
        )

    def expires_at(self, name: str) -> datetime | None:
        """When the named lease runs out (None: never taken); readiness reads it."""
        return self.s.scalar(select(LeaderLeaseRow.expires_at).where(LeaderLeaseRow.name == name))


class SqlTokens:
    def __init__(self, session: Session) -> None:
        self.s = session

    @staticmethod
    def _view(row: ApiTokenRow) -> TokenView:
        return TokenView(row.id, row.name, row.role, row.team_id, row.created_at, row.revoked_at)

    def add(self, view: TokenView, token_hash: str) -> None:
        self.s.add(
            ApiTokenRow(
                id=view.id,
                name=view.name,
                role=view.role,
                team_id=view.team_id,
                token_hash=token_hash,
                created_at=view.created_at,
            )
        )
        self.s.flush()

    def by_hash(self, token_hash: str) -> TokenView | None:
        row = self.s.scalars(select(ApiTokenRow).where(ApiTokenRow.token_hash == token_hash)).first()
        return self._view(row) if row else None

    def get(self, token_id: str) -> TokenView | None:
        row = self.s.get(ApiTokenRow, token_id)
        return self._view(row) if row else None

    def list(self, team_id: str | None) -> list[TokenView]:
        query = select(ApiTokenRow).order_by(ApiTokenRow.created_at)
        if team_id:
            query = query.where(ApiTokenRow.team_id == team_id)
        return [self._view(r) for r in self.s.scalars(query)]

    def revoke(self, token_id: str, now: datetime) -> None:
        _revoke(self.s, ApiTokenRow, now, ApiTokenRow.id == token_id, ApiTokenRow.revoked_at.is_(None))

    def count_admin(self) -> int:
        return int(
            self.s.scalar(select(func.count()).where(ApiTokenRow.role == "admin", ApiTokenRow.revoked_at.is_(None)))
            or 0
        )


class SqlAudit:
    def __init__(self, session: Session) -> None:
        self.s = session

    def record(
        self, actor: str, action: str, object_type: str, object_id: str, detail: Mapping[str, Any], now: datetime
    ) -> None:
        self.s.add(
            AuditRow(
                at=now, actor=actor, action=action, object_type=object_type, object_id=object_id, detail=dict(detail)
            )
        )


def _credentials() -> Select[str, str, datetime, datetime | None]:
    """Cluster credentials with their cluster's name, in the order `ClusterCredential` takes them."""
    return select(
        ClusterCredentialRow.id,
        ClusterRow.name,
        ClusterCredentialRow.created_at,
        ClusterCredentialRow.revoked_at,
    ).join(ClusterRow, ClusterRow.id == ClusterCredentialRow.cluster_id)


class SqlClusterCredentials:
    def __init__(self, session: Session) -> None:
        self.s = session

    def add(self, credential_id: str, cluster_id: str, secret_hash: str, now: datetime) -> None:
        self.s.add(
            ClusterCredentialRow(id=credential_id, cluster_id=cluster_id, secret_hash=secret_hash, created_at=now)
        )
        self.s.flush()

    def by_hash(self, secret_hash: str) -> ClusterCredential | None:
        row = self.s.execute(_credentials().where(ClusterCredentialRow.secret_hash == secret_hash)).first()
        return ClusterCredential(*row) if row else None

    def for_cluster(self, cluster_id: str) -> list[ClusterCredential]:
        rows = self.s.execute(
            _credentials()
            .where(ClusterCredentialRow.cluster_id == cluster_id)
            .order_by(ClusterCredentialRow.created_at)
        ).all()
        return [ClusterCredential(*row) for row in rows]

    def revoke_all(self, cluster_id: str, now: datetime) -> list[str]:
        ids = _unrevoked_ids(self.s, ClusterCredentialRow, ClusterCredentialRow.cluster_id == cluster_id)
        if ids:
            _revoke(self.s, ClusterCredentialRow, now, ClusterCredentialRow.id.in_(ids))
        return ids

    def still_valid(self, credential_ids: Sequence[str]) -> set[str]:
        """Which of these credentials (cluster credentials or API tokens) exist and are not revoked."""
        ids = list(credential_ids)
        valid: set[str] = set()
        for row in (ClusterCredentialRow, ApiTokenRow):
            valid.update(_unrevoked_ids(self.s, row, row.id.in_(ids)))
        return valid
