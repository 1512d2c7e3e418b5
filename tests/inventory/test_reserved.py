"""What other pods hold of a node, counted the way kube-scheduler counts a pod, and what a pool then
offers gangs (pure). Pod shapes follow the Pod API (sidecars are init containers with
`restartPolicy: Always`, Kubernetes 1.29+; `spec.overhead` comes from the RuntimeClass)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from adapters.kubernetes.nodes import observe_node
from adapters.kubernetes.reserved import pod_requests, reserved_by_node
from controlplane.service.inventory_node import InventoryNode
from controlplane.service.node_pools import plan_node_pools
from tests.kubernetes.nodes import presets as real

MIB = 1024 * 1024


def _container(cpu: str | None = None, memory: str | None = None, **extra: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": f"c{len(requests)}", "image": "x", "resources": {"requests": requests}, **extra}


def _pod(node: str, *containers: dict[str, Any], phase: str = "Running", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "kube-system", "labels": spec.pop("labels", {})},
        "spec": {"nodeName": node, "containers": list(containers), **spec},
        "status": {"phase": phase},
    }


def test_app_containers_add_up_and_quantities_round_up() -> None:
    pod = _pod("n1", _container("100m", "64Mi"), _container("0.0005", "1Ki"))
    assert pod_requests(pod) == {"cpu": 101, "memory": 64 * MIB + 1024}


def test_an_init_container_needs_its_request_alone_and_sidecars_run_beside_the_app() -> None:
    init = _container("2", "1Gi")  # runs alone before the app: the pod needs 2 CPUs while it does
    sidecar = _container("100m", "128Mi", restartPolicy="Always")
    pod = _pod("n1", _container("500m", "256Mi"), initContainers=[sidecar, init])
    # app + sidecar = 600m / 384Mi; init with the sidecar started before it = 2100m / 1152Mi
    assert pod_requests(pod) == {"cpu": 2100, "memory": 1152 * MIB}


def test_runtime_class_overhead_comes_on_top() -> None:
    pod = _pod("n1", _container("250m"), overhead={"cpu": "250m", "memory": "120Mi"})
    assert pod_requests(pod) == {"cpu": 500, "memory": 120 * MIB}


def test_only_live_bound_pods_gpufleet_did_not_place_are_counted() -> None:
    pods = [
        _pod("n1", _container("200m", "100Mi")),  # a DaemonSet pod
        _pod("n1", _container("1", "1Gi"), labels={"gpufleet.io/run": "run-0123456789abcdef0123-1"}),  # ours
        _pod("n1", _container("3"), phase="Succeeded"),  # finished: holds nothing
        _pod("", _container("5")),  # not bound yet
        _pod("n2", {"name": "gpu", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "1"}}}),
        _pod("n2", {"name": "bad", "image": "x", "resources": {"requests": {"cpu": "lots"}}}),  # unreadable
    ]
    assert reserved_by_node(pods) == {"n1": {"cpu": 200, "memory": 100 * MIB}, "n2": {"nvidia.com/gpu": 1}}


def test_a_pool_offers_what_its_busiest_node_has_left_and_nodes_with_foreign_gpu_pods_are_held_back() -> None:
    nodes = [observe_node(real.onprem_h100(f"h100-{i}")) for i in range(3)]
    allocatable_cpu = nodes[0].allocatable["cpu"]
    allocatable_mib = nodes[0].allocatable["memory"] // MIB
    reserved = {
        "h100-0": {"cpu": 200, "memory": 300 * MIB},
        "h100-1": {"cpu": 700, "memory": 100 * MIB},
        "h100-2": {"cpu": 100, "nvidia.com/gpu": 2},
    }
    plan = plan_node_pools([n.model_copy(update={"reserved": reserved[n.name]}) for n in nodes])
    (pool,) = plan.pools
    assert pool.spec.cpu_millis == allocatable_cpu - 700
    assert pool.spec.memory_mib == allocatable_mib - 300
    assert plan.held_back == {"h100-2"}
    assert any("h100-2: 2 nvidia.com/gpu" in issue and "take no new work" in issue for issue in plan.issues)


def test_without_a_pod_list_the_pool_is_planned_on_bare_allocatable() -> None:
    node = observe_node(real.onprem_h100("h100-0"))
    assert node.reserved is None
    (pool,) = plan_node_pools([node]).pools
    assert pool.spec.cpu_millis == node.allocatable["cpu"]


def test_an_inventory_report_cannot_add_capacity_with_negative_or_huge_amounts() -> None:
    """A report is input from a cluster's credential: what it says is reserved can only take away."""
    node = observe_node(real.onprem_h100("h100-0"))
    for bad in ({"cpu": -64_000}, {"memory": 2**64}):
        with pytest.raises(ValidationError):
            InventoryNode.model_validate({**node.model_dump(), "reserved": bad})
        with pytest.raises(ValidationError):
            InventoryNode.model_validate({**node.model_dump(), "allocatable": bad})
