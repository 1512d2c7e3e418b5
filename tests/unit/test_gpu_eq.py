"""The integer unit of quota arithmetic keeps MIG sevenths, every share size and every quota amount
of the fleet whole, so the ledger never rounds."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.core.gpu_eq import GpuEqUnit, gpu_eq_float, gpu_eq_with_replicas, quota_amounts
from controlplane.domain.sharing import mig_gpu_eq
from tests.unit.builders import frac, gpus, make_pool, make_queue, make_workload, mig, tree_of


def test_a_typical_fleet_gets_a_small_unit() -> None:
    pools = [make_pool(sharing="exclusive"), make_pool(sharing="timeslice:4"), make_pool(sharing="timeslice:10")]
    unit = GpuEqUnit.for_fleet(pools, [2.5, 0.25, 12])
    assert unit.per_gpu == 140  # lcm(7, 4, 10, 2, 4)


def test_every_demand_is_a_whole_number_of_units_and_equals_its_exact_gpu_eq() -> None:
    pools = [make_pool(sharing="timeslice:3"), make_pool(sharing="mps:16"), make_pool(sharing="timeslice:9")]
    unit = GpuEqUnit.for_fleet(pools, [0.001])
    for pool in pools:
        for shares in range(1, pool.sharing.replicas + 1):
            demand = {"cpu": 1000, "mem": 1024, "share": shares}
            assert Fraction(unit.of_demand(demand, pool), unit.per_gpu) == Fraction(shares, pool.sharing.replicas)
    exclusive = make_pool(sharing="exclusive")
    for profile in ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"):
        demand = {"cpu": 1000, "mem": 1024, f"mig:{profile}": 2}
        assert Fraction(unit.of_demand(demand, exclusive), unit.per_gpu) == 2 * mig_gpu_eq(profile)
    assert unit.of_demand({"cpu": 1, "mem": 1, "gpu": 3}, exclusive) == 3 * unit.per_gpu


@given(st.lists(st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False), max_size=8))
def test_decimal_quota_amounts_are_exact_in_units(amounts: list[object]) -> None:
    values = [float(str(a)) for a in amounts]
    unit = GpuEqUnit.for_fleet([make_pool(sharing="timeslice:8")], values)
    for value in values:
        assert Fraction(unit.of_amount(value), unit.per_gpu) == Fraction(str(value))


def test_a_unit_that_does_not_keep_sevenths_or_a_pools_shares_is_refused() -> None:
    with pytest.raises(ValueError, match="sevenths"):
        GpuEqUnit(10)
    with pytest.raises(ValueError, match="replicas"):
        GpuEqUnit(7).of_demand({"share": 1}, make_pool(sharing="timeslice:4"))


def test_the_least_a_gang_holds_is_a_lower_bound_in_units() -> None:
    unit = GpuEqUnit.for_fleet([make_pool(sharing="timeslice:4")], [])
    gang = make_workload("g", gpus(2), mig("3g.40gb"), frac(0.3), min_available=2)
    # cheapest two pods: 0.3 (rounded down to a unit) and 3/7
    assert unit.least(gang) == int(Fraction(3, 10) * unit.per_gpu) + 3 * unit.per_gpu // 7


def test_the_float_twin_agrees_with_the_units() -> None:
    pool = make_pool(sharing="timeslice:3")
    unit = GpuEqUnit.for_fleet([pool], [])
    demand = {"cpu": 1, "mem": 1, "share": 2}
    assert gpu_eq_float(demand, pool) == pytest.approx(unit.gpus(unit.of_demand(demand, pool)))
    assert gpu_eq_with_replicas({"mig:2g.20gb": 1}, 1) == pytest.approx(2 / 7)


def test_quota_amounts_lists_every_bound_of_the_tree() -> None:
    tree = tree_of(make_queue("q1", None, limit=0.4))
    assert quota_amounts(tree) == [0.4]
