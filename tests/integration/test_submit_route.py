"""The lean submit step (api/submit_route.py) answers every submit exactly as the FastAPI route it
stands in for: the same status, body and headers, for good requests and for each way to get one
wrong, on both databases."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import Wiring
from controlplane.service.metrics import NO_METRICS, Metrics, NoMetrics
from tests.integration.fleet import Tenant, gang


class _Requests(NoMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.routes: list[tuple[str, str, int]] = []

    def api_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.routes.append((method, route, status))


@pytest.fixture
def apps(wiring: Wiring) -> Iterator[tuple[TestClient, TestClient, _Requests]]:
    metrics = _Requests()

    def ctx(m: Metrics) -> ApiContext:
        return ApiContext(uow_factory=wiring.uow, subject_prefix=wiring.settings.subject_prefix, metrics=m)

    with (
        TestClient(create_app(ctx(metrics))) as lean,
        TestClient(create_app(ctx(NO_METRICS), lean_submit=False)) as routed,
    ):
        yield lean, routed, metrics


_VARYING = ("id", "name", "idempotency_key", "created_at", "updated_at")


def _answer(r: Any, tag: str) -> tuple[int, Any, dict[str, str]]:
    body = r.json()
    if r.status_code in (200, 201):
        body = {k: v for k, v in body.items() if k not in _VARYING}
    else:  # a refusal may name the workload and the key
        body = json.loads(re.sub(r"wl-[0-9a-f]+", "wl-…", json.dumps(body)).replace(tag, "{tag}"))
    headers = {k: r.headers[k] for k in ("content-type", "www-authenticate", "retry-after") if k in r.headers}
    return r.status_code, body, headers


def _cases(tenant: Tenant) -> list[tuple[str, dict[str, str], bytes | None]]:
    """(what, headers, body) of each request, `{tag}` in the body made unique per app."""
    auth = {**tenant.headers, "Content-Type": "application/json"}
    good = b'{"name": "{tag}", "queue": "%s", "pod_sets": [{"name": "w", "replicas": 1, "gpus": 8}]}' % (
        tenant.queue.encode()
    )
    long_key = "k" * 101
    return [
        ("no token", {"Content-Type": "application/json"}, good),
        ("another scheme", {"Authorization": "Basic abc", "Content-Type": "application/json"}, good),
        ("no token after Bearer", {"Authorization": "Bearer ", "Content-Type": "application/json"}, good),
        ("unknown token", {"Authorization": "Bearer gpf_nope", "Content-Type": "application/json"}, good),
        ("NUL, before the token", {"Content-Type": "application/json"}, good.replace(b"{tag}", b"a\\u0000")),
        ("a key too long", {**auth, "Idempotency-Key": long_key}, good),
        ("a key too long and a bad body", {**auth, "Idempotency-Key": long_key}, b'{"queue": 5}'),
        ("no body", auth, None),
        ("null", auth, b"null"),
        ("a list", auth, b"[]"),
        ("a field missing", auth, b'{"name": "x", "queue": "%s"}' % tenant.queue.encode()),
        ("an unknown field", auth, good.replace(b'"queue"', b'"colour": 1, "queue"')),
        ("bad values", auth, b'{"name": "UPPER CASE", "queue": "q", "pod_sets": [{"name": "w", "replicas": -1}]}'),
        ("an unknown queue", auth, good.replace(tenant.queue.encode(), b"no-such-queue")),
        ("an unknown class", auth, good.replace(b'"queue"', b'"priority_class": "nope", "queue"')),
        ("too big for the fleet", auth, good.replace(b'"replicas": 1', b'"replicas": 99')),
        ("created", auth, good),
        ("created with a key", {**auth, "Idempotency-Key": "{tag}-key"}, good),
        ("a retry", {**auth, "Idempotency-Key": "{tag}-key"}, good),
        ("a key reused", {**auth, "Idempotency-Key": "{tag}-key"}, good.replace(b'"replicas": 1', b'"replicas": 2')),
        ("an empty key", {**auth, "Idempotency-Key": ""}, good),
    ]


def test_the_lean_step_answers_as_the_route(
    tenant: Tenant, apps: tuple[TestClient, TestClient, _Requests], wiring: Wiring
) -> None:
    lean, routed, metrics = apps
    for what, headers, body in _cases(tenant):
        answers = []
        for tag, client in (("lean", lean), ("routed", routed)):
            sent = {k: v.replace("{tag}", tag) for k, v in headers.items()}
            content = body.replace(b"{tag}", tag.encode()) if body is not None else None
            answers.append(_answer(client.post("/v1/workloads", content=content, headers=sent), tag))
        assert answers[0] == answers[1], what
    statuses = {status for _, _, status in metrics.routes}
    assert statuses == {201, 200, 401, 404, 409, 422}
    assert {route for _, route, _ in metrics.routes} == {"/v1/workloads"}  # labelled as routed


def test_other_requests_are_left_to_the_routes(tenant: Tenant, apps: tuple[TestClient, TestClient, _Requests]) -> None:
    lean, _, _ = apps
    r = lean.post("/v1/workloads", json=gang("g", tenant.queue, replicas=1), headers=tenant.headers)
    assert r.status_code == 201, r.text
    assert lean.get("/v1/workloads", headers=tenant.headers).json()["items"][0]["id"] == r.json()["id"]
    assert lean.put("/v1/workloads", headers=tenant.headers).status_code == 405
