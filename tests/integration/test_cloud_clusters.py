"""Registering cloud clusters: stored pending with no cloud call, discovered by fleet sync, GPU pools in
GET /v1/clusters; user kubeconfigs: exec refused, tokens kept in a 0600 file and never in SQL."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from controlplane.bootstrap import Wiring, utc_now
from controlplane.service.cloud_ports import CloudProvider
from controlplane.service.fleet_sync import sync_due
from controlplane.service.kubeconfigs import FileKubeconfigStore
from tests.clouds import test_aks, test_gke, test_oke
from tests.clouds.keys import KeyPair
from tests.integration.cloud_support import GKE_CLUSTER, aks_provider, gke_provider, oke_provider, sync
from tests.integration.fleet import h100_cluster


@pytest.fixture(scope="module")
def key() -> KeyPair:
    return KeyPair.generate()


@pytest.fixture
def cloud(
    request: pytest.FixtureRequest, key: KeyPair, tmp_path: Path
) -> Iterator[tuple[dict[str, Any], CloudProvider, Any]]:
    """(registration body, provider, fake) for one cloud."""
    name = request.param
    if name == "gke":
        fake: Any = test_gke.FakeGoogle(key)
        fake.server.start()
        yield GKE_CLUSTER, gke_provider(fake, key), fake
    elif name == "aks":
        fake = test_aks.FakeArm()
        fake.server.start()
        body = {
            "name": "aks-ml",
            "provider": "aks",
            "account": test_aks.SUB,
            "region": "eastus",
            "cluster": test_aks.CLUSTER,
            "resource_group": test_aks.RG,
            "kubernetes": {"gang": "kueue", "use_jobset": True},
        }
        yield body, aks_provider(fake), fake
    else:
        fake = test_oke.FakeOci(key)
        fake.server.start()
        body = {
            "name": "oke-gpu",
            "provider": "oke",
            "account": test_oke.COMPARTMENT,
            "region": test_oke.REGION,
            "cluster": test_oke.CLUSTER,
            "kubernetes": {"gang": "volcano"},
        }
        yield body, oke_provider(fake, key, tmp_path), fake
    fake.server.stop()


EXPECTED: dict[str, dict[str, tuple[Any, ...]]] = {
    # provider: {pool: (gpu model, gpus per node, sharing, nodes, min, max)}
    "gke": {
        "h100-mig": ("H100-80GB", 8, "mig:all-1g.10gb", 2, 0, None),
        "l4-shared": ("L4", 2, "timeslice:4", 3, 3, 12),
    },
    "aks": {
        "gpua100": ("A100-80GB", 1, "exclusive", 1, 1, 5),
        "gpuh100": ("H100-80GB", 8, "mig:all-3g.40gb", 2, 0, None),
    },
    "oke": {"a10-spot": ("A10", 2, "exclusive", 1, 0, None), "h100": ("H100-80GB", 8, "exclusive", 2, 0, None)},
}


@pytest.mark.parametrize("cloud", ["gke", "aks", "oke"], indirect=True)
def test_registered_cloud_cluster_shows_its_gpu_pools_after_sync(
    cloud: tuple[dict[str, Any], CloudProvider, Any], client: TestClient, admin: dict[str, str], wiring: Wiring
) -> None:
    body, provider, fake = cloud
    before = len(fake.server.requests)
    r = client.post("/v1/clusters", json=body, headers=admin)
    assert r.status_code == 201, r.text
    created = r.json()
    assert (created["sync_state"], created["pools"]) == ("pending", [])
    assert len(fake.server.requests) == before, "registration must not call the cloud"

    (result,) = sync(wiring, {body["provider"]: provider})
    assert result.ok, result.error

    (listed,) = client.get("/v1/clusters", headers=admin).json()
    assert listed["sync_state"] == "ready"
    assert listed["synced_at"]
    got = {
        p["name"]: (p["gpu_model"], p["gpus_per_node"], p["sharing"], p["node_count"], p["min_size"], p["max_size"])
        for p in listed["pools"]
    }
    assert got == EXPECTED[body["provider"]]
    assert listed["kubernetes"]["gang"] == body["kubernetes"]["gang"]
    detail = client.get(f"/v1/clusters/{body['name']}", headers=admin).json()
    nodes = {p["name"]: len(p["nodes"]) for p in detail["pools"]}
    assert nodes == {name: shape[3] for name, shape in EXPECTED[body["provider"]].items()}

    # A second sync with nothing changed keeps pool and node ids (runs refer to them).
    ids = {p["id"] for p in detail["pools"]} | {n["id"] for p in detail["pools"] for n in p["nodes"]}
    wiring.settings.fleet_sync_interval = 0.0
    asyncio.run(sync_due(wiring.uow, {body["provider"]: provider}.__getitem__, "p", utc_now, 0.0))
    again = client.get(f"/v1/clusters/{body['name']}", headers=admin).json()
    assert {p["id"] for p in again["pools"]} | {n["id"] for p in again["pools"] for n in p["nodes"]} == ids


def test_pool_size_follows_the_cloud(client: TestClient, admin: dict[str, str], wiring: Wiring, key: KeyPair) -> None:
    fake = test_gke.FakeGoogle(key)
    fake.server.start()
    try:
        provider = gke_provider(fake, key)
        assert client.post("/v1/clusters", json=GKE_CLUSTER, headers=admin).status_code == 201
        sync(wiring, {"gke": provider})
        for zone in fake.pools["l4-shared"]["_sizes"]:
            fake.pools["l4-shared"]["_sizes"][zone] = 2  # the cloud autoscaler added a node per zone
        (result,) = asyncio.run(sync_due(wiring.uow, {"gke": provider}.__getitem__, "p", utc_now, 0.0))
        assert result.changes.resized == (("l4-shared", 3, 6),)
        pools = {p["name"]: p for p in client.get("/v1/clusters/gke-train", headers=admin).json()["pools"]}
        assert pools["l4-shared"]["node_count"] == 6
        assert len(pools["l4-shared"]["nodes"]) == 6
        assert pools["h100-mig"]["price_per_gpu_hour"] == 9.5
    finally:
        fake.server.stop()


def test_unreachable_cloud_is_an_error_on_the_cluster(
    client: TestClient, admin: dict[str, str], wiring: Wiring, key: KeyPair
) -> None:
    fake = test_gke.FakeGoogle(key)
    fake.server.start()
    provider = gke_provider(fake, key)
    body = dict(GKE_CLUSTER, cluster="missing")
    assert client.post("/v1/clusters", json=body, headers=admin).status_code == 201
    try:
        (result,) = sync(wiring, {"gke": provider})
    finally:
        fake.server.stop()
    assert not result.ok
    (listed,) = client.get("/v1/clusters", headers=admin).json()
    assert listed["sync_state"] == "error"
    assert "ClusterNotFound" in listed["sync_error"]
    assert listed["pools"] == []


def _kubeconfig(user: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
            "users": [{"name": "u", "user": user}],
        }
    )


def _kube_body(kubeconfig: str) -> dict[str, Any]:
    # Pools and nodes of a kubernetes cluster come from its nodes; prices are the operator's to give.
    return {"name": "onprem", "provider": "kubernetes", "kubeconfig": kubeconfig, "pool_prices": {"h100": 6.9}}


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh", "args": ["-c", "id"]}},
        {"auth-provider": {"name": "gcp"}},
        {"tokenFile": "/etc/shadow"},
    ],
)
def test_kubeconfig_that_runs_or_reads_anything_is_refused(
    user: dict[str, Any], client: TestClient, admin: dict[str, str], wiring: Wiring, tmp_path: Path
) -> None:
    client.app.state.kubeconfigs = FileKubeconfigStore(tmp_path / "kubeconfigs")  # type: ignore[attr-defined]
    r = client.post("/v1/clusters", json=_kube_body(_kubeconfig(user)), headers=admin)
    assert r.status_code == 422, r.text
    assert client.get("/v1/clusters", headers=admin).json() == []
    assert not (tmp_path / "kubeconfigs").exists() or not list((tmp_path / "kubeconfigs").iterdir())


def test_kubeconfig_token_is_kept_in_a_private_file_not_in_sql(
    client: TestClient, admin: dict[str, str], wiring: Wiring, tmp_path: Path
) -> None:
    secret = "sha256~very-secret-service-account-token"
    client.app.state.kubeconfigs = FileKubeconfigStore(tmp_path / "kubeconfigs")  # type: ignore[attr-defined]
    r = client.post("/v1/clusters", json=_kube_body(_kubeconfig({"token": secret})), headers=admin)
    assert r.status_code == 201, r.text
    cluster = r.json()
    assert cluster["provider"] == "kubernetes"
    assert cluster["pools"] == []  # discovered from the cluster's node inventory
    (stored,) = list((tmp_path / "kubeconfigs").iterdir())
    assert stored.name == f"{cluster['id']}.kubeconfig"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert secret in stored.read_text()
    engine = create_engine(wiring.settings.database_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        for table in ("clusters", "audit_log"):
            rows = conn.execute(text(f"SELECT * FROM {table}")).all()
            assert rows
            assert all(secret not in str(row) for row in rows)
    engine.dispose()
    assert client.delete("/v1/clusters/onprem", headers=admin).status_code == 204
    assert not stored.exists()


def test_cloud_registration_is_validated(client: TestClient, admin: dict[str, str]) -> None:
    no_region = {k: v for k, v in GKE_CLUSTER.items() if k != "region"}
    assert client.post("/v1/clusters", json=no_region, headers=admin).status_code == 422
    with_pools = dict(GKE_CLUSTER, pools=h100_cluster()["pools"])
    assert client.post("/v1/clusters", json=with_pools, headers=admin).status_code == 422
    sim_with_account = dict(h100_cluster(), account="123")
    assert client.post("/v1/clusters", json=sim_with_account, headers=admin).status_code == 422
    assert client.post("/v1/clusters", json=dict(GKE_CLUSTER, kubeconfig="x"), headers=admin).status_code == 422
