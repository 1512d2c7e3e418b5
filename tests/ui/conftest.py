"""A seeded fleet for the dashboard's HTTP tests: two clusters (H100; MIG A100 and time-sliced L4),
two teams, gangs admitted, one waiting on its queue's limit, and the REST app with the gauges."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from adapters.sql.gauges_repo import SqlFleetGauges
from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import Wiring, utc_now
from controlplane.core.snapshot import Policy
from controlplane.service.scheduling import acquire_leadership, run_cycle
from tests.integration.fleet import Tenant, add_tenant, admin_headers, gang, h100_cluster, mixed_cluster, setup_fleet

BASE = "http://testserver"
ORIGIN = {"Origin": BASE}


@dataclass
class Seeded:
    client: TestClient
    wiring: Wiring
    admin: dict[str, str]
    vision: Tenant
    llm: Tenant
    ids: dict[str, str]

    @property
    def admin_token(self) -> str:
        return self.admin["Authorization"].removeprefix("Bearer ")

    def login(self, token: str) -> TestClient:
        """A browser-like client holding the session cookie of `token`."""
        browser = TestClient(self.client.app, base_url=BASE)
        r = browser.post("/ui/login", data={"token": token}, headers=ORIGIN, follow_redirects=False)
        assert r.status_code == 303, r.text
        return browser


@pytest.fixture
def seeded(wiring: Wiring) -> Iterator[Seeded]:
    app = create_app(
        ApiContext(
            uow_factory=wiring.uow, subject_prefix=wiring.settings.subject_prefix, gauges=SqlFleetGauges(wiring.engine)
        )
    )
    with TestClient(app, base_url=BASE) as client:
        admin = admin_headers(wiring)
        setup_fleet(client, admin, h100_cluster(nodes=4), mixed_cluster())
        vision = add_tenant(client, admin, "vision", "vision-train", limit={"gpu-eq": 48})
        llm = add_tenant(client, admin, "llm", "llm-train")
        ids = {}
        for name, tenant, body in (
            ("a", vision, gang("a", "vision-train", replicas=1, gpus=8)),
            ("b", vision, gang("b", "vision-train", replicas=2, gpus=8)),
            (
                "c",
                vision,
                gang(
                    "c",
                    "vision-train",
                    pod_sets=[{"name": "workers", "replicas": 4, "gpus": 8, "gpu_models": ["H100-80GB"]}],
                ),
            ),
            ("secret", llm, gang("secret", "llm-train", replicas=1, gpus=8)),
        ):
            r = client.post("/v1/workloads", json=body, headers=tenant.headers)
            assert r.status_code == 201, r.text
            ids[name] = r.json()["id"]
        epoch = acquire_leadership(wiring.uow, "ui-test", utc_now(), 15.0)
        assert epoch is not None
        run_cycle(wiring.uow, "ui-test", epoch, Policy(), wiring.settings.subject_prefix, utc_now(), 15.0, True)
        yield Seeded(client, wiring, admin, vision, llm, ids)
