"""The fragmentation measure and the placement score, on cases small enough to check by hand."""

from __future__ import annotations

import pytest

from controlplane.core.fragmentation import (
    MILLI,
    OPEN_NODE_COST,
    PodShape,
    TypicalPod,
    WorkloadMix,
    fgd_delta,
    fgd_score,
    fits,
    gang_fragmentation_cost,
    gpus_of_free,
    node_fragmentation,
    placement_choice,
    pod_shape,
    take,
    workload_mix,
)
from controlplane.domain.model import NodePool, PodAssignment, PodSet, Workload, WorkloadKind
from controlplane.domain.sharing import SharingMode

SHARE_500 = PodShape(cpu_milli=4000, gpu_milli=500, gpu_count=1)
ONE_GPU = PodShape(cpu_milli=8000, gpu_milli=1000, gpu_count=1)
CPU_ONLY = PodShape(cpu_milli=2000)
T4_ONLY = PodShape(cpu_milli=1000, gpu_milli=1000, gpu_count=1, gpu_models=frozenset({"T4"}))


def mix(*weighted: tuple[PodShape, float]) -> WorkloadMix:
    return WorkloadMix([TypicalPod(shape, weight) for shape, weight in weighted])


def test_a_fitting_pod_sees_only_gpus_too_small_for_it_as_fragment() -> None:
    # GPUs with 1000, 600 and 300 free milli: a 500-milli pod can use the first two, not the 300.
    assert node_fragmentation(mix((SHARE_500, 1.0)), "G2", 16000, (1000, 600, 300)) == 300
    # A whole-GPU pod can use only the fully free GPU: 600 + 300 are fragment.
    assert node_fragmentation(mix((ONE_GPU, 1.0)), "G2", 16000, (1000, 600, 300)) == 900


def test_pods_that_cannot_fit_see_all_idle_gpu_as_fragment() -> None:
    idle = 1000 + 600 + 300
    assert node_fragmentation(mix((CPU_ONLY, 1.0)), "G2", 16000, (1000, 600, 300)) == idle  # CPU-only
    assert node_fragmentation(mix((T4_ONLY, 1.0)), "G2", 16000, (1000, 600, 300)) == idle  # wrong model
    assert node_fragmentation(mix((ONE_GPU, 1.0)), "G2", 7000, (1000, 600, 300)) == idle  # lacks CPU
    assert node_fragmentation(mix((ONE_GPU, 1.0)), "G2", 16000, (600, 300)) == 900  # no GPU big enough


def test_fragmentation_is_the_probability_weighted_sum() -> None:
    m = mix((SHARE_500, 3.0), (ONE_GPU, 1.0))  # weights normalise to 0.75 and 0.25
    assert node_fragmentation(m, "G2", 16000, (1000, 600, 300)) == pytest.approx(0.75 * 300 + 0.25 * 900)
    assert node_fragmentation(m, "G2", 16000, (0, 0)) == 0.0


def test_typical_pods_keep_the_popular_shapes_covering_the_threshold() -> None:
    shapes = [SHARE_500] * 6 + [ONE_GPU] * 3 + [CPU_ONLY]
    m = WorkloadMix.of(shapes, popularity=0.9)
    assert [(p.shape, round(p.weight, 4)) for p in m.pods] == [(SHARE_500, 0.6667), (ONE_GPU, 0.3333)]


def test_take_and_fits() -> None:
    assert take((1000, 1000, 600), SHARE_500, share_from=600) == (1000, 1000, 100)
    assert take((1000, 600, 1000), PodShape(1000, 1000, 2)) == (600, 0, 0)
    assert fits((1000, 600), SHARE_500)
    assert not fits((400, 300), SHARE_500)
    assert fits((1000, 1000, 200), PodShape(1000, 1000, 2))
    assert not fits((1000, 900), PodShape(1000, 1000, 2))
    with pytest.raises(ValueError, match="fully free"):
        take((1000, 500), PodShape(1000, 1000, 2))


def test_fgd_picks_the_gpu_that_grows_fragmentation_least() -> None:
    m = mix((SHARE_500, 1.0))
    # On the 600 GPU the pod leaves 100 stranded; on the 1000 GPU it leaves 500 (still usable).
    choice = fgd_delta(m, "G2", 16000, (1000, 600), SHARE_500)
    assert choice.share_from == 1000
    assert choice.frag_delta == 0
    # A 700 and a 550 GPU: on the 550 the pod strands 50 (the 700 still fits one more); on the
    # 700 it strands 200.
    choice = fgd_delta(m, "G2", 16000, (700, 550), SHARE_500)
    assert (choice.share_from, choice.frag_delta) == (550, 50)


def test_fgd_score_is_a_squashed_integer() -> None:
    assert fgd_score(0) == 50
    assert fgd_score(-1000) == 73  # fragmentation shrinks: higher score
    assert fgd_score(1000) == 26
    assert fgd_score(20) == fgd_score(0) - 1  # about 40 milli per score step near zero


def test_gpufleet_prefers_a_used_node_within_one_score_step() -> None:
    m = mix((ONE_GPU, 1.0))
    fresh = placement_choice(m, "G2", 96000, (MILLI,) * 8, ONE_GPU)
    used = placement_choice(m, "G2", 88000, (MILLI,) * 7 + (0,), ONE_GPU)
    assert fresh.opens_node
    assert not used.opens_node
    assert fgd_score(fresh.frag_delta) == fgd_score(used.frag_delta)
    assert used.cost() < fresh.cost()


def _pool(sharing: str, gpus: int = 4) -> NodePool:
    return NodePool("p", "c", "pool", "A100-80GB", gpus, 64_000, 512_000, sharing=SharingMode.parse(sharing))


def test_the_live_schedulers_slot_view_becomes_per_gpu_milli() -> None:
    assert gpus_of_free({"gpu": 3, "cpu": 1}, _pool("exclusive")) == (1000, 1000, 1000, 0)
    assert gpus_of_free({"share": 5}, _pool("mps:4")) == (1000, 250, 0, 0)  # shares packed
    assert gpus_of_free({"mig:3g.40gb": 1, "mig:1g.10gb": 2}, _pool("mig:all-balanced", 1)) == (429 + 2 * 143,)
    assert pod_shape(PodSet("w", 1, gpu_fraction=0.25, cpu_millis=500)) == PodShape(500, 250, 1)
    assert pod_shape(PodSet("w", 1, gpus=2, gpu_models=("A100-80GB",))) == PodShape(
        1000, 1000, 2, frozenset({"A100-80GB"})
    )
    assert pod_shape(PodSet("w", 1)) == PodShape(1000)


def test_a_gangs_cost_is_the_sum_over_its_pods_in_order() -> None:
    pool = _pool("exclusive", gpus=8)
    workload = Workload("w", "t", "q", "w", "pc", 0, WorkloadKind.TRAINING, (PodSet("main", 2, gpus=1),), 2)
    free = {"n1": {"gpu": 8, "cpu": 64_000, "mem": 512_000}, "n2": {"gpu": 3, "cpu": 64_000, "mem": 512_000}}
    pools = {"n1": pool, "n2": pool}
    mix = workload_mix([workload])
    assert mix is not None
    both_on_n1 = (PodAssignment("main", 0, "n1", {"gpu": 1}), PodAssignment("main", 1, "n1", {"gpu": 1}))
    both_on_n2 = (PodAssignment("main", 0, "n2", {"gpu": 1}), PodAssignment("main", 1, "n2", {"gpu": 1}))
    # Whole-GPU pods only: no fragmentation either way; opening the untouched n1 costs 0.5 once
    # (the second pod finds it used).
    assert gang_fragmentation_cost(mix, workload, both_on_n1, free, pools) == OPEN_NODE_COST
    assert gang_fragmentation_cost(mix, workload, both_on_n2, free, pools) == 0.0
    assert free["n1"]["gpu"] == 8  # untouched
