"""Dashboard sessions (`controlplane.service.session_ports.UiSessionRepository`) in SQL."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from adapters.sql.tables import ApiTokenRow, UiSessionRow
from controlplane.service.session_ports import UiSession
from controlplane.service.views import Principal


class SqlUiSessions:
    def __init__(self, session: Session) -> None:
        self.s = session

    def add(self, session: UiSession) -> None:
        self.s.add(
            UiSessionRow(
                id_hash=session.id_hash,
                token_id=session.token_id,
                created_at=session.created_at,
                expires_at=session.expires_at,
            )
        )
        self.s.flush()

    def principal(self, id_hash: str, now: datetime) -> Principal | None:
        # One indexed read joined to the token: a revoked (or deleted) token ends its sessions at once.
        row = self.s.execute(
            select(ApiTokenRow.id, ApiTokenRow.role, ApiTokenRow.team_id)
            .join(UiSessionRow, UiSessionRow.token_id == ApiTokenRow.id)
            .where(UiSessionRow.id_hash == id_hash, UiSessionRow.expires_at > now, ApiTokenRow.revoked_at.is_(None))
        ).first()
        return None if row is None else Principal(row.id, row.role, row.team_id)

    def end(self, id_hash: str) -> None:
        self.s.execute(delete(UiSessionRow).where(UiSessionRow.id_hash == id_hash))

    def end_for_token(self, token_id: str) -> None:
        self.s.execute(delete(UiSessionRow).where(UiSessionRow.token_id == token_id))

    def prune(self, now: datetime, token_id: str, keep: int) -> None:
        self.s.execute(delete(UiSessionRow).where(UiSessionRow.expires_at <= now))
        newest = (
            select(UiSessionRow.id_hash)
            .where(UiSessionRow.token_id == token_id)
            .order_by(UiSessionRow.created_at.desc(), UiSessionRow.id_hash)
            .limit(keep)
        )
        self.s.execute(
            delete(UiSessionRow).where(
                UiSessionRow.token_id == token_id, UiSessionRow.id_hash.not_in(newest.scalar_subquery())
            )
        )
