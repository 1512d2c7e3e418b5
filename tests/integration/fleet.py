"""Builders for integration tests: a small fleet, a team with a queue, and tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.testclient import TestClient

from controlplane.bootstrap import Wiring, utc_now
from controlplane.service.auth import issue_token
from controlplane.service.commands import TokenSpec

GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def h100_cluster(name: str = "sim-h100", nodes: int = 4) -> dict[str, Any]:
    return {
        "name": name,
        "pools": [
            {
                "name": "h100",
                "gpu_model": "H100-80GB",
                "gpus_per_node": 8,
                "cpu_millis": 192000,
                "memory_mib": 2_000_000,
                "taints": GPU_TAINT,
                "node_count": nodes,
                "price_per_gpu_hour": 6.9,
            },
        ],
    }


def mixed_cluster(name: str = "sim-mixed") -> dict[str, Any]:
    return {
        "name": name,
        "pools": [
            {
                "name": "a100-mig",
                "gpu_model": "A100-80GB",
                "gpus_per_node": 2,
                "cpu_millis": 48000,
                "memory_mib": 400_000,
                "sharing": "mig:all-balanced",
                "node_count": 2,
            },
            {
                "name": "l4-shared",
                "gpu_model": "L4",
                "gpus_per_node": 4,
                "cpu_millis": 48000,
                "memory_mib": 192_000,
                "sharing": "timeslice:4",
                "node_count": 2,
            },
        ],
    }


def gang(name: str, queue: str, replicas: int = 4, gpus: int = 8, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "queue": queue,
        "pod_sets": [{"name": "workers", "replicas": replicas, "gpus": gpus}],
    }
    body.update(extra)
    return body


@dataclass
class Tenant:
    team: str
    queue: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def admin_headers(wiring: Wiring) -> dict[str, str]:
    _, raw = issue_token(wiring.uow(), TokenSpec(name="test-admin", role="admin"), "test", utc_now())
    return {"Authorization": f"Bearer {raw}"}


def setup_fleet(client: TestClient, admin: dict[str, str], *clusters: dict[str, Any]) -> None:
    for spec in clusters or (h100_cluster(),):
        r = client.post("/v1/clusters", json=spec, headers=admin)
        assert r.status_code == 201, r.text
    r = client.post("/v1/priority-classes", json={"name": "batch", "value": 100, "is_default": True}, headers=admin)
    assert r.status_code == 201, r.text
    r = client.post("/v1/priority-classes", json={"name": "urgent", "value": 1000}, headers=admin)
    assert r.status_code == 201, r.text


def add_tenant(
    client: TestClient, admin: dict[str, str], team: str, queue: str, limit: dict[str, float] | None = None
) -> Tenant:
    r = client.post("/v1/teams", json={"name": team}, headers=admin)
    assert r.status_code == 201, r.text
    r = client.post("/v1/queues", json={"name": queue, "team": team, "limit": limit or {}}, headers=admin)
    assert r.status_code == 201, r.text
    r = client.post("/v1/tokens", json={"name": f"{team}-ci", "team": team}, headers=admin)
    assert r.status_code == 201, r.text
    return Tenant(team, queue, r.json()["token"])


# A hoarding story in seconds: 2-second telemetry windows, idle from the first window, reclaimed
# after three. The idle end-to-end tests and the dashboard's browser test play it.
FAST_WINDOW = 2
FAST_IDLE_POLICY: dict[str, Any] = {
    "default": {
        "grace_seconds": 0,
        "notify_after": 1,
        "deprioritize_after": 2,
        "reclaim_after": 3,
        "min_samples_per_gpu": 3,
        "stale_seconds": 4 * FAST_WINDOW,
    },
    "working_hours": None,
}
HOARDER_CONTAINER = {"sim": {"utilization": "idle_after:1"}}
