"""Requests the device plugin really serves: resource names from what the pool's nodes advertise,
per-cluster overrides, and shares one container may not ask for (pure, no server)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from adapters.kubernetes.manifests import KubeSettings, ManifestError, build_run_manifests
from adapters.kubernetes.nodes import observe_node
from controlplane.domain.model import CPU, GPU, MEM, SHARE, NodePool, PodSet
from controlplane.service.node_pools import plan_node_pools
from tests.kubernetes.conftest import small_order
from tests.kubernetes.nodes import presets as real

POOL_KEY = "example.com/gpu-pool"


def pool_of(node: dict[str, Any], one_share_per_container: bool = False) -> NodePool:
    """The pool the node inventory makes of one real node, as the core and the manifests see it."""
    (synced,) = plan_node_pools([observe_node(node, POOL_KEY)], one_share_per_container=one_share_per_container).pools
    pool = synced.spec.to_pool("pool-1", "cl-1")
    return dataclasses.replace(
        pool, resource_names=dict(synced.resource_names), max_shares_per_pod=synced.max_shares_per_pod
    )


def limits(pool: NodePool, demand: dict[str, int], settings: KubeSettings | None = None) -> dict[str, str]:
    order = small_order("run-rn", pool.name, demand)
    [job] = build_run_manifests(order, {pool.name: pool}, settings or KubeSettings()).workloads
    result: dict[str, str] = job.body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    return {k: v for k, v in result.items() if k not in ("cpu", "memory")}


BASE = {CPU: 1_000, MEM: 4_096}


def test_whole_gpus() -> None:
    assert limits(pool_of(real.eks_p5("n1")), {**BASE, GPU: 8}) == {"nvidia.com/gpu": "8"}


def test_time_slicing_with_and_without_rename() -> None:
    renamed = pool_of(real.aks_h100_timeslice("n1"))
    assert limits(renamed, {**BASE, SHARE: 2}) == {"nvidia.com/gpu.shared": "2"}
    plain = pool_of(real.aks_h100_timeslice("n1", renamed=False))
    assert limits(plain, {**BASE, SHARE: 2}) == {"nvidia.com/gpu": "2"}
    # The cluster's setting wins over what the nodes advertise.
    override = KubeSettings(timeslice_resource="example.com/vgpu")
    assert limits(renamed, {**BASE, SHARE: 1}, override) == {"example.com/vgpu": "1"}


def test_mig_mixed_single_and_gke() -> None:
    mixed = pool_of(real.onprem_a100_mixed("n1"))
    assert limits(mixed, {**BASE, "mig:2g.20gb": 1}) == {"nvidia.com/mig-2g.20gb": "1"}
    single = pool_of(real.onprem_a100_single("n1"))
    assert limits(single, {**BASE, "mig:1g.5gb": 1}) == {"nvidia.com/gpu": "1"}
    gke = pool_of(real.gke_h100_mig("n1"))
    assert limits(gke, {**BASE, "mig:1g.10gb": 2}) == {"nvidia.com/gpu": "2"}
    # An operator who knows better may force a strategy for the whole cluster.
    assert limits(gke, {**BASE, "mig:1g.10gb": 1}, KubeSettings(mig_strategy="mixed")) == {
        "nvidia.com/mig-1g.10gb": "1"
    }
    assert limits(mixed, {**BASE, "mig:2g.20gb": 1}, KubeSettings(mig_strategy="single")) == {"nvidia.com/gpu": "1"}


def test_gke_time_sharing_and_mps_serve_one_share_per_container() -> None:
    gke = pool_of(real.gke_l4_time_sharing("n1"))
    assert limits(gke, {**BASE, SHARE: 1}) == {"nvidia.com/gpu": "1"}
    mps = pool_of(real.oke_h100_mps("n1"))
    assert limits(mps, {**BASE, SHARE: 1}) == {"nvidia.com/gpu": "1"}
    with pytest.raises(ManifestError, match="serves at most 1"):
        limits(mps, {**BASE, SHARE: 2})


def test_pools_without_recorded_names_keep_the_plugin_defaults() -> None:
    pool = dataclasses.replace(pool_of(real.onprem_a100_mixed("n1")), resource_names={})
    assert limits(pool, {**BASE, "mig:3g.40gb": 1}) == {"nvidia.com/mig-3g.40gb": "1"}


@pytest.mark.parametrize("name", ["gpu", "kubernetes.io/gpu", "NVIDIA.com/gpu", "nvidia.com/", "requests.x.io/g"])
def test_resource_name_settings_are_validated(name: str) -> None:
    with pytest.raises(ManifestError, match="extended resource"):
        KubeSettings(mps_resource=name)


def test_a_fraction_the_device_plugin_refuses_is_explained() -> None:
    mps = pool_of(real.oke_h100_mps("n1"))
    half = PodSet("infer", 1, gpu_fraction=0.5)
    quarter = PodSet("infer", 1, gpu_fraction=0.25)
    assert quarter.share_limit_refusal(mps) is None
    assert quarter.demand_on(mps) == {CPU: 1000, MEM: 4096, SHARE: 1}
    reason = half.share_limit_refusal(mps)
    assert reason == (
        "pod set infer asks 0.5 GPU per pod, which is 2 shares of pool "
        f"{mps.name} (mps:4: one share is 1/4 GPU), but the device plugin there gives a container at most "
        "1 share; ask for at most 0.25 GPU per pod or use whole GPUs"
    )
    assert half.demand_on(mps) is None  # the core never plans it there
    # Time-slicing serves more per container unless the cluster says failRequestsGreaterThanOne.
    ts = pool_of(real.aks_h100_timeslice("n1"))
    assert half.share_limit_refusal(ts) is None
    strict = pool_of(real.aks_h100_timeslice("n1"), one_share_per_container=True)
    assert half.share_limit_refusal(strict) is not None
