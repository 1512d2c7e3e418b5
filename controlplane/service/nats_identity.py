"""Who may do what on NATS: credentials of clusters and teams turned into subject permissions.

NATS authenticates every connection (the server asks the control plane through auth callout, see
`adapters/nats/callout.py`); the permissions below are the whole of what a connection may do. The
ingest path then trusts the subject a message arrived on as its sender's identity: the server
allowed that connection to publish there and nowhere else.

- a cluster credential (`gpc_…`, one active per cluster, issued at registration, rotated and
  revoked by the API) publishes only `<prefix>.cluster.<name>.>` and `<prefix>.telemetry.<name>.>`;
- a team's API token publishes only `<prefix>.submit.<team>.<queue>` and `<prefix>.cancel.<team>`
  and subscribes only to `<prefix>.events.workload.<team>.>`;
- an admin API token subscribes to `<prefix>.events.>` and publishes nothing;
- every identity may also subscribe to its own reply inboxes `_INBOX.<kind>-<name>.>` (clients set
  that inbox prefix), so a publish gets its acknowledgement and nobody reads another's; the
  control plane's inbound gateway answers a sender only there (`sender_of_subject`), so nobody can
  have an acknowledgement written onto another's subjects;
- nobody but the control plane's own user (configured in the server, not issued here) may touch
  `$JS.API.>`, the DLQ, the event subjects' publish side, or any other subject.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.service.auth import authenticate
from controlplane.service.errors import NotFound
from controlplane.service.ids import new_id
from controlplane.service.ports import UnitOfWork
from controlplane.service.views import ClusterCredential

CLUSTER_CREDENTIAL_PREFIX = "gpc_"


@dataclass(frozen=True)
class NatsGrant:
    """An authenticated NATS identity and exactly what it may publish and subscribe to."""

    kind: str  # cluster | team | admin
    name: str  # cluster or team name; the token id for admins
    credential_id: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    @property
    def inbox_prefix(self) -> str:
        return f"_INBOX.{self.kind}-{self.name}"


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def cluster_grant(prefix: str, cluster: str, credential_id: str) -> NatsGrant:
    inbox = f"_INBOX.cluster-{cluster}"
    return NatsGrant(
        "cluster",
        cluster,
        credential_id,
        publish=(f"{prefix}.cluster.{cluster}.>", f"{prefix}.telemetry.{cluster}.>"),
        subscribe=(f"{inbox}.>",),
    )


def team_grant(prefix: str, team: str, credential_id: str) -> NatsGrant:
    inbox = f"_INBOX.team-{team}"
    return NatsGrant(
        "team",
        team,
        credential_id,
        publish=(f"{prefix}.submit.{team}.*", f"{prefix}.cancel.{team}"),
        subscribe=(f"{prefix}.events.workload.{team}.>", f"{inbox}.>"),
    )


def admin_grant(prefix: str, token_id: str) -> NatsGrant:
    return NatsGrant(
        "admin", token_id, token_id, publish=(), subscribe=(f"{prefix}.events.>", f"_INBOX.admin-{token_id}.>")
    )


def sender_of_subject(prefix: str, subject: str) -> NatsGrant | None:
    """The identity the server let publish on `subject` (one of the inbound subjects above), as a
    grant without a credential id: its kind, name and inbox prefix. None for any other subject.
    The inbound gateway answers a sender only inside that inbox prefix."""
    parts = subject.removeprefix(prefix + ".").split(".") if subject.startswith(prefix + ".") else []
    if parts[:1] == ["submit"] and len(parts) == 3 and parts[1]:
        return team_grant(prefix, parts[1], "")
    if parts[:1] == ["cancel"] and len(parts) == 2 and parts[1]:
        return team_grant(prefix, parts[1], "")
    if parts[:1] in (["cluster"], ["telemetry"]) and len(parts) >= 3 and parts[1]:
        return cluster_grant(prefix, parts[1], "")
    return None


def grant_for(uow: UnitOfWork, secret: str, prefix: str) -> NatsGrant | None:
    """The identity a NATS client proves with `secret` (its token or password), or None."""
    if secret.startswith(CLUSTER_CREDENTIAL_PREFIX) and len(secret) <= 200:
        with uow:
            credential = uow.cluster_credentials.by_hash(_hash(secret))
        if credential is None or credential.revoked_at is not None:
            return None
        return cluster_grant(prefix, credential.cluster, credential.id)
    principal = authenticate(uow, secret)
    if principal is None:
        return None
    if principal.is_admin:
        return admin_grant(prefix, principal.token_id)
    if principal.team_id is None:
        return None
    with uow:
        team = uow.admin.get_tree_node("team", principal.team_id)
    return None if team is None else team_grant(prefix, team.name, principal.token_id)


def still_valid(uow: UnitOfWork, credential_ids: Sequence[str]) -> set[str]:
    """Of these credentials (cluster credentials or API tokens), those not revoked."""
    with uow:
        return uow.cluster_credentials.still_valid(credential_ids)


def new_cluster_secret() -> tuple[str, str]:
    """(raw secret, its hash): the raw one is shown once, the hash is what SQL keeps."""
    raw = CLUSTER_CREDENTIAL_PREFIX + secrets.token_urlsafe(32)
    return raw, _hash(raw)


def rotate_cluster_credential(
    uow: UnitOfWork, cluster_ref: str, actor: str, now: datetime
) -> tuple[ClusterCredential, str]:
    """Revoke the cluster's credentials and issue a new one. Returns it with the raw secret, shown once."""
    raw, secret_hash = new_cluster_secret()
    with uow:
        cluster = uow.admin.get_cluster(cluster_ref)
        if cluster is None:
            raise NotFound(f"no cluster {cluster_ref}")
        revoked = uow.cluster_credentials.revoke_all(cluster.id, now)
        credential = ClusterCredential(new_id("ccr"), cluster.name, now, None)
        uow.cluster_credentials.add(credential.id, cluster.id, secret_hash, now)
        uow.audit.record(
            actor,
            "cluster.credential.issue",
            "cluster",
            cluster.id,
            {"credential": credential.id, "revoked": revoked},
            now,
        )
        uow.commit()
    return credential, raw


def revoke_cluster_credentials(uow: UnitOfWork, cluster_ref: str, actor: str, now: datetime) -> list[str]:
    with uow:
        cluster = uow.admin.get_cluster(cluster_ref)
        if cluster is None:
            raise NotFound(f"no cluster {cluster_ref}")
        revoked = uow.cluster_credentials.revoke_all(cluster.id, now)
        uow.audit.record(actor, "cluster.credential.revoke", "cluster", cluster.id, {"revoked": revoked}, now)
        uow.commit()
    return revoked


def list_cluster_credentials(uow: UnitOfWork, cluster_ref: str) -> list[ClusterCredential]:
    with uow:
        cluster = uow.admin.get_cluster(cluster_ref)
        if cluster is None:
            raise NotFound(f"no cluster {cluster_ref}")
        return uow.cluster_credentials.for_cluster(cluster.id)
