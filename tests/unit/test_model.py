"""Capacity, demand, taints, gpu-eq and quotas of the domain model."""

from __future__ import annotations

from fractions import Fraction

import pytest

from controlplane.domain.model import CPU, GPU, MEM, SHARE, NodePool, PodSet, Quota, Taint, Toleration
from tests.unit.builders import cpu_only, frac, gpus, make_pool, make_workload, mig

# --- NodePool.node_capacity --------------------------------------------------------------------


def test_exclusive_pool_offers_whole_gpus_and_host_resources() -> None:
    pool = make_pool(gpus_per_node=8, cpu_millis=96_000, memory_mib=1_000_000)
    assert pool.node_capacity() == {GPU: 8, CPU: 96_000, MEM: 1_000_000}


def test_mig_pool_offers_slices_per_profile_times_gpus_and_no_whole_gpus() -> None:
    pool = make_pool(sharing="mig:all-balanced", gpus_per_node=4, cpu_millis=1000, memory_mib=2048)
    assert pool.node_capacity() == {"mig:1g.10gb": 8, "mig:2g.20gb": 4, "mig:3g.40gb": 4, CPU: 1000, MEM: 2048}


def test_mig_pool_capacity_follows_the_model_geometry() -> None:
    a100 = make_pool(gpu_model="A100-40GB", sharing="mig:all-1g.10gb", gpus_per_node=2)
    h100 = make_pool(gpu_model="H100-80GB", sharing="mig:all-1g.10gb", gpus_per_node=2)
    assert a100.node_capacity()["mig:1g.10gb"] == 8
    assert h100.node_capacity()["mig:1g.10gb"] == 14


@pytest.mark.parametrize("sharing", ["mps:4", "timeslice:4"])
def test_shared_pool_offers_replicas_times_gpus_shares(sharing: str) -> None:
    pool = make_pool(sharing=sharing, gpus_per_node=2)
    capacity = pool.node_capacity()
    assert capacity[SHARE] == 8
    assert GPU not in capacity
    assert not any(k.startswith("mig:") for k in capacity)


def test_node_capacity_is_a_fresh_dict_each_call() -> None:
    pool = make_pool()
    pool.node_capacity()[GPU] = 0
    assert pool.node_capacity()[GPU] == 8


# --- PodSet.demand_on --------------------------------------------------------------------------

EXCLUSIVE = make_pool("ex", sharing="exclusive")
MIG = make_pool("mig", sharing="mig:all-balanced")
MPS = make_pool("mps", sharing="mps:4")
TIMESLICE = make_pool("ts", sharing="timeslice:4")
ALL_POOLS = [EXCLUSIVE, MIG, MPS, TIMESLICE]


def test_whole_gpu_request_only_fits_exclusive_pools() -> None:
    pod = gpus(2, cpu_millis=500, memory_mib=1024)
    assert pod.demand_on(EXCLUSIVE) == {GPU: 2, CPU: 500, MEM: 1024}
    for pool in (MIG, MPS, TIMESLICE):
        assert pod.demand_on(pool) is None, pool.sharing


def test_mig_request_only_fits_mig_pools_offering_the_profile() -> None:
    pod = mig("2g.20gb")
    assert pod.demand_on(MIG) == {"mig:2g.20gb": 1, CPU: 1000, MEM: 4096}
    for pool in (EXCLUSIVE, MPS, TIMESLICE):
        assert pod.demand_on(pool) is None, pool.sharing


def test_mig_request_for_a_profile_not_in_the_layout_does_not_fit() -> None:
    only_small = make_pool(sharing="mig:all-1g.10gb")
    assert mig("3g.40gb").demand_on(only_small) is None
    assert mig("1g.10gb").demand_on(only_small) is not None
    # same size name, other model: an A100-40GB balanced layout has 1g.5gb, not 1g.10gb
    a100 = make_pool(gpu_model="A100-40GB", sharing="mig:all-balanced")
    assert mig("1g.10gb").demand_on(a100) is None
    assert mig("1g.5gb").demand_on(a100) == {"mig:1g.5gb": 1, CPU: 1000, MEM: 4096}


@pytest.mark.parametrize(("fraction", "shares"), [(0.25, 1), (0.5, 2), (0.3, 2), (0.9, 4)])
def test_fractional_request_only_fits_shared_pools_as_rounded_up_shares(fraction: float, shares: int) -> None:
    pod = frac(fraction)
    assert pod.demand_on(MPS) == {SHARE: shares, CPU: 1000, MEM: 4096}
    assert pod.demand_on(TIMESLICE) == {SHARE: shares, CPU: 1000, MEM: 4096}
    assert pod.demand_on(EXCLUSIVE) is None
    assert pod.demand_on(MIG) is None


def test_fraction_shares_depend_on_the_pool_replicas() -> None:
    on_ten = frac(0.5).demand_on(make_pool(sharing="mps:10"))
    on_three = frac(0.5).demand_on(make_pool(sharing="mps:3"))
    assert on_ten is not None
    assert on_three is not None
    assert on_ten[SHARE] == 5
    assert on_three[SHARE] == 2


def test_cpu_only_pod_fits_every_pool_and_asks_for_no_gpu() -> None:
    pod = cpu_only(cpu_millis=250)
    for pool in ALL_POOLS:
        assert pod.demand_on(pool) == {CPU: 250, MEM: 4096}


def test_model_allow_list_excludes_other_models() -> None:
    h100 = make_pool(gpu_model="H100-80GB")
    a100 = make_pool(gpu_model="A100-80GB")
    pod = gpus(1, models=["A100-80GB", "A100-40GB"])
    assert pod.demand_on(h100) is None
    assert pod.demand_on(a100) == {GPU: 1, CPU: 1000, MEM: 4096}


def test_model_allow_list_applies_to_cpu_only_pods_too() -> None:
    pod = PodSet(name="x", replicas=1, gpu_models=("A100-80GB",))
    assert pod.demand_on(make_pool(gpu_model="H100-80GB")) is None


def test_empty_model_allow_list_means_any_model() -> None:
    for model in ("H100-80GB", "A100-80GB", "L4"):
        assert gpus(1).demand_on(make_pool(gpu_model=model)) is not None


# --- PodSet / Workload gpu-eq ------------------------------------------------------------------


def test_pod_gpu_eq_per_request_kind() -> None:
    assert gpus(4).gpu_eq_per_pod() == 4
    assert mig("3g.40gb").gpu_eq_per_pod() == Fraction(3, 7)
    assert frac(0.25).gpu_eq_per_pod() == Fraction(1, 4)
    assert frac(0.3).gpu_eq_per_pod() == Fraction(3, 10)
    assert cpu_only().gpu_eq_per_pod() == 0


def test_workload_gpu_eq_sums_replicas_of_every_pod_set() -> None:
    workload = make_workload(
        "w", cpu_only(1), gpus(2, replicas=3), mig("1g.10gb", replicas=2, name="m"), frac(0.25, replicas=4, name="f")
    )
    assert workload.gpu_eq() == 6 + Fraction(2, 7) + 1
    assert workload.total_pods == 10


def test_workload_gpu_eq_is_zero_without_gpu_requests() -> None:
    assert make_workload("w", cpu_only(3)).gpu_eq() == 0


# --- Toleration / taints -----------------------------------------------------------------------


def test_equal_toleration_needs_key_and_value_to_match() -> None:
    taint = Taint("team", "ml")
    assert Toleration("team", "Equal", "ml").tolerates(taint)
    assert not Toleration("team", "Equal", "web").tolerates(taint)
    assert not Toleration("other", "Equal", "ml").tolerates(taint)


def test_exists_toleration_matches_any_value_of_the_key() -> None:
    assert Toleration("team", "Exists").tolerates(Taint("team", "anything"))
    assert Toleration("team", "Exists").tolerates(Taint("team"))
    assert not Toleration("other", "Exists").tolerates(Taint("team", "x"))


def test_empty_toleration_effect_tolerates_every_effect() -> None:
    for effect in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        assert Toleration("k", "Exists").tolerates(Taint("k", "", effect))


def test_toleration_with_an_effect_only_tolerates_that_effect() -> None:
    toleration = Toleration("k", "Equal", "v", effect="NoExecute")
    assert toleration.tolerates(Taint("k", "v", "NoExecute"))
    assert not toleration.tolerates(Taint("k", "v", "NoSchedule"))


def test_untolerated_taints_lists_taints_no_toleration_covers() -> None:
    spot, team = Taint("spot", "true"), Taint("team", "ml")
    pool = make_pool(taints=[spot, team])
    assert pool.untolerated_taints(()) == [spot, team]
    assert pool.untolerated_taints((Toleration("spot", "Equal", "true"),)) == [team]
    assert pool.untolerated_taints((Toleration("spot", "Exists"), Toleration("team", "Exists"))) == []


def test_untolerated_taints_ignores_the_gpu_taint_keys_gpufleet_tolerates_itself() -> None:
    pool = make_pool(taints=[Taint("nvidia.com/gpu", "present"), Taint("sku", "gpu", "NoExecute")])
    assert pool.untolerated_taints(()) == []


def test_gpu_taint_keys_do_not_hide_other_taints() -> None:
    other = Taint("nvidia.com/gpu.product", "H100")
    pool = make_pool(taints=[Taint("nvidia.com/gpu", "present"), other])
    assert pool.untolerated_taints(()) == [other]


def test_pool_without_taints_needs_no_tolerations() -> None:
    assert NodePool("p", "c", "p", "H100-80GB", 8, 1000, 1024).untolerated_taints(()) == []


# --- Quota.exceeded_by -------------------------------------------------------------------------


def test_quota_is_not_exceeded_at_exactly_its_bound() -> None:
    assert Quota({"gpu-eq": 4}).exceeded_by({"gpu-eq": Fraction(4)}) is None
    assert Quota({"gpu-eq": 4}).exceeded_by({"gpu-eq": Fraction(4) + Fraction(1, 7)}) == "gpu-eq"


def test_quota_float_bounds_compare_exactly_with_fractions() -> None:
    assert Quota({"gpu-eq": 0.3}).exceeded_by({"gpu-eq": Fraction(3, 10)}) is None
    assert Quota({"gpu-eq": 0.7}).exceeded_by({"gpu-eq": Fraction(7, 10)}) is None
    assert Quota({"gpu-eq": 0.3}).exceeded_by({"gpu-eq": Fraction(301, 1000)}) == "gpu-eq"


def test_quota_missing_key_is_unbounded_and_missing_usage_is_zero() -> None:
    assert Quota({}).exceeded_by({"gpu-eq": Fraction(10**6)}) is None
    assert Quota({"A100-80GB": 0}).exceeded_by({"gpu-eq": Fraction(5), "H100-80GB": Fraction(5)}) is None


def test_quota_reports_a_per_model_bound() -> None:
    quota = Quota({"gpu-eq": 10, "H100-80GB": 2})
    assert quota.exceeded_by({"gpu-eq": Fraction(3), "H100-80GB": Fraction(3)}) == "H100-80GB"


def test_quota_reports_the_first_exceeded_key_in_sorted_order() -> None:
    quota = Quota({"gpu-eq": 1, "A100-80GB": 1})
    assert quota.exceeded_by({"gpu-eq": Fraction(2), "A100-80GB": Fraction(2)}) == "A100-80GB"


def test_zero_quota_forbids_any_usage() -> None:
    assert Quota({"gpu-eq": 0}).exceeded_by({"gpu-eq": Fraction(1, 7)}) == "gpu-eq"
    assert Quota({"gpu-eq": 0}).exceeded_by({"gpu-eq": Fraction(0)}) is None
