"""API tokens: random, shown once, stored only as a SHA-256 hash.

Three roles: `admin` (everything), `team` (its own team's queues and workloads) and `metrics`
(reads `/metrics` and nothing else: the token a Prometheus holds, so a scrape config never carries
a credential that can change the fleet). `authenticate` knows only the first two, so a metrics
token is refused by the REST API, the dashboard and NATS alike; `scrape_access` admits it.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from controlplane.service.auth_limits import FailedAuthLimiter, TooManyFailures
from controlplane.service.commands import TokenSpec
from controlplane.service.errors import UNKNOWN_TOKEN, NotFound
from controlplane.service.ids import new_id
from controlplane.service.ports import UnitOfWork
from controlplane.service.views import Principal, TokenView

TOKEN_PREFIX = "gpf_"
API_ROLES = frozenset({"admin", "team"})
SCRAPE_ROLES = frozenset({"admin", "metrics"})


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def lookup_token(uow: UnitOfWork, raw: str) -> Principal | None:
    """The live (not revoked) token `raw` of any role, or None."""
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    with uow:
        token = uow.tokens.by_hash(hash_token(raw))
    if token is None or token.revoked_at is not None:
        return None
    return Principal(token.id, token.role, token.team_id)


def authenticate(uow: UnitOfWork, raw: str) -> Principal | None:
    """The caller of the REST API, the dashboard or NATS: an admin or team token, else None."""
    found = lookup_token(uow, raw)
    return found if found is not None and found.role in API_ROLES else None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for any other header or none."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def missing_token_reason(authorization: str | None) -> str:
    """Why a request that carries no usable bearer token is refused, told from its Authorization
    header so each mistake gets its own sentence (the header's value is never repeated)."""
    text = (authorization or "").strip()
    if not text:
        return "no API token: send the header `Authorization: Bearer <token>`"
    scheme, _, rest = text.partition(" ")
    if scheme.lower() != "bearer":
        return "the Authorization header is not `Bearer <token>`: put `Bearer ` before the token"
    return "the Authorization header has no token after `Bearer`" if not rest.strip() else UNKNOWN_TOKEN


@dataclass(frozen=True)
class ScrapeVerdict:
    status: int  # 200, 401, 403 or 429
    detail: str = ""
    retry_after: int | None = None  # with 429


def authorize_scrape(
    uow_factory: Callable[[], UnitOfWork], failures: FailedAuthLimiter, source: str, authorization: str | None
) -> ScrapeVerdict:
    """May the bearer token of the `authorization` header, sent from `source`, read a metrics
    exposition? Only a token of role metrics or admin may: the exposition is fleet-wide (every
    team's queues, and the per-run gauges' workload names and run ids), so a team token gets 403,
    not a filtered copy."""
    raw = bearer_token(authorization)
    if raw is None:
        return ScrapeVerdict(401, missing_token_reason(authorization))
    try:
        failures.check(source)
    except TooManyFailures as exc:
        return ScrapeVerdict(429, str(exc), exc.retry_after)
    found = lookup_token(uow_factory(), raw)
    if found is None:
        failures.failed(source)
        return ScrapeVerdict(401, UNKNOWN_TOKEN)
    if found.role not in SCRAPE_ROLES:
        return ScrapeVerdict(403, "reading /metrics needs a token of role metrics or admin")
    return ScrapeVerdict(200)


class PrincipalCache:
    """Principals of API tokens authenticated a moment ago, by token hash, for `ttl` seconds.

    Only for a route that checks the token again in its own transaction (a submit does, in the
    query that reads its queue: `workloads.submit(recheck_token=True)`), so a revoked token never
    writes anything: the memo saves the separate authentication transaction, not the check. A
    token's role and team never change, so a remembered principal is the same one. Unknown tokens
    are not remembered (each is looked up, as without the memo)."""

    def __init__(self, ttl: float = 5.0, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self.ttl, self.max_entries, self.clock = ttl, max_entries, clock
        self._entries: dict[str, tuple[Principal, float]] = {}

    def remembered(self, raw: str) -> Principal | None:
        """The principal of this token if it was authenticated less than `ttl` seconds ago (no I/O)."""
        if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
            return None
        remembered = self._entries.get(hash_token(raw))
        return remembered[0] if remembered is not None and remembered[1] > self.clock() else None

    def authenticate(self, uow_factory: Callable[[], UnitOfWork], raw: str) -> Principal | None:
        found = self.remembered(raw)
        if found is not None or not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
            return found
        key, now = hash_token(raw), self.clock()
        found = authenticate(uow_factory(), raw)
        if found is not None:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # bounded however many tokens call; they are simply looked up again
            self._entries[key] = (found, now + self.ttl)
        return found


def issue_token(uow: UnitOfWork, spec: TokenSpec, actor: str, now: datetime) -> tuple[TokenView, str]:
    """Returns the token record and the raw secret, which is never stored or shown again."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with uow:
        team_id = None
        if spec.team:
            team = uow.admin.get_tree_node("team", spec.team)
            if team is None:
                raise NotFound(f"unknown team {spec.team!r}")
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
        uow.ui_sessions.end_for_token(token_id)  # its dashboard logins end with it
        uow.audit.record(actor, "token.revoke", "token", token_id, {}, now)
        uow.commit()
