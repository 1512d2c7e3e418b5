"""The submit path parses a JSON body once: the body guard's hardened decode is the document the route
validates (api/decoded.py), and a process that serves the API runs on uvloop when it is installed."""

from __future__ import annotations

import pytest
import uvloop
from fastapi.testclient import TestClient
from starlette.requests import Request

from controlplane.cli.server_commands import _loop_factory
from tests.integration.fleet import Tenant, gang


def test_a_json_body_is_parsed_once(
    client: TestClient, admin: dict[str, str], tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def second_parse(self: Request) -> object:
        raise AssertionError("the body was parsed a second time after the guard decoded it")

    monkeypatch.setattr(Request, "json", second_parse)
    r = client.post("/v1/workloads", json=gang("resnet", tenant.queue), headers=tenant.headers)
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "resnet"
    r = client.patch(f"/v1/queues/{tenant.queue}", json={"limit": {"gpu-eq": 8}}, headers=admin)
    assert r.status_code == 200, r.text


def test_a_process_serving_the_api_runs_on_uvloop() -> None:
    assert _loop_factory(("api",)) is uvloop.new_event_loop
    assert _loop_factory(("api", "ingest")) is uvloop.new_event_loop
    assert _loop_factory(("scheduler",)) is None  # the other components keep the standard loop
