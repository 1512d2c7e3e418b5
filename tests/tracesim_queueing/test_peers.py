"""The peer scheduler models, each on small hand-checked cases that pin its defining behaviour.

Every case runs through the engine with the capacity check on (no node ever over-committed) and
a 10 s cycle: a change at t is decided at t or, within 10 s of the previous cycle, 10 s after it.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import click
import pytest
from click.testing import CliRunner

from controlplane.cli.sim_study_commands import add_commands
from controlplane.core.snapshot import Admission, Decision
from controlplane.domain.model import GPU, GPU_EQ, PodAssignment, PodSet, Quota, Workload, WorkloadKind
from controlplane.service.cluster_specs import ClusterSpec, PoolSpec
from controlplane.tracesim.queueing.engine import SimConfig, SimResult, simulate
from controlplane.tracesim.queueing.generate import GeneratorConfig, generate
from controlplane.tracesim.queueing.inputs import Fleet, FleetDoc, Job, QueueDoc, TeamDoc, build_fleet
from controlplane.tracesim.queueing.peers.armada import ArmadaConfig, ArmadaScheduler
from controlplane.tracesim.queueing.peers.kueue import KueueConfig, KueueScheduler
from controlplane.tracesim.queueing.peers.slurm import SlurmConfig, SlurmScheduler
from controlplane.tracesim.queueing.policies import POLICY_NAMES, parse_policies
from controlplane.tracesim.queueing.scheduler import CycleResult, CycleView, EndedRun, PendingGang

CHECKED = SimConfig(cycle_seconds=10, check_invariants=True)


def fleet(nominal: dict[str, float], nodes: int = 1, gpus_per_node: int = 4) -> Fleet:
    pool = PoolSpec(
        name="gpu",
        gpu_model="A100",
        gpus_per_node=gpus_per_node,
        cpu_millis=64_000,
        memory_mib=512_000,
        node_count=nodes,
    )
    return build_fleet(
        FleetDoc(
            clusters=[ClusterSpec(name="c1", pools=[pool])],
            teams=[TeamDoc(name=q) for q in nominal],
            queues=[QueueDoc(name=q, parent=q, guaranteed={GPU_EQ: g}) for q, g in nominal.items()],
        )
    )


def job(
    id: str,
    at: float,
    queue: str,
    duration: float,
    gpus: int = 1,
    pods: int = 1,
    priority: int = 100,
    max_runtime: float | None = None,
) -> Job:
    return Job(id, at, queue, gpus, pods, duration, priority, WorkloadKind.TRAINING, max_runtime=max_runtime)


def times(result: SimResult, prefix: str) -> list[float | None]:
    """First admissions of the jobs named `prefix...` (same-instant arrivals are ordered by the
    seed, so cases name who is first only where it is decided by the policy)."""
    return sorted(t for name, t in admitted(result).items() if name.startswith(prefix))  # type: ignore[type-var]


def admitted(result: SimResult) -> dict[str, float | None]:
    return {j.id: result.first_admit[i] for i, j in enumerate(result.jobs)}


def evicted(result: SimResult) -> dict[str, int]:
    return {j.id: result.evictions[i] for i, j in enumerate(result.jobs)}


def eviction_times(result: SimResult) -> list[float]:
    return sorted(span.end for span in result.spans if span.evicted and span.end is not None)


def test_policy_names_and_all() -> None:
    assert POLICY_NAMES == ("fifo", "priority", "kueue", "volcano", "armada", "slurm", "gpufleet")
    assert parse_policies("all") == list(POLICY_NAMES)
    assert parse_policies("slurm, kueue,slurm") == ["slurm", "kueue"]
    with pytest.raises(ValueError, match="unknown policy 'yarn'"):
        parse_policies("fifo,yarn")


# -- Kueue -----------------------------------------------------------------------------------------


def test_kueue_admits_one_head_per_queue_per_cycle_and_never_backfills() -> None:
    f = fleet({"a": 2, "b": 2})
    one_cycle = KueueScheduler(f, KueueConfig(cycles_per_decision=1))
    jobs = [job("a1", 0, "a", 100), job("a2", 0, "a", 100), job("b1", 0, "b", 100)]
    # One head per ClusterQueue per Kueue cycle: a's second job waits for the next cycle.
    per_cycle = simulate(f, jobs, "kueue", config=CHECKED, scheduler=one_cycle)
    assert times(per_cycle, "a") == [0, 10]
    assert times(per_cycle, "b") == [0]
    # Kueue runs its cycles back to back: by default they all run at the same instant.
    assert times(simulate(f, jobs, "kueue", config=CHECKED), "a") == [0, 0]
    # b holds 2 of 4 GPUs; a's head asks for 3 (over the cohort's 4), so it is set aside
    # (BestEffortFIFO) and the small job behind it passes it; no room is held for the big one,
    # which waits until b's job ends.
    blocked = [job("b1", 0, "b", 1000, gpus=2), job("big", 5, "a", 100, gpus=3), job("small", 6, "a", 100)]
    result = simulate(
        f, blocked, "kueue", config=CHECKED, scheduler=KueueScheduler(f, KueueConfig(cycles_per_decision=1))
    )
    assert admitted(result) == {"b1": 0, "big": 1000, "small": 20}
    assert admitted(simulate(f, blocked, "kueue", config=CHECKED)) == {"b1": 0, "big": 1000, "small": 10}


def test_kueue_borrows_up_to_its_borrowing_limit() -> None:
    f = fleet({"a": 1, "b": 3})
    jobs = [job("a1", 0, "a", 100), job("a2", 0, "a", 200), job("a3", 0, "a", 50)]
    # Unbounded borrowing: a takes b's idle quota.
    assert times(simulate(f, jobs, "kueue", config=CHECKED), "a") == [0, 0, 0]
    # borrowingLimit 1: a may hold nominal 1 + 1; its third job waits for the first to end.
    tree = dict(f.tree)
    tree["queue/a"] = replace(tree["queue/a"], borrowing_limit=Quota({GPU_EQ: 1}))
    limited = simulate(replace(f, tree=tree), jobs, "kueue", config=CHECKED)
    first = min(limited.finish)  # type: ignore[type-var]
    assert times(limited, "a") == [0, 0, first]
    assert first in (50, 100, 200)


def test_kueue_reclaim_within_cohort_evicts_the_newest_borrower() -> None:
    f = fleet({"a": 1, "b": 1}, gpus_per_node=2)
    jobs = [job("b1", 0, "b", 1000), job("b2", 5, "b", 1000), job("a1", 50, "a", 100)]
    result = simulate(f, jobs, "kueue", config=CHECKED)
    # b borrowed a's idle GPU (b2, started at 10); a1 fits in a's nominal quota, so the most
    # recently started borrower is evicted at 50 and a1 starts on its room.
    assert admitted(result)["b2"] == 10
    assert evicted(result) == {"b1": 0, "b2": 1, "a1": 0}
    assert eviction_times(result) == [50]
    assert admitted(result)["a1"] == 50


# -- Volcano ---------------------------------------------------------------------------------------


def test_volcano_deserved_shares_follow_weight_capped_by_request() -> None:
    f = fleet({"a": 6, "b": 2}, gpus_per_node=8)
    jobs = [job(f"a{i}", 0, "a", 1000) for i in range(2)] + [job(f"b{i}", 0, "b", 1000) for i in range(8)]
    result = simulate(f, jobs, "volcano", config=CHECKED)
    at_zero = {name for name, t in admitted(result).items() if t == 0}
    # a asks for 2 of its weight's 6: deserved a = 2, b = 8 - 2 = 6; b stops once overused.
    assert {name for name in at_zero if name.startswith("a")} == {"a0", "a1"}
    assert len([name for name in at_zero if name.startswith("b")]) == 6


def test_volcano_gang_is_all_or_nothing_and_reclaims_from_an_overused_queue() -> None:
    f = fleet({"a": 4, "b": 4}, nodes=2)
    hogs = [job(f"b{i}", 0, "b", 10_000) for i in range(6)]
    gang = job("gang", 50, "a", 100, gpus=2, pods=2)
    result = simulate(f, [*hogs, gang], "volcano", config=CHECKED)
    # b alone asked: deserved 6, it holds 6 (one node full, two GPUs on the other). The 2x2 gang
    # cannot start on the two free GPUs (no partial start); a (deserved 4) reclaims from b, now
    # over its deserved 4: two of b's jobs go and the gang starts in the same session.
    assert admitted(result)["gang"] == 50
    assert sum(evicted(result).values()) == 2
    assert eviction_times(result) == [50, 50]
    assert all(evicted(result)[name] <= 1 for name in evicted(result) if name.startswith("b"))


# -- Armada ----------------------------------------------------------------------------------------


def test_armada_orders_queues_by_dominant_share_over_weight() -> None:
    f = fleet({"a": 3, "b": 1})
    jobs = [job(f"a{i}", 0, "a", 100) for i in range(4)] + [job(f"b{i}", 0, "b", 100) for i in range(4)]
    result = simulate(f, jobs, "armada", config=CHECKED)
    # Costs (share after the job / weight): a 1/12, 2/12, 3/12 (tie with b's 1/4, a by name), then b.
    assert times(result, "a")[:3] == [0, 0, 0]
    assert times(result, "a")[3] != 0
    assert times(result, "b")[:1] == [0]
    assert times(result, "b")[1] != 0


def test_armada_fair_share_preemption_is_bounded_by_the_scheduling_rate() -> None:
    f = fleet({"a": 2, "b": 2})
    jobs = [job(f"a{i}", 0, "a", 10_000) for i in range(4)] + [job(f"b{i}", 100, "b", 100) for i in range(3)]
    # a holds all 4 GPUs; b arrives: fair shares 2 and 2, so two of a's jobs make room at once
    # (b's third would take b above its share: it waits).
    free_running = simulate(f, jobs, "armada", config=CHECKED)
    assert eviction_times(free_running) == [100, 100]
    # One new job per queue per 10 s: a's jobs are preempted one per cycle.
    slow = ArmadaConfig(maximum_per_queue_scheduling_rate=0.1, maximum_per_queue_scheduling_burst=1)
    limited = simulate(f, jobs, "armada", config=CHECKED, scheduler=ArmadaScheduler(f, slow))
    assert times(limited, "a") == [0, 10, 20, 30]  # the same limit spaced a's own starts
    assert eviction_times(limited) == [100, 110]


# -- Slurm -----------------------------------------------------------------------------------------


def test_slurm_easy_backfill_starts_a_job_only_if_the_reserved_head_is_not_delayed() -> None:
    f = fleet({"a": 4})
    jobs = [
        job("r1", 0, "a", 100, gpus=2, max_runtime=100),
        job("head", 10, "a", 50, gpus=4, max_runtime=50),  # the largest: first by job size
        job("fits_before", 10, "a", 80, gpus=2, max_runtime=80),  # declared end 90 <= 100
        job("too_long", 10, "a", 30, gpus=2, max_runtime=200),  # declared end 210 > 100
    ]
    result = admitted(simulate(f, jobs, "slurm", config=CHECKED))
    # The head is reserved for 100 (r1's declared end); only the job declared to end by then
    # starts on the two free GPUs; the other waits although it would really end at 40.
    assert result == {"r1": 0, "head": 100, "fits_before": 10, "too_long": 150}


def _gang(queue: str, index: int) -> PendingGang:
    workload = Workload(
        id=str(index),
        team_id=f"team/{queue}",
        queue_id=f"queue/{queue}",
        name=f"{queue}{index}",
        priority_class="sim",
        priority=100,
        kind=WorkloadKind.TRAINING,
        pod_sets=(PodSet("main", 1, gpus=1, cpu_millis=0, memory_mib=0),),
        min_available=1,
        created_seq=index,
    )
    return PendingGang(workload, queue, 1, 1, 0.0, None)


def test_slurm_fair_share_decay_changes_the_order() -> None:
    f = fleet({"a": 2, "b": 2})
    # a used 100 GPU-s long ago, b 60 GPU-s recently.
    history = [EndedRun("a", 1, 0, 100), EndedRun("b", 1, 900, 960)]
    view = CycleView(1000, f, {}, [], history)
    ga, gb = _gang("a", 0), _gang("b", 1)

    no_decay = SlurmScheduler(f, SlurmConfig(decay_half_life_seconds=1e12))
    no_decay.account(view)
    # U = 100/160 and 60/160, shares 1/2: F = 2^(-1.25) and 2^(-0.75); b goes first.
    assert no_decay.fairshare_factor("a") == pytest.approx(2**-1.25, rel=1e-6)
    assert no_decay.fairshare_factor("b") == pytest.approx(2**-0.75, rel=1e-6)
    assert no_decay.priority(gb, 1000, 100) > no_decay.priority(ga, 1000, 100)

    decayed = SlurmScheduler(f, SlurmConfig(decay_half_life_seconds=100))
    decayed.account(view)
    # Half-life 100 s at t=1000: a's usage counts (100/ln 2)(2^-9 - 2^-10), b's (100/ln 2)(2^-0.4 - 2^-1).
    usage_a = 100 / math.log(2) * (2**-9 - 2**-10)
    usage_b = 100 / math.log(2) * (2**-0.4 - 2**-1)
    assert decayed.usage["a"] == pytest.approx(usage_a, rel=1e-6)
    assert decayed.usage["b"] == pytest.approx(usage_b, rel=1e-6)
    assert decayed.priority(ga, 1000, 100) > decayed.priority(gb, 1000, 100)


# -- selection by name -----------------------------------------------------------------------------


def _cli() -> click.Group:
    @click.group()
    def sim() -> None:
        pass

    add_commands(sim)
    return sim


def test_study_selects_policies_by_name_and_refuses_unknown_ones() -> None:
    runner = CliRunner()
    base = ["study", "--jobs", "60", "--gpus", "32", "--load", "1.1", "--seeds", "1", "--check-invariants", "--json"]
    out = runner.invoke(_cli(), [*base, "--policies", "slurm,kueue"])
    assert out.exit_code == 0, out.output
    runs = json.loads(out.stdout)["runs"]
    assert [r["policy"] for r in runs] == ["slurm", "kueue"]
    assert all(r["jobs"]["completed"] == 60 for r in runs)
    out = runner.invoke(_cli(), [*base, "--policies", "kueue,yarn"])
    assert out.exit_code == 2
    assert "unknown policy 'yarn'" in out.output


@pytest.mark.parametrize("policy", ["kueue", "volcano", "armada", "slurm"])
def test_peer_on_a_contended_generated_workload_finishes_everything_within_capacity_and_repeats(policy: str) -> None:
    generated = generate(GeneratorConfig(jobs=300, gpus=64, seed=3, load=1.3))
    f = build_fleet(generated.fleet)
    first = simulate(f, generated.jobs, policy, seed=3, config=CHECKED)  # capacity checked every cycle
    assert first.finish.count(None) == len(first.rejected)
    again = simulate(f, generated.jobs, policy, seed=3, config=CHECKED)
    assert (again.first_admit, again.finish, again.evictions) == (first.first_admit, first.finish, first.evictions)


class _Overbooker:
    """Admits every pending gang onto the first node, full or not."""

    name = "overbooker"
    one_priority = False

    def decide(self, view: CycleView) -> CycleResult:
        node = view.fleet.nodes[0]
        admissions = tuple(
            Admission(g.id, node.cluster_id, (PodAssignment("main", 0, node.id, {GPU: g.gpus}),))
            for gangs in view.pending.values()
            for g in gangs
        )
        return CycleResult(Decision(admissions=admissions))


def test_the_capacity_check_catches_a_policy_that_overbooks_a_node() -> None:
    f = fleet({"a": 4})
    jobs = [job("j1", 0, "a", 100, gpus=3), job("j2", 0, "a", 100, gpus=3)]
    with pytest.raises(AssertionError, match="nodes over capacity: c1/gpu/0"):
        simulate(f, jobs, "fifo", config=CHECKED, scheduler=_Overbooker())
