"""The replay loop and its metrics on a fleet small enough to follow by hand, and each policy's
choice on tiny cases."""

from __future__ import annotations

import random

import pytest

from controlplane.core.fragmentation import MILLI, PodShape, WorkloadMix
from controlplane.tracesim.placement.engine import Arrivals, Simulation, arrivals
from controlplane.tracesim.placement.experiment import build, typical_mix
from controlplane.tracesim.placement.policies import (
    FragmentationScore,
    bestfit,
    clustering,
    dotprod,
    packing,
)
from controlplane.tracesim.placement.trace import TraceNode, TracePod

NONE: frozenset[str] = frozenset()
SHARE = PodShape(1000, 500, 1)
WHOLE = PodShape(1000, 1000, 1)
CPU = PodShape(1000)
DOUBLE = PodShape(1000, 1000, 2)


def fleet() -> list[TraceNode]:
    return [TraceNode("a", 10_000, 10_000, 2, "T4"), TraceNode("b", 10_000, 10_000, 1, "T4")]


def pods() -> list[TracePod]:
    return [TracePod(f"p{i}", 100, shape) for i, shape in enumerate((DOUBLE, SHARE, WHOLE, CPU))]


def test_metrics_of_a_hand_checked_replay() -> None:
    # Typical pods: the four shapes, 1/4 each. Empty: F(a) = F(b) = 500 milli (the CPU pod sees
    # all idle GPU; the 2-GPU pod cannot fit b), idle 3000, rate 33.3 %.
    sim = build("bestfit", fleet(), pods())
    curves = sim.replay(Arrivals(order=(0, 1, 2, 3), node_rank=(0, 1)), random.Random(0))
    assert (curves.pods, curves.placed) == (4, 3)
    curve = curves.curve()
    # 1. the 2-GPU pod fills a: arrived = used = 2000 of 3000 milli; F = F(b) = 500.
    assert curve[67] == pytest.approx((100 - 200 / 3, 100 * 500 / 3000, 50.0))
    # 2. the 500-milli pod goes to b: F(b) = 0.25 * 500 (CPU pod) + 0.25 * 500 (whole GPU does
    #    not fit) + 0.25 * 500 (2 GPUs do not fit) = 375, idle 500.
    assert curve[83] == pytest.approx((100 - 250 / 3, 12.5, 75.0))
    # 3. no fully free GPU is left: the whole-GPU pod is dropped, arrived 3500 (117 %); 4. the
    #    CPU pod lands on a (best fit); neither changes allocation or fragmentation.
    assert curve[117] == pytest.approx((100 - 250 / 3, 12.5, 75.0))
    assert curve[116] == curve[117] == curve[118]  # an empty percent borrows its neighbours
    assert 100 not in curve  # ... within one point only
    assert curves.dropped_by_class == {}  # the drop came after demand passed capacity


def test_fgd_takes_the_gpu_that_strands_nothing_where_best_fit_packs_tightly() -> None:
    mix = WorkloadMix.of([SHARE])
    fgd = FragmentationScore(mix, live=False)
    # Node with a 600 GPU vs node with a fully free GPU, for a 500-milli pod.
    assert bestfit("T4", 8000, (600,), NONE, SHARE)[0] > bestfit("T4", 8000, (1000,), NONE, SHARE)[0]
    assert fgd("T4", 8000, (1000,), NONE, SHARE)[0] > fgd("T4", 8000, (600,), NONE, SHARE)[0]
    # Inside one node the best-fit GPU is the tightest that fits; FGD's the one stranding least.
    assert bestfit("T4", 8000, (1000, 600, 400), NONE, SHARE)[1] == 600
    assert fgd("T4", 8000, (1000, 600, 400), NONE, SHARE)[1] == MILLI


def test_packing_prefers_shared_gpus_then_used_nodes_then_small_empty_nodes() -> None:
    shared = packing("T4", 8000, (1000, 600), NONE, SHARE)[0]
    used = packing("T4", 8000, (1000, 0), NONE, SHARE)[0]
    empty_small = packing("T4", 8000, (1000, 1000), NONE, SHARE)[0]
    empty_big = packing("T4", 8000, (1000,) * 8, NONE, SHARE)[0]
    assert shared > used > empty_small > empty_big
    assert (shared, used, empty_small, empty_big) == (100 - 60 // 10, 50 - 1, 33 - 2, 33 - 8)
    assert packing("T4", 8000, (1000,), NONE, CPU)[0] == 0  # CPU pods: node order decides


def test_clustering_prefers_nodes_holding_only_the_same_class() -> None:
    same = clustering("T4", 8000, (1000, 500), frozenset({"share"}), SHARE)[0]
    mixed = clustering("T4", 8000, (1000, 500), frozenset({"share", "1-gpu"}), SHARE)[0]
    idle = clustering("T4", 8000, (1000, 1000), NONE, SHARE)[0]
    other = clustering("T4", 8000, (1000, 0), frozenset({"1-gpu"}), SHARE)[0]
    assert same > mixed > idle > other
    assert (same, idle) == (75 + 25 * 6500 // 8000, 25 + 25 * 6000 // 8000)


def test_dotprod_prefers_the_node_whose_free_vector_aligns_least() -> None:
    assert dotprod("T4", 8000, (1000,), NONE, WHOLE)[0] > dotprod("T4", 64000, (1000,) * 8, NONE, WHOLE)[0]
    assert dotprod("T4", 8000, (1000,), NONE, WHOLE)[0] == int(100 * (1 - (8000 * 1000 / 128000**2 + 1 / 64) / 2))


def test_gpufleet_fills_a_used_node_before_opening_an_untouched_one() -> None:
    nodes = [TraceNode("a", 96_000, 10_000, 8, "G2"), TraceNode("b", 96_000, 10_000, 8, "G2")]
    two = [TracePod("p0", 100, WHOLE), TracePod("p1", 100, WHOLE)]
    mix = typical_mix(two)
    # Node b ranks first, so the first pod opens it; the second joins it rather than open a.
    live = Simulation(nodes, two, mix, FragmentationScore(mix, live=True))
    curves = live.replay(Arrivals((0, 1), node_rank=(1, 0)), random.Random(0))
    assert curves.placed == 2
    assert curves.curve()[12] == pytest.approx((100 - 100 * 2000 / 16000, 0.0, 0.0))


def test_random_places_only_where_the_pod_fits() -> None:
    sim = build("random", fleet(), pods())
    for seed in range(5):
        curves = sim.run(seed)
        assert curves.placed <= curves.pods
        final = curves.curve()[max(curves.curve())]
        assert final[0] >= 0.0


def test_arrivals_fill_to_130_percent_and_depend_on_the_seed() -> None:
    trace = [TracePod(f"p{i}", 100, WHOLE if i % 2 else SHARE) for i in range(20)]
    nodes = [TraceNode("a", 64_000, 10_000, 8, "T4"), TraceNode("b", 64_000, 10_000, 8, "T4")]
    first, again, other = arrivals(trace, nodes, 42), arrivals(trace, nodes, 42), arrivals(trace, nodes, 43)
    assert first == again
    assert first.order != other.order
    assert sorted(first.order[:20]) == list(range(20))  # the real pods first, shuffled
    requested = sum(trace[i].shape.total_gpu_milli for i in first.order)
    assert requested <= 1.3 * 16 * MILLI < requested + MILLI
