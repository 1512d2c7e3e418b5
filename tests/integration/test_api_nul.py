"""A NUL character (PostgreSQL text and jsonb cannot hold one) is refused with a 422 naming where it
was, on both backends alike; before, PostgreSQL raised and the client got a 500."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from tests.integration.fleet import Tenant, gang, h100_cluster

NUL_MESSAGE = "text may not contain NUL (\\u0000) characters"


def test_nul_in_a_body_is_refused(client: TestClient, admin: dict[str, str], tenant: Tenant) -> None:
    spec = h100_cluster("sim-other")
    spec["region"] = "eu\u0000west"
    r = client.post("/v1/clusters", json=spec, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [{"field": "request", "message": NUL_MESSAGE}]
    body = gang("resnet", tenant.queue, container={"env": [{"name": "A", "value": "x\u0000"}]})
    r = client.post("/v1/workloads", json=body, headers=tenant.headers)
    assert r.status_code == 422, r.text
    r = client.patch(f"/v1/queues/{tenant.queue}", json={"limit": {"a\u0000": 1}}, headers=admin)
    assert r.status_code == 422, r.text


def test_an_escaped_backslash_before_u0000_is_plain_text(client: TestClient, tenant: Tenant) -> None:
    body = gang("resnet", tenant.queue, container={"args": ["\\u0000"]})  # six characters, no NUL
    r = client.post(
        "/v1/workloads",
        content=json.dumps(body),
        headers={**tenant.headers, "Content-Type": "application/json"},
    )
    assert r.status_code == 201, r.text


def test_nul_in_a_path_or_query_parameter_is_refused(client: TestClient, admin: dict[str, str], tenant: Tenant) -> None:
    r = client.get("/v1/clusters/sim%00h100", headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [{"field": "ref", "message": NUL_MESSAGE}]
    r = client.get("/v1/workloads", params={"name": "a\u0000b", "queue": tenant.queue}, headers=tenant.headers)
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [{"field": "name", "message": NUL_MESSAGE}]
    r = client.get("/v1/tokens", params={"team": "\u0000"}, headers=admin)
    assert r.status_code == 422, r.text
    # a parameter the route does not read reaches nothing, so it is ignored as before
    assert client.get("/v1/clusters", params={"x": "\u0000"}, headers=admin).status_code == 200
