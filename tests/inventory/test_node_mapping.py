"""Real Node objects -> inventory nodes -> gpufleet pools, per provider flavour (pure, no I/O)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from adapters.kubernetes.node_gpus import gpu_model_name
from adapters.kubernetes.nodes import observe_node
from adapters.kubernetes.quantities import BadQuantity, parse_quantity, quantity_units
from controlplane.domain.model import Taint
from controlplane.service.cloud_ports import DiscoveredPool
from controlplane.service.node_pools import CLOUD_ISSUE, plan_node_pools, pool_name
from tests.kubernetes.nodes import presets as real

MIB = 1024 * 1024


def cloud_pool(
    name: str,
    gpu_model: str,
    gpus_per_node: int,
    instance_type: str,
    *,
    node_count: int,
    max_size: int,
    cpu_millis: int = 0,
    memory_mib: int = 0,
    taints: tuple[Taint, ...] = (),
    pool_id: str = "",
) -> DiscoveredPool:
    """A node pool as a cloud API describes it: on demand, exclusive GPUs, no labels, scaling from 0."""
    return DiscoveredPool(
        name=name,
        gpu_model=gpu_model,
        gpus_per_node=gpus_per_node,
        instance_type=instance_type,
        sharing="exclusive",
        cpu_millis=cpu_millis,
        memory_mib=memory_mib,
        taints=taints,
        labels={},
        node_count=node_count,
        min_size=0,
        max_size=max_size,
        spot=False,
        pool_id=pool_id,
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("191450m", Decimal("191.45")),
        ("2003307344Ki", Decimal(2003307344 * 1024)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("8", Decimal(8)),
        ("1e3", Decimal(1000)),
        ("100M", Decimal(10**8)),
        (".5", Decimal("0.5")),
        ("0", Decimal(0)),
    ],
)
def test_quantities_are_read_like_kubernetes(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1.5GiB", "Gi", "1 Gi", "12x", "1e99", "--1", "1" * 80])
def test_bad_quantities_are_refused(text: str) -> None:
    with pytest.raises(BadQuantity):
        parse_quantity(text)


def test_cpu_is_counted_in_millicores_and_memory_in_bytes() -> None:
    assert quantity_units("cpu", "191450m") == 191450
    assert quantity_units("cpu", "96") == 96000
    assert quantity_units("memory", "1.5Ti") == 3 * 2**39
    assert quantity_units("nvidia.com/gpu", "8") == 8


@pytest.mark.parametrize(
    ("product", "model"),
    [
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA-H100-80GB-HBM3-SHARED", "H100-80GB"),
        ("NVIDIA-H100-NVL", "H100-NVL-94GB"),
        ("NVIDIA-H200", "H200-141GB"),
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
        ("Tesla-T4", "T4"),
        ("Tesla-V100-SXM2-16GB", "V100-16GB"),
        ("NVIDIA-L4", "L4"),
        ("NVIDIA-L40S", "L40S"),
        ("NVIDIA-A10G", "A10G"),
        ("NVIDIA-B200", "B200"),
        ("NVIDIA-GB200", "GB200"),
        # Unknown products are kept as their own model, never dropped.
        ("NVIDIA-RTX-A6000", "NVIDIA-RTX-A6000"),
        ("Quadro RTX 8000", "Quadro-RTX-8000"),
    ],
)
def test_gpu_products_become_gpufleet_models(product: str, model: str) -> None:
    assert gpu_model_name(product) == model


def test_eks_managed_node_group() -> None:
    n = observe_node(real.eks_p5("ip-10-0-1-17.ec2.internal"))
    assert (n.name, n.pool, n.gpu_model, n.gpu_count, n.sharing) == (
        "ip-10-0-1-17.ec2.internal",
        "p5-reserved",
        "H100-80GB",
        8,
        "exclusive",
    )
    assert n.allocatable["cpu"] == 191450
    # 2048 GiB less the EKS AMI's reservation (11 MiB x 110 pods + 255 MiB) and the 100 MiB eviction threshold.
    assert n.allocatable["memory"] == 2145881088 * 1024
    assert n.capacity["cpu"] == 192000
    assert n.gpu_resources == {"gpu": "nvidia.com/gpu"}
    assert (n.instance_type, n.spot, n.schedulable, n.ready) == ("p5.48xlarge", False, True, True)
    assert n.labels["eks.amazonaws.com/nodegroup"] == "p5-reserved"
    assert "nvidia.com/cuda.driver-version.full" not in n.labels  # only what was read is kept
    plan = plan_node_pools([n, observe_node(real.cpu_node("ip-10-0-9-1.ec2.internal"))])
    (pool,) = plan.pools
    assert pool.spec.name == "p5-reserved"
    # Capacity is what the kubelet reports allocatable, not the instance's 192 vCPUs / 2 TiB.
    assert (pool.spec.cpu_millis, pool.spec.memory_mib) == (191450, 2145881088 // 1024)
    assert pool.node_names == ("ip-10-0-1-17.ec2.internal",)
    assert pool.spec.labels == {"topology.kubernetes.io/zone": "us-east-1a"}
    assert plan.issues == ()


def test_karpenter_node_pool_without_gfd() -> None:
    n = observe_node(real.karpenter_l40s("ip-10-0-3-4.ec2.internal"))
    assert (n.pool, n.gpu_model, n.gpu_count, n.sharing, n.spot) == ("gpu-spot", "L40S", 4, "exclusive", True)
    (pool,) = plan_node_pools([n]).pools
    assert pool.spec.spot
    assert [t.model_dump() for t in pool.spec.taints] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    ]


def test_aks_time_slicing_renamed_and_not() -> None:
    renamed = observe_node(real.aks_h100_timeslice("aks-gpunp-38214067-vmss000000"))
    assert (renamed.pool, renamed.gpu_model, renamed.gpu_count, renamed.sharing) == (
        "gpunp",
        "H100-80GB",
        8,
        "timeslice:4",
    )
    assert renamed.gpu_resources == {"share": "nvidia.com/gpu.shared"}
    assert renamed.shares_per_container == 0  # time-slicing allows more unless the cluster says otherwise
    plain = observe_node(real.aks_h100_timeslice("aks-gpunp-38214067-vmss000001", renamed=False))
    assert plain.gpu_model == "H100-80GB"  # the -SHARED suffix is not part of the model
    assert plain.gpu_resources == {"share": "nvidia.com/gpu"}
    (pool,) = plan_node_pools([renamed], one_share_per_container=True).pools
    assert (pool.spec.sharing, pool.max_shares_per_pod) == ("timeslice:4", 1)
    assert pool.spec.taints[0].key == "sku"


def test_gke_mig_partitions_are_whole_gpu_resources() -> None:
    n = observe_node(real.gke_h100_mig("gke-train-h100-mig-9c1f2e3a-x7kq"))
    assert (n.pool, n.gpu_model, n.gpu_count, n.sharing) == ("h100-mig", "H100-80GB", 8, "mig:all-1g.10gb")
    assert n.gpu_resources == {"mig:1g.10gb": "nvidia.com/gpu"}
    (pool,) = plan_node_pools([n]).pools
    assert pool.resource_names == {"mig:1g.10gb": "nvidia.com/gpu"}
    assert pool.spec.to_pool("p", "c").node_capacity()["mig:1g.10gb"] == 56


@pytest.mark.parametrize("strategy", ["time-sharing", "TIME_SHARING"])
def test_gke_time_sharing_allows_one_share_per_container(strategy: str) -> None:
    n = observe_node(real.gke_l4_time_sharing("gke-train-l4-shared-1b2c-0", strategy))
    assert (n.gpu_model, n.gpu_count, n.sharing, n.shares_per_container) == ("L4", 2, "timeslice:4", 1)
    assert n.gpu_resources == {"share": "nvidia.com/gpu"}
    assert n.spot
    mps = observe_node(real.gke_l4_time_sharing("gke-train-l4-shared-1b2c-1", "MPS"))
    assert (mps.sharing, mps.shares_per_container) == ("mps:4", 1)


def test_oke_pool_comes_from_the_annotation_and_joins_the_cloud_pool() -> None:
    n = observe_node(real.oke_h100_mps("10.0.10.7"))
    assert n.pool == real.OKE_POOL
    assert n.annotations == {"oci.oraclecloud.com/node-pool-id": real.OKE_POOL}
    assert (n.gpu_model, n.gpu_count, n.sharing, n.shares_per_container) == ("H100-80GB", 8, "mps:4", 1)
    assert n.gpu_resources == {"share": "nvidia.com/gpu"}
    # Without the cloud's description the pool gets a stable name made from the OCID ...
    (alone,) = plan_node_pools([n]).pools
    assert alone.spec.name == pool_name(real.OKE_POOL)
    assert alone.cloud_pool_id == real.OKE_POOL
    # ... and with it, the cloud's name and bounds; sharing is read from the nodes, not "exclusive".
    cloud = cloud_pool(
        "h100-pool",
        "H100-80GB",
        8,
        "BM.GPU.H100.8",
        cpu_millis=224000,
        memory_mib=2 * 1024 * 1024,
        node_count=1,
        max_size=4,
        pool_id=real.OKE_POOL,
    )
    (joined,) = plan_node_pools([n], [cloud]).pools
    assert (joined.spec.name, joined.spec.sharing, joined.max_shares_per_pod) == ("h100-pool", "mps:4", 1)
    assert (joined.min_size, joined.max_size, joined.instance_type) == (0, 4, "BM.GPU.H100.8")
    # allocatable, not the shape's 224 vCPUs: less the kubelet's 6% + 1% + 2 x 0.5% + 220 x 0.25% of a core
    assert joined.spec.cpu_millis == 223370


def test_onprem_mixed_mig_under_a_configured_label() -> None:
    n = observe_node(real.onprem_a100_mixed("dgx-a-01"), pool_label_key="example.com/gpu-pool")
    assert (n.pool, n.gpu_model, n.gpu_count, n.sharing) == ("rack-a", "A100-80GB", 8, "mig:all-balanced")
    assert n.gpu_resources == {
        "mig:1g.10gb": "nvidia.com/mig-1g.10gb",
        "mig:2g.20gb": "nvidia.com/mig-2g.20gb",
        "mig:3g.40gb": "nvidia.com/mig-3g.40gb",
    }
    assert observe_node(real.onprem_a100_mixed("dgx-a-01")).pool == ""  # the key must be configured
    (pool,) = plan_node_pools([n]).pools
    assert pool.spec.to_pool("p", "c").node_capacity()["mig:1g.10gb"] == 16


def test_onprem_single_mig_strategy() -> None:
    raw = real.onprem_a100_single("gpu-b-07")
    raw["status"]["allocatable"]["memory"] = "495.5Gi"  # a kubelet may write any quantity form, not only Ki
    n = observe_node(raw, pool_label_key="example.com/gpu-pool")
    assert (n.gpu_model, n.gpu_count, n.sharing) == ("A100-40GB", 4, "mig:all-1g.5gb")
    assert n.gpu_resources == {"mig:1g.5gb": "nvidia.com/gpu"}
    assert n.allocatable["memory"] == 991 * 2**29  # "495.5Gi"


def test_nodes_mid_rollout_of_a_mig_config_are_held_back_with_an_issue() -> None:
    key = "example.com/gpu-pool"
    nodes = [
        observe_node(real.onprem_a100_mixed("dgx-a-01"), key),
        observe_node(real.onprem_a100_mixed("dgx-a-02"), key),
        observe_node(real.onprem_a100_mixed("dgx-a-03", config="all-1g.10gb"), key),
    ]
    plan = plan_node_pools(nodes)
    (pool,) = plan.pools
    assert pool.spec.sharing == "mig:all-balanced"
    assert pool.node_names == ("dgx-a-01", "dgx-a-02", "dgx-a-03")
    assert plan.held_back == {"dgx-a-03"}
    (issue,) = plan.issues
    assert "pool rack-a: nodes disagree" in issue
    assert "dgx-a-03 (8 x A100-80GB mig:all-1g.10gb) take no new work" in issue


def test_capacity_is_the_smallest_allocatable_of_the_pool() -> None:
    big = observe_node(real.eks_p5("ip-10-0-1-17.ec2.internal"))
    small = real.eks_p5("ip-10-0-1-18.ec2.internal")
    small["status"]["allocatable"]["cpu"] = "189900m"
    (pool,) = plan_node_pools([big, observe_node(small)]).pools
    assert pool.spec.cpu_millis == 189900
    assert pool.spec.node_count == 2


def test_unknown_gpu_and_unknown_instance_type_keep_the_pool_with_issues() -> None:
    odd = real.eks_p5("ip-10-0-7-7.ec2.internal", group="p6-b300")
    odd["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-Z900"
    n = observe_node(odd)
    assert n.gpu_model == "NVIDIA-Z900"
    cloud = cloud_pool("p6-b300", "", 0, "p9.96xlarge", taints=(Taint("dedicated", "gpu"),), node_count=1, max_size=2)
    plan = plan_node_pools([n], [cloud])
    (pool,) = plan.pools
    assert (pool.spec.name, pool.spec.gpu_model, pool.max_size) == ("p6-b300", "NVIDIA-Z900", 2)
    assert [t.key for t in pool.spec.taints] == ["dedicated"]
    assert any(i.startswith(CLOUD_ISSUE) and "p9.96xlarge" in i for i in plan.issues)


def test_cloud_pool_without_nodes_is_kept_for_the_autoscaler_and_unknown_gpu_pools_are_issues() -> None:
    empty = cloud_pool(
        "p5-flex", "H100-80GB", 8, "p5.48xlarge", cpu_millis=192000, memory_mib=2048 * 1024, node_count=0, max_size=4
    )
    unknown = cloud_pool("mystery", "", 8, "p9.96xlarge", node_count=0, max_size=2)
    plan = plan_node_pools([], [empty, unknown])
    assert [(p.spec.name, p.node_names) for p in plan.pools] == [("p5-flex", ())]
    assert plan.issues == (f"{CLOUD_ISSUE}pool mystery has no GPUs gpufleet knows of (p9.96xlarge)",)


def test_cordoned_notready_and_transient_taints() -> None:
    n = observe_node(real.eks_p5("ip-10-0-1-19.ec2.internal", unschedulable=True, ready=False))
    assert (n.schedulable, n.ready) == (False, False)
    assert n.taints == []  # node.kubernetes.io/unschedulable says nothing about the pool


def test_unlabelled_gpu_nodes_are_grouped_by_model_with_an_issue() -> None:
    raw = real.eks_p5("gpu-17")
    del raw["metadata"]["labels"]["eks.amazonaws.com/nodegroup"]
    plan = plan_node_pools([observe_node(raw)])
    assert [p.spec.name for p in plan.pools] == ["h100-80gb"]
    assert "kubernetes.pool_label_key" in plan.issues[0]


def test_odd_content_never_raises() -> None:
    raw = real.eks_p5("ip-10-0-1-20.ec2.internal")
    raw["status"]["allocatable"]["memory"] = "lots"
    raw["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "many"
    n = observe_node(raw)
    assert "memory=lots" in n.issues[0]
    plan = plan_node_pools([n])
    assert plan.pools == ()
    assert "no allocatable cpu or memory" in plan.issues[-1]


def test_pool_names_are_dns_labels() -> None:
    assert pool_name("p5-reserved") == "p5-reserved"
    assert pool_name("GPU_Group_1").startswith("gpu-group-1-")
    assert len(pool_name("x" * 100)) <= 63
    assert pool_name("GPU_Group_1") == pool_name("GPU_Group_1")


def test_mixed_mig_with_a_custom_config_name_is_read_from_the_device_counts() -> None:
    raw = real.onprem_a100_mixed("dgx-a-09")
    raw["metadata"]["labels"]["nvidia.com/mig.config"] = "site-inference-v2"  # a mig-parted name of the site's own
    n = observe_node(raw, "example.com/gpu-pool")
    assert (n.gpu_count, n.sharing) == (8, "mig:1g.10gb*2+2g.20gb+3g.40gb")
    pool = plan_node_pools([n]).pools[0].spec.to_pool("p", "c")
    assert pool.node_capacity()["mig:2g.20gb"] == 8


@pytest.mark.parametrize(
    "broken",
    [
        {"metadata": {"name": "n", "labels": None, "annotations": "x"}, "spec": [], "status": {"conditions": "no"}},
        {"metadata": {"name": "n"}, "spec": {"taints": [None, "x", {"key": "a", "effect": "Sideways"}]}},
        {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "X" * 500}}, "status": {"allocatable": []}},
    ],
)
def test_malformed_nodes_are_read_without_raising(broken: dict[str, object]) -> None:
    n = observe_node(broken)
    assert n.name == "n"
    assert not n.has_gpus
