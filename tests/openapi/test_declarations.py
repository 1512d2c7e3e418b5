"""The OpenAPI declares every status each route can answer, with the body the API really sends.

These read the routes themselves (their dependencies, parameters and bodies), so a route added later
(say, cluster credentials) that forgets a declaration fails here before schemathesis runs."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from controlplane.api import security

ERROR_BODY = {"$ref": "#/components/schemas/ErrorBody"}


def _calls(dependant: Dependant) -> set[object]:
    found = {dependant.call}
    for dependency in dependant.dependencies:
        found |= _calls(dependency)
    return found


def _api_routes(routes: list[Any]) -> list[APIRoute]:
    """The app's routes; newer FastAPI keeps an included router as one entry (`original_router`)."""
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        elif hasattr(route, "original_router"):
            found.extend(_api_routes(route.original_router.routes))
    return found


def _operations(app: FastAPI) -> list[tuple[APIRoute, str]]:
    """The published operations: the web dashboard's pages (`/ui`) are not part of the API."""
    return [(r, m.lower()) for r in _api_routes(app.routes) if r.include_in_schema for m in sorted(r.methods)]


def test_no_fastapi_validation_error_schema_is_published(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    assert "HTTPValidationError" not in components
    assert "ValidationError" not in components
    assert components["ErrorBody"]["required"] == ["detail"]


def test_every_error_answer_carries_the_error_body(schema: dict[str, Any]) -> None:
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if status >= "400" and path != "/readyz":
                    assert answer["content"]["application/json"]["schema"] == ERROR_BODY, (method, path, status)


def test_each_route_declares_the_statuses_it_can_answer(app: FastAPI, schema: dict[str, Any]) -> None:
    checked = 0
    for route, method in _operations(app):
        declared = set(schema["paths"][route.path][method]["responses"])
        calls = _calls(route.dependant)
        expected = set()
        if security.principal in calls or security.submitter in calls:
            expected |= {"401", "429", "503"}  # 429: too many failed authentications from the address
        if security.admin in calls:
            expected.add("403")
        if route.dependant.path_params:
            expected.add("404")
        if route.body_field is not None:
            expected |= {"400", "413", "415", "422"}
        if route.dependant.query_params or route.dependant.path_params:
            expected.add("422")
        assert expected <= declared, (method, route.path, sorted(expected - declared))
        checked += 1
    assert checked >= 32


def test_authentication_answers_say_how_to_authenticate(schema: dict[str, Any]) -> None:
    answer = schema["paths"]["/v1/workloads"]["get"]["responses"]["401"]
    assert answer["headers"]["WWW-Authenticate"]["required"] is True


def test_success_answers_have_a_body_schema_except_204(schema: dict[str, Any]) -> None:
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if status.startswith("2") and status != "204":
                    assert answer["content"]["application/json"]["schema"], (method, path, status)


def test_the_issued_token_secret_is_declared(schema: dict[str, Any]) -> None:
    answer = schema["paths"]["/v1/tokens"]["post"]["responses"]["201"]
    assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/IssuedToken"}
    issued = schema["components"]["schemas"]["IssuedToken"]
    assert "token" in issued["required"]
    assert issued["properties"]["token"]["type"] == "string"


def test_an_idempotent_retry_is_declared_with_the_workload(schema: dict[str, Any]) -> None:
    answers = schema["paths"]["/v1/workloads"]["post"]["responses"]
    assert answers["200"]["content"] == answers["201"]["content"]


def test_method_not_allowed_lists_every_method_of_the_path(app: FastAPI) -> None:
    with TestClient(app) as client:
        r = client.request("PUT", "/v1/clusters")
        assert r.status_code == 405
        assert r.headers["allow"] == "GET, POST"
        assert r.json()["detail"] == "PUT is not allowed here; use GET, POST"
        r = client.request("OPTIONS", "/v1/queues/q1")
        assert r.headers["allow"] == "DELETE, GET, PATCH"
