"""Cluster NATS credentials through the API: issued at registration (shown once, stored hashed),
listed without secrets, rotated and revoked by admins only."""

from __future__ import annotations

import hashlib

from fastapi.testclient import TestClient
from sqlalchemy import select

from adapters.sql.tables import ClusterCredentialRow
from controlplane.bootstrap import Wiring
from controlplane.service import nats_identity
from tests.integration.fleet import Tenant, h100_cluster


def test_register_rotate_revoke(client: TestClient, admin: dict[str, str], tenant: Tenant, wiring: Wiring) -> None:
    prefix = wiring.settings.subject_prefix
    r = client.post("/v1/clusters", json=h100_cluster("edge", nodes=1), headers=admin)
    assert r.status_code == 201, r.text
    first = r.json()["nats_credential"]
    grant = nats_identity.grant_for(wiring.uow(), first, prefix)
    assert grant is not None
    assert (grant.kind, grant.name) == ("cluster", "edge")
    assert grant.publish == (f"{prefix}.cluster.edge.>", f"{prefix}.telemetry.edge.>")
    with wiring.uow() as uow:
        hashes = set(uow.session.scalars(select(ClusterCredentialRow.secret_hash)))  # type: ignore[attr-defined]
    assert hashlib.sha256(first.encode()).hexdigest() in hashes
    assert first not in hashes

    assert client.post("/v1/clusters/edge/credentials/rotate", headers=tenant.headers).status_code == 403
    r = client.post("/v1/clusters/edge/credentials/rotate", headers=admin)
    assert r.status_code == 201, r.text
    second = r.json()["credential"]
    assert nats_identity.grant_for(wiring.uow(), first, prefix) is None  # rotation revokes the old one
    assert nats_identity.grant_for(wiring.uow(), second, prefix) is not None
    listed = client.get("/v1/clusters/edge/credentials", headers=admin).json()
    assert [c["revoked_at"] is None for c in listed] == [False, True]
    assert all(first not in str(c) and second not in str(c) for c in listed)

    assert client.delete("/v1/clusters/edge/credentials", headers=admin).status_code == 204
    assert nats_identity.grant_for(wiring.uow(), second, prefix) is None
    assert client.post("/v1/clusters/nowhere/credentials/rotate", headers=admin).status_code == 404


def test_team_and_admin_tokens_get_their_own_grants(wiring: Wiring, tenant: Tenant, admin: dict[str, str]) -> None:
    prefix = wiring.settings.subject_prefix
    team = nats_identity.grant_for(wiring.uow(), tenant.token, prefix)
    assert team is not None
    assert team.publish == (f"{prefix}.submit.{tenant.team}.*", f"{prefix}.cancel.{tenant.team}")
    assert team.subscribe == (f"{prefix}.events.workload.{tenant.team}.>", f"_INBOX.team-{tenant.team}.>")
    boss = nats_identity.grant_for(wiring.uow(), admin["Authorization"].removeprefix("Bearer "), prefix)
    assert boss is not None
    assert boss.publish == ()
    assert nats_identity.grant_for(wiring.uow(), "gpf_nope", prefix) is None
