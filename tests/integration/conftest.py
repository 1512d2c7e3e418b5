"""Fixtures shared by the integration tests: the REST app over the test database, and tenants."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import Wiring
from tests.integration.fleet import Tenant, add_tenant, admin_headers, h100_cluster, setup_fleet


@pytest.fixture
def client(wiring: Wiring) -> Iterator[TestClient]:
    app = create_app(
        ApiContext(
            uow_factory=wiring.uow,
            subject_prefix=wiring.settings.subject_prefix,
            readiness={"database": wiring.database_ready},
        )
    )
    with TestClient(app) as c:
        yield c


@pytest.fixture
def admin(wiring: Wiring) -> dict[str, str]:
    return admin_headers(wiring)


@pytest.fixture
def tenant(client: TestClient, admin: dict[str, str]) -> Tenant:
    """Team `vision` with queue `vision-train` on one cluster of 4 nodes x 8 H100."""
    setup_fleet(client, admin, h100_cluster(nodes=4))
    return add_tenant(client, admin, "vision", "vision-train")
