"""EKS against moto: registration shows the GPU node groups after fleet sync, and cloud pool
autoscaling. A gang waiting for room grows the cheapest pool that can hold it to exactly the size it
needs (once: a second pass sends nothing), audited and announced; a gang no single pool can hold grows
several, cheapest first; a pool nobody uses for the cool-down goes back to its minimum, never below;
a gang no pool can hold even at its max size buys nothing. Submission accepts a gang that fits only
once pools have grown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from moto.server import ThreadedMotoServer
from sqlalchemy import create_engine, text

from controlplane.bootstrap import Wiring, utc_now
from controlplane.service.autoscale import DEFAULT_REQUEST_TTL, ScaleOutcome, autoscale_once
from controlplane.service.cloud_ports import CloudProvider
from controlplane.service.fleet_sync import sync_due
from tests.clouds import test_eks
from tests.integration.cloud_support import (
    EKS_CLUSTER,
    eks_provider,
    eks_scaling,
    reset_eks,
    schedule,
    seed_eks,
)
from tests.integration.fleet import Tenant, add_tenant, gang

COOLDOWN = 600.0
UPDATE = "UpdateNodegroupConfig"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def seeded(moto_url: str) -> Any:
    return seed_eks(moto_url)  # once per module: moto is slow to create node groups


class Eks:
    """The registered EKS cluster: moto's client, gpufleet's provider and the EKS calls it made."""

    def __init__(self, client: Any, provider: CloudProvider, clients: test_eks.CountingClients, wiring: Wiring):
        self.client, self.provider, self.clients, self.wiring = client, provider, clients, wiring

    def sync(self) -> None:
        (result,) = asyncio.run(sync_due(self.wiring.uow, self.providers, "p", utc_now, 0.0))
        assert result.ok, result.error

    def providers(self, name: str) -> CloudProvider:
        assert name == "eks"
        return self.provider

    def step(self, at: datetime) -> list[ScaleOutcome]:
        prefix = self.wiring.settings.subject_prefix
        return asyncio.run(autoscale_once(self.wiring.uow, self.providers, prefix, lambda: at, COOLDOWN))

    def desired(self, group: str) -> int:
        return eks_scaling(self.client, group)["desiredSize"]

    def updates(self) -> int:
        return self.clients.operations.count(UPDATE)


@pytest.fixture
def eks(seeded: Any, moto_url: str, client: TestClient, admin: dict[str, str], wiring: Wiring) -> Eks:
    reset_eks(seeded)
    provider, clients = eks_provider(moto_url)
    r = client.post("/v1/clusters", json=EKS_CLUSTER, headers=admin)
    assert r.status_code == 201, r.text
    found = Eks(seeded, provider, clients, wiring)
    found.sync()
    r = client.post("/v1/priority-classes", json={"name": "batch", "value": 100, "is_default": True}, headers=admin)
    assert r.status_code == 201, r.text
    return found


@pytest.fixture
def team(client: TestClient, admin: dict[str, str], eks: Eks) -> Tenant:
    return add_tenant(client, admin, "vision", "vision-train")


def _rows(wiring: Wiring, statement: str) -> list[Any]:
    engine = create_engine(wiring.settings.database_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        rows = list(conn.execute(text(statement)).all())
    engine.dispose()
    return rows


def _pools(client: TestClient, admin: dict[str, str]) -> dict[str, int]:
    (cluster,) = client.get("/v1/clusters", headers=admin).json()
    return {p["name"]: p["node_count"] for p in cluster["pools"]}


def _submit(client: TestClient, team: Tenant, name: str, replicas: int, **extra: Any) -> str:
    r = client.post(
        "/v1/workloads", json=gang(name, team.queue, replicas=replicas, gpus=8, **extra), headers=team.headers
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_registered_eks_cluster_shows_its_gpu_pools_after_sync(
    seeded: Any, moto_url: str, client: TestClient, admin: dict[str, str], wiring: Wiring
) -> None:
    reset_eks(seeded)
    provider, clients = eks_provider(moto_url)
    r = client.post("/v1/clusters", json=EKS_CLUSTER, headers=admin)
    assert r.status_code == 201, r.text
    assert (r.json()["sync_state"], r.json()["pools"]) == ("pending", [])
    assert clients.operations == [], "registration must not call the cloud"

    (result,) = asyncio.run(sync_due(wiring.uow, {"eks": provider}.__getitem__, "p", utc_now, 60.0))
    assert result.ok, result.error
    assert "UpdateNodegroupConfig" not in clients.operations  # discovery only reads

    (listed,) = client.get("/v1/clusters", headers=admin).json()
    assert (listed["name"], listed["provider"], listed["sync_state"]) == ("eks-train", "eks", "ready")
    got = {
        p["name"]: (
            p["gpu_model"],
            p["gpus_per_node"],
            p["sharing"],
            p["node_count"],
            p["min_size"],
            p["max_size"],
            p["price_per_gpu_hour"],
        )
        for p in listed["pools"]
    }
    # The CPU node group `system` is no GPU pool: left out, and not an issue either.
    assert got == {
        "p5-flex": ("H100-80GB", 8, "exclusive", 0, 0, 4, 9.8),
        "p5-reserved": ("H100-80GB", 8, "exclusive", 1, 0, 4, 4.5),
    }
    detail = client.get("/v1/clusters/eks-train", headers=admin).json()
    assert {p["name"]: [n["name"] for n in p["nodes"]] for p in detail["pools"]} == {
        "p5-flex": [],
        "p5-reserved": ["eks-train-p5-reserved-0"],
    }
    assert not listed.get("sync_error")


def test_gang_that_fits_only_once_a_pool_grows_is_accepted(
    client: TestClient, admin: dict[str, str], eks: Eks, team: Tenant
) -> None:
    assert _pools(client, admin) == {"p5-reserved": 1, "p5-flex": 0}
    # 3 nodes of 8 H100: more than the fleet has now, within what its pools may grow to.
    _submit(client, team, "grows", replicas=3)
    # 4 + 4 nodes at max size: 8 pods spread over both pools could be held; 9 never.
    _submit(client, team, "spread", replicas=8)
    r = client.post("/v1/workloads", json=gang("never", team.queue, replicas=9, gpus=8), headers=team.headers)
    assert r.status_code == 409, r.text  # the fleet as it stands is in the way, not the request
    assert "could ever hold" in r.text
    # One pool alone holds at most 4: a gang that must stay in one pool and needs 5 is refused too.
    r = client.post(
        "/v1/workloads",
        json=gang("one-pool", team.queue, replicas=5, gpus=8, same_pool="required"),
        headers=team.headers,
    )
    assert r.status_code == 409, r.text


def test_waiting_gang_grows_the_cheapest_pool_once_and_idle_pool_goes_back_to_min(
    client: TestClient, admin: dict[str, str], eks: Eks, team: Tenant, wiring: Wiring
) -> None:
    workload_id = _submit(client, team, "needs-two-more", replicas=3)
    t0 = utc_now()
    assert schedule(wiring, t0) == 0
    view = client.get(f"/v1/workloads/{workload_id}", headers=team.headers).json()
    assert view["reason"].startswith("never-fits: can never fit in this fleet as it stands"), view

    (outcome,) = eks.step(t0)
    assert outcome.ok, outcome.error
    decision = outcome.decision
    assert (decision.pool, decision.direction, decision.current, decision.target) == ("p5-reserved", "up", 1, 3)
    assert decision.workload_id == workload_id
    # The cheaper pool, grown by exactly the two nodes the gang needs; the pricier one left alone.
    assert eks.desired("p5-reserved") == 3
    assert eks.desired("p5-flex") == 0
    assert eks.updates() == 1

    # Idempotent: the request is remembered, the nodes on their way count; nothing is sent again.
    assert eks.step(t0 + timedelta(seconds=30)) == []
    assert eks.updates() == 1

    ((actor, detail),) = _rows(wiring, "SELECT actor, detail FROM audit_log WHERE action = 'cluster.scale'")
    detail = detail if isinstance(detail, dict) else json.loads(detail)
    assert actor == "autoscaler"
    assert (detail["pool"], detail["from"], detail["requested"], detail["desired"]) == ("p5-reserved", 1, 3, 3)
    assert detail["workload_id"] == workload_id
    prefix = wiring.settings.subject_prefix
    subjects = [s for (s,) in _rows(wiring, "SELECT subject FROM outbox")]
    assert subjects.count(f"{prefix}.events.cluster.eks-train.scaled") == 1

    # The nodes arrive (fleet sync); the gang is admitted onto them.
    eks.sync()
    assert _pools(client, admin) == {"p5-reserved": 3, "p5-flex": 0}
    assert schedule(wiring, t0 + timedelta(seconds=60)) == 1
    # A pool its gang runs on is never given back, however long the autoscaler looks.
    assert eks.step(t0 + timedelta(seconds=10 * COOLDOWN)) == []
    assert eks.desired("p5-reserved") == 3

    # Cancelled: the pool is idle from the next pass, and after the cool-down scaled down to its minimum.
    r = client.post(f"/v1/workloads/{workload_id}/cancel", json={"reason": "done"}, headers=team.headers)
    assert r.status_code == 200, r.text
    t1 = t0 + timedelta(seconds=11 * COOLDOWN)
    assert eks.step(t1) == []  # idle from now on
    assert eks.step(t1 + timedelta(seconds=COOLDOWN - 1)) == []  # not yet
    assert eks.updates() == 1
    (down,) = eks.step(t1 + timedelta(seconds=COOLDOWN + 1))
    assert down.ok, down.error
    assert (down.decision.pool, down.decision.direction, down.decision.target) == ("p5-reserved", "down", 0)
    assert eks.desired("p5-reserved") == 0
    assert eks.desired("p5-flex") == 0
    assert eks.step(t1 + timedelta(seconds=COOLDOWN + 30)) == []  # asked once
    assert eks.updates() == 2
    assert len([s for (s,) in _rows(wiring, "SELECT subject FROM outbox") if s.endswith(".scaled")]) == 2


def test_idle_pool_is_scaled_down_to_its_minimum_never_below(
    client: TestClient, admin: dict[str, str], eks: Eks
) -> None:
    eks.client.update_nodegroup_config(
        clusterName=test_eks.CLUSTER,
        nodegroupName="p5-reserved",
        scalingConfig={"minSize": 2, "maxSize": 4, "desiredSize": 4},
    )
    eks.sync()
    assert _pools(client, admin) == {"p5-reserved": 4, "p5-flex": 0}
    t0 = utc_now()
    assert eks.step(t0) == []
    (down,) = eks.step(t0 + timedelta(seconds=COOLDOWN + 1))
    assert (down.decision.pool, down.decision.current, down.decision.target) == ("p5-reserved", 4, 2)
    assert eks.desired("p5-reserved") == 2
    eks.sync()
    assert _pools(client, admin) == {"p5-reserved": 2, "p5-flex": 0}
    # At its minimum (and the empty pool at its own): nothing more to give back, however long it idles.
    assert eks.step(t0 + timedelta(seconds=5 * COOLDOWN)) == []
    assert eks.step(t0 + timedelta(seconds=50 * COOLDOWN)) == []
    assert (eks.desired("p5-reserved"), eks.desired("p5-flex")) == (2, 0)
    assert eks.updates() == 1


def test_gang_too_big_for_one_pool_grows_several_cheapest_first(
    client: TestClient, admin: dict[str, str], eks: Eks, team: Tenant, wiring: Wiring
) -> None:
    _submit(client, team, "six-nodes", replicas=6)
    t0 = utc_now()
    assert schedule(wiring, t0) == 0
    outcomes = eks.step(t0)
    assert all(o.ok for o in outcomes), outcomes
    assert {(o.decision.pool, o.decision.target) for o in outcomes} == {("p5-reserved", 4), ("p5-flex", 2)}
    assert (eks.desired("p5-reserved"), eks.desired("p5-flex")) == (4, 2)
    assert eks.step(t0 + timedelta(seconds=30)) == []
    eks.sync()
    assert schedule(wiring, t0 + timedelta(seconds=60)) == 1


def test_gang_that_cannot_fit_even_at_max_size_scales_nothing(
    client: TestClient, admin: dict[str, str], eks: Eks, team: Tenant, wiring: Wiring
) -> None:
    workload_id = _submit(client, team, "too-big-later", replicas=3)
    # The pools' bounds are lowered in the cloud after the gang was accepted: 1 + 1 nodes at most now.
    for group, desired in (("p5-reserved", 1), ("p5-flex", 0)):
        eks.client.update_nodegroup_config(
            clusterName=test_eks.CLUSTER,
            nodegroupName=group,
            scalingConfig={"minSize": 0, "maxSize": 1, "desiredSize": desired},
        )
    eks.sync()
    t0 = utc_now()
    assert schedule(wiring, t0) == 0
    view = client.get(f"/v1/workloads/{workload_id}", headers=team.headers).json()
    assert view["reason"].startswith("never-fits"), view
    assert eks.step(t0) == []
    assert eks.step(t0 + timedelta(seconds=30)) == []
    assert eks.updates() == 0
    assert (eks.desired("p5-reserved"), eks.desired("p5-flex")) == (1, 0)
    assert _rows(wiring, "SELECT id FROM audit_log WHERE action LIKE 'cluster.scale%'") == []


def test_request_the_cloud_never_matched_is_forgotten_and_asked_again(
    client: TestClient, admin: dict[str, str], eks: Eks, team: Tenant, wiring: Wiring
) -> None:
    _submit(client, team, "needs-two-more", replicas=3)
    t0 = utc_now()
    assert schedule(wiring, t0) == 0
    (up,) = eks.step(t0)
    assert (up.decision.pool, up.decision.target) == ("p5-reserved", 3)
    # Someone else resizes the node group in the cloud before gpufleet's nodes arrive.
    eks.client.update_nodegroup_config(
        clusterName=test_eks.CLUSTER,
        nodegroupName="p5-reserved",
        scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": 2},
    )
    eks.sync()
    assert _pools(client, admin)["p5-reserved"] == 2
    assert schedule(wiring, t0 + timedelta(seconds=10)) == 0
    assert eks.step(t0 + timedelta(seconds=60)) == []  # the request is still believed to be on its way
    assert eks.updates() == 1
    (again,) = eks.step(t0 + timedelta(seconds=DEFAULT_REQUEST_TTL + 1))
    assert (again.decision.pool, again.decision.current, again.decision.target) == ("p5-reserved", 2, 3)
    assert eks.desired("p5-reserved") == 3
    assert eks.updates() == 2
