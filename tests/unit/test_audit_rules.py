"""The audit's rules, one by one: each fires on a fact set that breaks it and stays silent on one
that keeps it; the whole evaluation is deterministic and sorted."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.audit import (
    AuditFacts,
    AuditThresholds,
    ClassFact,
    ClusterFact,
    NodePodsFact,
    PoolFact,
    Rule,
    RunFact,
    ServingFact,
    Severity,
    TeamUseFact,
    TreeFact,
    evaluate,
)
from controlplane.domain.model import Taint
from controlplane.domain.sharing import SharingMode

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
GPU_TAINT = (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
T = AuditThresholds()


def pool(
    name: str, sharing: str = "exclusive", taints: tuple[Taint, ...] = GPU_TAINT, model: str = "A100-80GB"
) -> PoolFact:
    return PoolFact("c1", name, model, SharingMode.parse(sharing), 8, 2, taints)


def run(
    run_id: str,
    team: str,
    pools: tuple[str, ...] = ("c1/whole",),
    kind: str = "training",
    preemptible: bool = True,
    pods: int = 1,
    cluster: str = "c1",
    started: timedelta = timedelta(minutes=5),
    window_age: timedelta | None = timedelta(seconds=30),
    idle_stage: str = "",
    live: bool = True,
    reclaimed: timedelta | None = None,
    workload: str | None = None,
) -> RunFact:
    return RunFact(
        run_id=run_id,
        workload=workload or f"w-{run_id}",
        team=team,
        queue=f"{team}-q",
        cluster=cluster,
        pools=pools,
        kind=kind,
        preemptible=preemptible,
        pods=pods,
        live=live,
        running=live,
        created_at=NOW - started,
        started_at=NOW - started,
        gpu_eq=8.0,
        last_window_end=None if window_age is None else NOW - window_age,
        idle_stage=idle_stage,
        idle_windows=6 if idle_stage else 0,
        reclaimed_idle_at=None if reclaimed is None else NOW - reclaimed,
    )


def tree(*teams: str, limits: bool = True, guarantee: bool = True) -> tuple[TreeFact, ...]:
    out: list[TreeFact] = []
    for i, team in enumerate(teams):
        out.append(TreeFact("team", team, None, {}, {"gpu-eq": 64} if limits else {}))
        g = {"gpu-eq": 8.0} if guarantee and i == 0 else {}
        out.append(TreeFact("queue", f"{team}-q", team, g, {"gpu-eq": 32} if limits else {}))
    return tuple(out)


GOOD = AuditFacts(
    pools=(pool("whole"), pool("mig", "mig:all-balanced"), pool("ts", "timeslice:4", model="L4")),
    clusters=(ClusterFact("c1", "sim"), ClusterFact("k1", "kubernetes", "kueue")),
    # team b may not use L4 (the time-sliced pool): only team a may
    tree=(
        *tree("a"),
        TreeFact("team", "b", None, {}, {"gpu-eq": 64, "L4": 0}),
        TreeFact("queue", "b-q", "b", {}, {"gpu-eq": 8}),
    ),
    classes=(ClassFact("batch", 100, True, 600), ClassFact("production", 1000, False, 0)),
    runs=(run("r1", "a"), run("r2", "b", pools=("c1/ts",), kind="inference")),
    team_use=(TeamUseFact("a", 10.0, 10.0, 7.0, 3.0),),
)


def rules(facts: AuditFacts) -> set[str]:
    return {f.rule.value for f in evaluate(facts, T, NOW)}


def test_a_fleet_that_keeps_the_checklist_has_no_findings() -> None:
    # team b cannot use L4 in one of its queues but can in the other: still open; so bar it entirely
    good = dataclasses.replace(
        GOOD,
        tree=(
            *tree("a"),
            TreeFact("team", "b", None, {}, {"gpu-eq": 64, "L4": 0}),
            TreeFact("queue", "b-q", "b", {}, {"gpu-eq": 8}),
        ),
    )
    assert evaluate(good, T, NOW) == ()


def test_untainted_gpu_pool() -> None:
    weak = (Taint("nvidia.com/gpu", "present", "PreferNoSchedule"),)
    facts = dataclasses.replace(GOOD, pools=(*GOOD.pools, pool("bare", taints=()), pool("weak", taints=weak)))
    found = [f for f in evaluate(facts, T, NOW) if f.rule is Rule.GPU_POOL_UNTAINTED]
    assert [f.objects[0].name for f in found] == ["c1/bare", "c1/weak"]
    assert found[1].evidence.taints == ("nvidia.com/gpu=present:PreferNoSchedule",)  # type: ignore[union-attr]
    aks = pool("aks", taints=(Taint("sku", "gpu", "NoSchedule"),))
    assert Rule.GPU_POOL_UNTAINTED.value not in rules(dataclasses.replace(GOOD, pools=(*GOOD.pools, aks)))


def test_non_gpu_pods_on_gpu_nodes_one_finding_per_pool_admins_only() -> None:
    seen = (
        NodePodsFact("c1", "whole", "n2", 2, ("ns/a", "ns/b")),
        NodePodsFact("c1", "whole", "n1", 1, ("ns/c",)),
        NodePodsFact("c1", "mig", "n9", 0, ()),
    )
    found = [
        f
        for f in evaluate(dataclasses.replace(GOOD, node_pods=seen), T, NOW)
        if f.rule is Rule.NON_GPU_PODS_ON_GPU_NODES
    ]
    assert len(found) == 1
    assert found[0].evidence.pods == 3  # type: ignore[union-attr]
    assert found[0].evidence.nodes == 2  # type: ignore[union-attr]
    assert found[0].evidence.sample == ("ns/c", "ns/a", "ns/b")  # type: ignore[union-attr]
    assert not found[0].visible_to("a")
    assert found[0].visible_to(None)


def test_timeslice_pool_open_to_every_team_where_mig_exists() -> None:
    open_tree = dataclasses.replace(GOOD, tree=tree("a", "b"))
    found = [f for f in evaluate(open_tree, T, NOW) if f.rule is Rule.TIMESLICE_POOL_OPEN_TO_ALL]
    assert [f.objects[0].name for f in found] == ["c1/ts"]
    assert found[0].visible_to("a")  # a fleet finding: it names a pool only
    no_mig = dataclasses.replace(open_tree, pools=tuple(p for p in GOOD.pools if p.name != "mig"))
    assert Rule.TIMESLICE_POOL_OPEN_TO_ALL.value not in rules(no_mig)
    one_queue_barred = dataclasses.replace(GOOD, tree=(*tree("a", "b"), TreeFact("queue", "b-x", "b", {}, {"L4": 0})))
    assert Rule.TIMESLICE_POOL_OPEN_TO_ALL.value in rules(one_queue_barred)  # b-q still reaches it
    one_team = dataclasses.replace(GOOD, tree=tree("a"))
    assert Rule.TIMESLICE_POOL_OPEN_TO_ALL.value not in rules(one_team)


def test_inference_or_production_of_several_teams_on_time_sliced_gpus() -> None:
    shared = (
        run("r2", "b", pools=("c1/ts",), kind="inference"),
        run("r3", "a", pools=("c1/ts",), kind="training", preemptible=False),
    )
    facts = dataclasses.replace(GOOD, runs=shared)
    found = [f for f in evaluate(facts, T, NOW) if f.rule is Rule.TIMESLICE_SHARED_PRODUCTION]
    assert [(f.audience.team, f.evidence.other_teams) for f in found] == [("a", 1), ("b", 1)]  # type: ignore[union-attr]
    # each team's finding names that team only
    assert all({o.name for o in f.objects if o.kind == "team"} == {f.audience.team} for f in found)
    # preemptible training of the second team is no production work
    calm = dataclasses.replace(GOOD, runs=(shared[0], run("r3", "a", pools=("c1/ts",))))
    assert Rule.TIMESLICE_SHARED_PRODUCTION.value not in rules(calm)


def test_multi_tenant_inference_on_shared_gpus_with_mig_available() -> None:
    mps = pool("mps", "mps:2", model="L4")
    serving = (run("r1", "a", pools=("c1/mps",), kind="inference"), run("r2", "b", pools=("c1/mps",), kind="inference"))
    facts = dataclasses.replace(GOOD, pools=(*GOOD.pools, mps), runs=serving)
    assert Rule.SHARED_INFERENCE_NOT_MIG.value in rules(facts)
    no_mig = dataclasses.replace(facts, pools=tuple(p for p in facts.pools if p.name != "mig"))
    assert Rule.SHARED_INFERENCE_NOT_MIG.value not in rules(no_mig)


def test_missing_limits_of_teams_and_queues() -> None:
    facts = dataclasses.replace(GOOD, tree=tree("a", "b", limits=False))
    found = {
        (f.rule.value, f.objects[0].name, f.severity)
        for f in evaluate(facts, T, NOW)
        if f.rule in (Rule.TEAM_WITHOUT_LIMIT, Rule.QUEUE_WITHOUT_LIMIT)
    }
    assert ("team-without-limit", "a", Severity.WARNING) in found
    assert ("queue-without-limit", "a-q", Severity.WARNING) in found
    bounded = (TreeFact("team", "a", None, {"gpu-eq": 8}, {"gpu-eq": 64}), TreeFact("queue", "a-q", "a", {}, {}))
    got = [f for f in evaluate(dataclasses.replace(GOOD, tree=bounded), T, NOW) if f.rule is Rule.QUEUE_WITHOUT_LIMIT]
    assert [(f.severity, f.evidence.bounded_by) for f in got] == [(Severity.INFO, "team")]  # type: ignore[union-attr]


def test_preemptible_class_without_minimum_runtime() -> None:
    facts = dataclasses.replace(
        GOOD, classes=(ClassFact("batch", 100, True, 0), ClassFact("production", 1000, False, 0))
    )
    found = [f.objects[0].name for f in evaluate(facts, T, NOW) if f.rule is Rule.CLASS_WITHOUT_PREEMPTION_POLICY]
    assert found == ["batch"]


def test_fleet_without_any_guarantee() -> None:
    assert Rule.FLEET_WITHOUT_GUARANTEE.value in rules(dataclasses.replace(GOOD, tree=tree("a", "b", guarantee=False)))
    team_holds_it = (
        TreeFact("team", "a", None, {"gpu-eq": 4}, {"gpu-eq": 8}),
        TreeFact("queue", "a-q", "a", {}, {"gpu-eq": 8}),
    )
    assert Rule.FLEET_WITHOUT_GUARANTEE.value not in rules(dataclasses.replace(GOOD, tree=team_holds_it))


def test_multi_pod_training_on_a_cluster_without_gang() -> None:
    clusters = (ClusterFact("c1", "sim"), ClusterFact("k1", "kubernetes", "none"))
    runs = (
        run("r1", "a", cluster="k1", pods=4),
        run("r2", "a", cluster="k1", pods=1),
        run("r3", "b", cluster="c1", pods=4),
    )
    found = [
        f
        for f in evaluate(dataclasses.replace(GOOD, clusters=clusters, runs=runs), T, NOW)
        if f.rule is Rule.TRAINING_WITHOUT_GANG
    ]
    assert [(f.objects[0].name, f.audience.team, f.evidence.runs) for f in found] == [("k1", "a", 1)]  # type: ignore[union-attr]
    kueue = (ClusterFact("c1", "sim"), ClusterFact("k1", "kubernetes", "kueue"))
    assert Rule.TRAINING_WITHOUT_GANG.value not in rules(dataclasses.replace(GOOD, clusters=kueue, runs=runs))


def test_cluster_without_telemetry_is_one_finding_and_unmeasured_runs_elsewhere() -> None:
    old = timedelta(hours=2)
    runs = (
        run("r1", "a", cluster="k1", started=old, window_age=None),
        run("r2", "b", cluster="k1", started=old, window_age=timedelta(hours=1)),
        run("r3", "a", cluster="c1", started=old, window_age=timedelta(hours=1)),  # c1 still reports for r4
        run("r4", "b", cluster="c1", started=old, window_age=timedelta(seconds=10)),
    )
    found = evaluate(dataclasses.replace(GOOD, runs=runs), T, NOW)
    assert [f.objects[0].name for f in found if f.rule is Rule.CLUSTER_WITHOUT_TELEMETRY] == ["k1"]
    assert [f.objects[0].name for f in found if f.rule is Rule.RUN_UNMEASURED] == ["r3"]
    fresh = (run("r1", "a", cluster="k1", started=timedelta(seconds=60), window_age=None),)
    assert rules(dataclasses.replace(GOOD, runs=fresh)) == set()


def test_allocation_far_above_use_with_the_cost_at_stake() -> None:
    use = (
        TeamUseFact("a", 20.0, 10.0, 0.5, 3.0),
        TeamUseFact("b", 10.0, 10.0, 2.0, 1.0),
        TeamUseFact("c", 0.5, 0.5, 0.0, 9.0),
    )
    found = [f for f in evaluate(dataclasses.replace(GOOD, team_use=use), T, NOW) if f.rule is Rule.ALLOCATION_UNUSED]
    assert [(f.objects[0].name, f.severity) for f in found] == [("a", Severity.HIGH), ("b", Severity.WARNING)]
    a = found[0].evidence
    assert (a.wasted_gpu_hours, a.cost_at_stake, a.utilization) == (9.5, 28.5, 0.05)  # type: ignore[union-attr]


def test_runs_the_idle_policy_marks() -> None:
    runs = (
        run("r1", "a", idle_stage="reclaim"),
        run("r2", "b", idle_stage="notify"),
        run("r3", "b", idle_stage="reclaim", live=False),
    )
    found = [
        (f.objects[0].name, f.severity)
        for f in evaluate(dataclasses.replace(GOOD, runs=runs), T, NOW)
        if f.rule is Rule.IDLE_RUN
    ]
    assert found == [("r1", Severity.HIGH), ("r2", Severity.WARNING)]


def test_workloads_whose_idle_runs_were_reclaimed_one_finding_each() -> None:
    runs = (
        run("r1", "a", live=False, reclaimed=timedelta(hours=3), workload="hoarder"),
        run("r2", "a", live=False, reclaimed=timedelta(hours=1), workload="hoarder"),
        run("r3", "a", workload="hoarder"),  # its live run, not marked: nothing about it
        run("r4", "b", live=False, workload="finished"),
    )
    found = [f for f in evaluate(dataclasses.replace(GOOD, runs=runs), T, NOW) if f.rule is Rule.IDLE_RECLAIMED]
    assert [(f.objects[0].name, f.audience.team) for f in found] == [("hoarder", "a")]
    evidence = found[0].evidence
    assert evidence.reclaims == 2  # type: ignore[union-attr]
    assert evidence.last_reclaimed_at == NOW - timedelta(hours=1)  # type: ignore[union-attr]
    assert rules(dataclasses.replace(GOOD, runs=runs[2:])) == set()


BAD = AuditFacts(
    pools=(pool("bare", taints=()), pool("mig", "mig:all-balanced"), pool("ts", "timeslice:4", model="L4")),
    node_pods=(NodePodsFact("c1", "bare", "n1", 3, ("a/x", "b/y", "c/z")),),
    clusters=(ClusterFact("k1", "kubernetes", "none"),),
    tree=tree("a", "b", "c", limits=False, guarantee=False),
    classes=(ClassFact("batch", 100, True, 0),),
    runs=tuple(
        run(
            f"r{i}",
            "abc"[i % 3],
            pools=("c1/ts",),
            kind=("inference", "training")[i % 2],
            pods=1 + i % 3,
            cluster="k1",
            started=timedelta(hours=i % 3),
            window_age=None if i % 2 else timedelta(minutes=i),
            idle_stage=("", "notify", "reclaim")[i % 3],
        )
        for i in range(12)
    ),
    team_use=(TeamUseFact("a", 10.0, 10.0, 0.1, 2.0),),
)


def serving(
    run_id: str,
    traffic: bool = True,
    reading_age: timedelta | None = timedelta(seconds=30),
    latency: float | None = 80.0,
    objective: float | None = 500.0,
    running: timedelta | None = timedelta(hours=1),
) -> ServingFact:
    return ServingFact(
        run_id=run_id,
        workload=f"w-{run_id}",
        team="b",
        running_since=None if running is None else NOW - running,
        traffic_declared=traffic,
        latency_objective_ms=objective,
        requests_per_second=3.0,
        latency_ms=latency,
        observed_at=None if reading_age is None else NOW - reading_age,
    )


def test_inference_whose_traffic_the_idle_policy_cannot_read() -> None:
    facts = dataclasses.replace(
        GOOD,
        serving=(
            serving("r2"),  # declared and fresh: fine
            serving("s-undeclared", traffic=False),
            serving("s-stale", reading_age=timedelta(hours=2)),
            serving("s-never", reading_age=None, latency=None),
            serving("s-young", traffic=False, running=timedelta(minutes=5)),  # too new to expect a reading
            serving("s-queued", traffic=False, running=None),
        ),
    )
    found = [f for f in evaluate(facts, T, NOW) if f.rule is Rule.INFERENCE_TRAFFIC_UNKNOWN]
    assert [f.objects[0].name for f in found] == ["s-never", "s-stale", "s-undeclared"]
    assert {f.severity for f in found} == {Severity.WARNING}
    assert [f.evidence.declared for f in found] == [True, True, False]  # type: ignore[union-attr]
    assert all(f.visible_to("b") and not f.visible_to("a") for f in found)


def test_latency_above_the_objective_is_high_on_shared_gpus() -> None:
    facts = dataclasses.replace(
        GOOD,
        runs=(*GOOD.runs, run("r3", "b", pools=("c1/whole",), kind="inference")),
        serving=(
            serving("r2", latency=900.0),  # on the time-sliced pool
            serving("r3", latency=600.0),  # on whole GPUs
            serving("s-ok", latency=499.0),
            serving("s-old", latency=900.0, reading_age=timedelta(hours=2)),
            serving("s-none", latency=900.0, objective=None),
        ),
    )
    found = {f.objects[0].name: f for f in evaluate(facts, T, NOW) if f.rule is Rule.LATENCY_OBJECTIVE_MISSED}
    assert set(found) == {"r2", "r3"}
    assert found["r2"].severity is Severity.HIGH
    assert found["r2"].evidence.shared_pools == ("c1/ts",)  # type: ignore[union-attr]
    assert found["r3"].severity is Severity.WARNING


@settings(max_examples=50, deadline=None)
@given(st.permutations(BAD.runs), st.permutations(BAD.tree), st.permutations(BAD.pools))
def test_findings_are_deterministic_and_sorted(
    runs: list[RunFact], nodes: list[TreeFact], pools: list[PoolFact]
) -> None:
    shuffled = dataclasses.replace(BAD, runs=tuple(runs), tree=tuple(nodes), pools=tuple(pools))
    found = evaluate(shuffled, T, NOW)
    assert found == evaluate(BAD, T, NOW)
    keys = [f.sort_key for f in found]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)  # one finding per rule and objects
    assert len({f.rule for f in found}) >= 10
