"""The submit-time fleet check is remembered per process, and errs only towards accepting."""

from __future__ import annotations

from fastapi.testclient import TestClient

from controlplane.api.app import create_app
from controlplane.api.context import ApiContext
from controlplane.bootstrap import Wiring
from controlplane.service.fleet_fit import FleetFit
from tests.integration.fleet import Tenant, gang, h100_cluster


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _client(wiring: Wiring, fit: FleetFit) -> TestClient:
    return TestClient(create_app(ApiContext(uow_factory=wiring.uow, subject_prefix="p", fleet_fit=fit)))


def test_one_fleet_read_serves_many_submits_until_it_expires(
    wiring: Wiring, tenant: Tenant, admin: dict[str, str]
) -> None:
    clock = Clock()
    fit = FleetFit(ttl=5.0, clock=clock)
    with _client(wiring, fit) as client:
        for i in range(5):
            r = client.post("/v1/workloads", json=gang(f"g{i}", tenant.queue, replicas=2), headers=tenant.headers)
            assert r.status_code == 201, r.text
        assert fit.reads == 1
        clock.t += 5.0
        assert client.post("/v1/workloads", json=gang("late", tenant.queue), headers=tenant.headers).status_code == 201
        assert fit.reads == 2


def test_a_refusal_is_never_given_on_a_remembered_fleet(wiring: Wiring, tenant: Tenant, admin: dict[str, str]) -> None:
    """The fleet grows between two submits (a cluster registered a moment ago): a gang only the new
    cluster can hold is accepted although the remembered fleet could not hold it."""
    clock = Clock()
    fit = FleetFit(ttl=3600.0, clock=clock)
    with _client(wiring, fit) as client:
        big = gang("big", tenant.queue, replicas=6)  # 6 x 8 GPUs: the tenant's cluster has 4 nodes
        assert client.post("/v1/workloads", json=gang("small", tenant.queue), headers=tenant.headers).status_code == 201
        refused = client.post("/v1/workloads", json=big, headers=tenant.headers)
        assert refused.status_code == 409
        assert "could ever hold this gang" in refused.json()["detail"]
        assert client.post("/v1/clusters", json=h100_cluster("sim-big", nodes=8), headers=admin).status_code == 201
        accepted = client.post("/v1/workloads", json=big, headers=tenant.headers)
        assert accepted.status_code == 201, accepted.text
        # Each refusal was judged on a read made for it; acceptances used the remembered one.
        assert fit.reads == 3
