"""Dashboard sessions: what the login form hands a browser instead of the API token.

The cookie holds a random session secret (256 bits); SQL keeps only its SHA-256 hash, the token
it was opened with and when it expires. A session is good while it has not expired, its token is
not revoked and the token still exists (deleting a team deletes its tokens, and their sessions
with them); the check joins the session to its token on every request, so a revocation ends the
sessions at once, and logging out deletes the row. The token itself never reaches the browser
again after the form posts it, so a cookie lifted from a browser is worth at most one session.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from controlplane.service.auth import authenticate
from controlplane.service.ports import UnitOfWork
from controlplane.service.session_ports import UiSession
from controlplane.service.views import Principal

SESSION_PREFIX = "gps_"
# The live sessions one token may hold: a login beyond it ends that token's oldest session, so a
# script that logs in in a loop cannot grow the table without bound.
MAX_SESSIONS_PER_TOKEN = 20
MAX_SESSION_CHARS = 100


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def open_session(uow: UnitOfWork, token: str, now: datetime, ttl: timedelta) -> tuple[str, Principal] | None:
    """A new session for the API token `token` (admin or team), or None when it is not one.
    Returns the session secret (for the cookie; never stored) and the principal."""
    found = authenticate(uow, token)
    if found is None:
        return None
    secret = SESSION_PREFIX + secrets.token_urlsafe(32)
    with uow:
        uow.ui_sessions.add(UiSession(_hash(secret), found.token_id, now, now + ttl))
        uow.ui_sessions.prune(now, found.token_id, MAX_SESSIONS_PER_TOKEN)
        uow.commit()
    return secret, found


def session_principal(uow: UnitOfWork, secret: str, now: datetime) -> Principal | None:
    """Whose live session `secret` is, or None (unknown, expired, logged out, token revoked)."""
    if not secret.startswith(SESSION_PREFIX) or len(secret) > MAX_SESSION_CHARS:
        return None
    with uow:
        return uow.ui_sessions.principal(_hash(secret), now)


def close_session(uow: UnitOfWork, secret: str) -> None:
    if not secret.startswith(SESSION_PREFIX) or len(secret) > MAX_SESSION_CHARS:
        return
    with uow:
        uow.ui_sessions.end(_hash(secret))
        uow.commit()
