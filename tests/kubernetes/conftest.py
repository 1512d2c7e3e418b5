"""Fixtures for the Kubernetes adapter: a fake API server and orders the core could have made."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from adapters.kubernetes.api_client import configuration_for
from controlplane.domain.model import CPU, GPU, MEM, SHARE, NodePool, Taint
from controlplane.domain.sharing import SharingKind, SharingMode
from controlplane.service.ports import PodOrder, RunOrder
from tests.kubernetes.fake_apiserver import FakeApiServer

NAMESPACE = "gpufleet"
TOKEN = "fake-token"


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    with FakeApiServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def kube_config(fake_api: FakeApiServer) -> client.Configuration:
    return configuration_for(fake_api.url, TOKEN)


def pools() -> dict[str, NodePool]:
    return {
        "h100": NodePool(
            id="p1",
            cluster_id="c1",
            name="h100",
            gpu_model="H100-80GB",
            gpus_per_node=8,
            cpu_millis=192_000,
            memory_mib=2_000_000,
            taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"), Taint("team", "ml", "NoExecute")),
        ),
        "a100-mig": NodePool(
            id="p2",
            cluster_id="c1",
            name="a100-mig",
            gpu_model="A100-80GB",
            gpus_per_node=8,
            cpu_millis=96_000,
            memory_mib=1_000_000,
            sharing=SharingMode(SharingKind.MIG, mig_layout="all-balanced"),
            taints=(Taint("sku", "gpu", "NoSchedule"),),
        ),
        "l4-ts": NodePool(
            id="p3",
            cluster_id="c1",
            name="l4-ts",
            gpu_model="L4",
            gpus_per_node=1,
            cpu_millis=8_000,
            memory_mib=32_000,
            sharing=SharingMode(SharingKind.TIMESLICE, replicas=4),
        ),
        "l4-mps": NodePool(
            id="p4",
            cluster_id="c1",
            name="l4-mps",
            gpu_model="L4",
            gpus_per_node=1,
            cpu_millis=8_000,
            memory_mib=32_000,
            sharing=SharingMode(SharingKind.MPS, replicas=4),
            taints=(Taint("dedicated", "", "NoSchedule"),),
        ),
    }


def training_order(
    run_id: str = "run-0123456789abcdef0123",
    epoch: int = 3,
    *,
    container: dict[str, object] | None = None,
    duration: float | None = None,
) -> RunOrder:
    """4 workers on 2 H100 nodes (indices 0,2 on node-a and 1,3 on node-b) plus 1 launcher."""
    worker = {CPU: 16_000, MEM: 200_000, GPU: 4}
    pods = (
        PodOrder("worker", 0, "node-a", "h100", worker),
        PodOrder("worker", 1, "node-b", "h100", worker),
        PodOrder("worker", 2, "node-a", "h100", worker),
        PodOrder("worker", 3, "node-b", "h100", worker),
        PodOrder("launcher", 0, "node-c", "h100", {CPU: 2_000, MEM: 8_192, GPU: 1}),
    )
    return RunOrder(
        run_id=run_id,
        workload_id="wl-42",
        workload_name="llm-pretrain",
        team="research",
        queue="ml",
        cluster="east",
        epoch=epoch,
        attempt=1,
        priority_class="high",
        min_available=5,
        pods=pods,
        duration_seconds=duration,
        container=container if container is not None else {"image": "trainer:1.2", "command": ["python", "train.py"]},
    )


def small_order(run_id: str, pool: str, demand: dict[str, int], replicas: int = 1) -> RunOrder:
    return RunOrder(
        run_id=run_id,
        workload_id="wl-7",
        workload_name="notebook",
        team="research",
        queue="ml",
        cluster="east",
        epoch=1,
        attempt=1,
        priority_class="",
        min_available=replicas,
        pods=tuple(PodOrder("main", i, f"{pool}-node", pool, demand) for i in range(replicas)),
        duration_seconds=None,
    )


SHARED_DEMAND = {CPU: 1_000, MEM: 4_096, SHARE: 2}
