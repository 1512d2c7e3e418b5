"""The provider-neutral parts of the cloud port: scale planning, pool mapping, access values, the factory."""

from __future__ import annotations

import pickle
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from adapters.clouds import build_provider
from adapters.clouds.aks.provider import AksProvider, agent_pool_to_pool, parse_taint
from adapters.clouds.eks import EksProvider
from adapters.clouds.gke import GkeProvider
from adapters.clouds.oke import OkeProvider
from adapters.clouds.shapes import mig_profile_for_slices
from controlplane.domain.model import Taint
from controlplane.service.cloud_ports import (
    CloudError,
    CloudProvider,
    ClusterLocator,
    DiscoveredPool,
    KubeAccess,
    ScaleRefused,
    UnmappablePool,
    autoscaling_bounds,
    plan_scale,
    to_pool_spec,
)

POOL = DiscoveredPool(
    name="h100",
    gpu_model="H100-80GB",
    gpus_per_node=8,
    instance_type="p5.48xlarge",
    sharing="exclusive",
    cpu_millis=192_000,
    memory_mib=2_097_152,
    taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),),
    labels={"team": "research"},
    node_count=2,
    min_size=1,
    max_size=4,
    spot=False,
)


def test_plan_scale_rules() -> None:
    assert plan_scale(POOL, 3) == replace(plan_scale(POOL, 3), previous=2, desired=3, changed=True, clamped=False)
    assert plan_scale(POOL, 2).changed is False
    clamped = plan_scale(POOL, 9)
    assert (clamped.desired, clamped.clamped, clamped.changed) == (4, True, True)
    with pytest.raises(ScaleRefused, match="below its minimum"):
        plan_scale(POOL, 0)
    with pytest.raises(ScaleRefused, match="negative"):
        plan_scale(replace(POOL, min_size=0), -2)
    unbounded = plan_scale(replace(POOL, max_size=None), 500)
    assert (unbounded.desired, unbounded.clamped) == (500, False)


def test_to_pool_spec_refuses_pools_with_issues_or_bad_values() -> None:
    with pytest.raises(UnmappablePool, match="not in gpufleet's table"):
        to_pool_spec(replace(POOL, issues=("GPU instance types not in gpufleet's table: p9.huge",)))
    with pytest.raises(UnmappablePool, match="no GPUs"):
        to_pool_spec(replace(POOL, gpu_model="", gpus_per_node=0))
    with pytest.raises(UnmappablePool, match="pattern"):
        to_pool_spec(replace(POOL, name="GPU_Pool"))  # EKS allows names gpufleet does not
    with pytest.raises(UnmappablePool, match="MIG"):
        to_pool_spec(replace(POOL, gpu_model="L4", sharing="mig:all-1g.10gb"))
    assert to_pool_spec(POOL).taints[0].effect == "NoSchedule"


def test_kube_access_keeps_its_token_out_of_repr_and_storage() -> None:
    access = KubeAccess("https://k8s.example:443", "s3cr3t-token", "LS0t", datetime(2030, 1, 1, tzinfo=UTC))
    assert "s3cr3t-token" not in repr(access)
    with pytest.raises(TypeError, match="never serialised"):
        pickle.dumps(access)
    now = datetime(2029, 12, 31, 23, 59, tzinfo=UTC)
    assert access.expires_within(timedelta(minutes=2), now) is True
    assert access.expires_within(timedelta(seconds=30), now) is False


def test_locator_validates_provider_and_name() -> None:
    with pytest.raises(ValueError, match="not one of"):
        ClusterLocator("sim", "acct", "r", "c")
    with pytest.raises(ValueError, match="cluster name"):
        ClusterLocator("eks", "acct", "r", "")


def test_factory_rejects_unknown_providers_and_builds_protocol_instances() -> None:
    with pytest.raises(ValueError, match="eks, aks, gke, oke"):
        build_provider("digitalocean")
    provider = build_provider("eks", endpoint_url="http://127.0.0.1:9")
    assert isinstance(provider, EksProvider)
    assert isinstance(provider, CloudProvider)


def test_autoscaling_bounds_is_a_checkable_capability() -> None:
    def noop(*_: Any) -> Any:
        raise AssertionError("not called")

    eks = EksProvider(noop)
    aks = AksProvider(noop, object())
    oke = OkeProvider(noop)
    assert autoscaling_bounds(eks) is eks
    assert autoscaling_bounds(aks) is aks
    assert autoscaling_bounds(oke) is None
    assert hasattr(GkeProvider, "set_autoscaling_bounds")


def test_aks_taints_and_mig_profiles() -> None:
    assert parse_taint("sku=gpu:NoSchedule") == Taint("sku", "gpu", "NoSchedule")
    assert parse_taint("dedicated:NoExecute") == Taint("dedicated", "", "NoExecute")
    with pytest.raises(CloudError):
        parse_taint("sku=gpu")
    assert mig_profile_for_slices("A100-40GB", 1) == "1g.5gb"
    assert mig_profile_for_slices("A100-80GB", 1) == "1g.10gb"
    assert mig_profile_for_slices("H200-141GB", 7) == "7g.141gb"
    assert mig_profile_for_slices("T4", 1) is None


class _AgentPool:
    def __init__(self, **fields: Any) -> None:
        defaults = {
            "name": "gpu",
            "vm_size": "Standard_ND96asr_v4",
            "gpu_instance_profile": None,
            "node_taints": None,
            "node_labels": None,
            "availability_zones": None,
            "enable_auto_scaling": False,
            "min_count": None,
            "max_count": None,
            "mode": "User",
            "count": 1,
            "scale_set_priority": None,
            "provisioning_state": "Succeeded",
        }
        self.__dict__.update({**defaults, **fields})


def test_aks_pool_issues_for_unknown_or_fractional_sizes_and_bad_taints() -> None:
    assert agent_pool_to_pool(_AgentPool(gpu_instance_profile="MIG1g"), "eastus").sharing == "mig:all-1g.5gb"
    fractional = agent_pool_to_pool(_AgentPool(vm_size="Standard_NV6ads_A10_v5"), "eastus")
    assert fractional.issues == ("Standard_NV6ads_A10_v5 carries a fraction of a GPU through vGPU",)
    unknown = agent_pool_to_pool(_AgentPool(vm_size="Standard_ND128isr_NDR_GB200_v6"), "eastus")
    assert "not in gpufleet's table" in unknown.issues[0]
    tainted = agent_pool_to_pool(_AgentPool(node_taints=["broken"]), "eastus")
    assert "key=value:Effect" in tainted.issues[0]
    mig_on_t4 = agent_pool_to_pool(_AgentPool(vm_size="Standard_NC4as_T4_v3", gpu_instance_profile="MIG1g"), "")
    assert "not in gpufleet's MIG tables" in mig_on_t4.issues[0]
