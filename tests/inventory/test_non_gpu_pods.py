"""The inventory's summary of pods that use no GPU on GPU nodes (pure), from Pod API shapes: a
DaemonSet's pods, a node's static pods, gpufleet's own and GPU pods (whole GPUs, MIG instances,
shared replicas, renamed resources, requested or only limited) are left out; the list is bounded."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from adapters.kubernetes.reserved import non_gpu_pods_by_node
from controlplane.service.inventory_node import NonGpuPods


def _pod(
    name: str,
    node: str = "gpu-1",
    namespace: str = "team-x",
    resources: dict[str, Any] | None = None,
    owner: str | None = "ReplicaSet",
    labels: dict[str, str] | None = None,
    phase: str = "Running",
    init: bool = False,
) -> dict[str, Any]:
    container = {"name": "c", "image": "busybox", "resources": resources or {"requests": {"cpu": "100m"}}}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": f"{name}-owner", "uid": "u"}]
    # `init`: the resources are an init container's, beside an app container that asks for nothing
    spec: dict[str, Any] = {"nodeName": node, "containers": [container]}
    if init:
        spec = {"nodeName": node, "initContainers": [container], "containers": [{"name": "app", "image": "x"}]}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_only_pods_that_use_no_gpu_and_belong_on_no_node_by_design_are_counted() -> None:
    pods = [
        _pod("web-1"),
        _pod("batch-cpu", owner="Job", namespace="etl"),
        _pod("bare", owner=None),
        _pod("dcgm-exporter-x", namespace="gpu-operator", owner="DaemonSet"),
        _pod("kube-proxy-gpu-1", namespace="kube-system", owner="Node"),  # a static pod's mirror
        _pod("trainer", resources={"limits": {"nvidia.com/gpu": "1"}}),  # limits alone request it too
        _pod("mig", resources={"requests": {"nvidia.com/mig-3g.40gb": "1"}}),
        _pod("shared", resources={"requests": {"nvidia.com/gpu.shared": "1"}}),
        _pod("renamed", resources={"requests": {"example.com/l4-slice": "1"}}),
        _pod("init-gpu", resources={"limits": {"nvidia.com/gpu": "1"}}, init=True),
        _pod("ours", labels={"gpufleet.io/run": "r-1"}),
        _pod("done", phase="Succeeded"),
        _pod("other-node", node="gpu-2"),
    ]
    found = non_gpu_pods_by_node(pods, gpu_resources={"example.com/l4-slice"})
    assert found == {
        "gpu-1": (3, ("etl/batch-cpu", "team-x/bare", "team-x/web-1")),
        "gpu-2": (1, ("team-x/other-node",)),
    }
    # without the node's own resource name, the renamed GPU resource is not known as one
    assert non_gpu_pods_by_node(pods)["gpu-1"][0] == 4


def test_the_list_is_bounded_and_the_count_is_not() -> None:
    found = non_gpu_pods_by_node([_pod(f"web-{i:02d}") for i in range(30)])
    count, sample = found["gpu-1"]
    assert count == 30
    assert sample == tuple(f"team-x/web-{i:02d}" for i in range(8))


def test_the_report_field_is_bounded() -> None:
    with pytest.raises(ValidationError):
        NonGpuPods(count=9, sample=[f"ns/p{i}" for i in range(9)])
    with pytest.raises(ValidationError):
        NonGpuPods(count=-1, sample=[])
