"""API tokens: random, shown once, stored only as a SHA-256 hash."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from controlplane.service.commands import TokenSpec
from controlplane.service.errors import Invalid, NotFound
from controlplane.service.ids import new_id
from controlplane.service.ports import UnitOfWork
from controlplane.service.views import Principal, TokenView

TOKEN_PREFIX = "gpf_"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def authenticate(uow: UnitOfWork, raw: str) -> Principal | None:
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    with uow:
        token = uow.tokens.by_hash(hash_token(raw))
    if token is None or token.revoked_at is not None:
        return None
    return Principal(token.id, token.role, token.team_id)


def issue_token(uow: UnitOfWork, spec: TokenSpec, actor: str, now: datetime) -> tuple[TokenView, str]:
    """Returns the token record and the raw secret, which is never stored or shown again."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with uow:
        team_id = None
        if spec.team:
            team = uow.admin.get_tree_node("team", spec.team)
            if team is None:
                raise Invalid(f"unknown team {spec.team!r}")
            team_id = team.id
        view = TokenView(new_id("tok"), spec.name, spec.role, team_id, now, None)
        uow.tokens.add(view, hash_token(raw))
        uow.audit.record(
            actor, "token.issue", "token", view.id, {"name": spec.name, "role": spec.role, "team": spec.team}, now
        )
        uow.commit()
    return view, raw


def ensure_admin_token(uow: UnitOfWork, now: datetime) -> str | None:
    """Issue the first admin token of a fresh installation; None when one already exists."""
    with uow:
        if uow.tokens.count_admin() > 0:
            return None
    return issue_token(uow, TokenSpec(name="bootstrap-admin", role="admin"), "bootstrap", now)[1]


def list_tokens(uow: UnitOfWork, team: str | None) -> list[TokenView]:
    with uow:
        team_id = None
        if team:
            node = uow.admin.get_tree_node("team", team)
            if node is None:
                raise NotFound(f"no team {team}")
            team_id = node.id
        return uow.tokens.list(team_id)


def revoke_token(uow: UnitOfWork, token_id: str, actor: str, now: datetime) -> None:
    with uow:
        if uow.tokens.get(token_id) is None:
            raise NotFound(f"no token {token_id}")
        uow.tokens.revoke(token_id, now)
        uow.audit.record(actor, "token.revoke", "token", token_id, {}, now)
        uow.commit()
