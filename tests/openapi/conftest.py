"""The API app without a database, and its OpenAPI document: what the schema tests read."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.service.ports import UnitOfWork


def _no_database() -> UnitOfWork:
    raise AssertionError("these tests read the schema, or answer before any database access")


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(ApiContext(uow_factory=_no_database))


@pytest.fixture(scope="module")
def schema(app: FastAPI) -> dict[str, Any]:
    return app.openapi()
