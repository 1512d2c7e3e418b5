"""Dashboard sessions as SQL keeps them (adapters/sql/session_repo.py); see `ui_sessions.py`.

A leaf module of the ports: `ports.py` re-exports its names.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from controlplane.service.views import Principal


@dataclass(frozen=True)
class UiSession:
    """A session: the hash of its secret (never the secret), its token, and when it ends."""

    id_hash: str
    token_id: str
    created_at: datetime
    expires_at: datetime


class UiSessionRepository(Protocol):
    def add(self, session: UiSession) -> None: ...
    def principal(self, id_hash: str, now: datetime) -> Principal | None:
        """The token of the live session `id_hash`: not expired, its token there and not revoked."""
        ...

    def end(self, id_hash: str) -> None: ...
    def end_for_token(self, token_id: str) -> None: ...
    def prune(self, now: datetime, token_id: str, keep: int) -> None:
        """Delete every expired session, and all but the newest `keep` of `token_id`'s."""
        ...
