"""The queueing simulator: hand-checked metrics, determinism, policy differences, the generator
and the CLI."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from controlplane.cli.sim_study_commands import add_commands
from controlplane.domain.model import WorkloadKind
from controlplane.service.cluster_specs import ClusterSpec, PoolSpec
from controlplane.tracesim.queueing.engine import SimConfig, simulate
from controlplane.tracesim.queueing.generate import GeneratorConfig, generate, gpu_mix, load_tables, team_quotas
from controlplane.tracesim.queueing.inputs import (
    FleetDoc,
    Job,
    QueueDoc,
    TeamDoc,
    build_fleet,
    load_workload,
    write_workload,
)
from controlplane.tracesim.queueing.metrics import jain, max_min_fair, percentile, summarize

CHECKED = SimConfig(cycle_seconds=10, check_invariants=True)


def small_fleet(gpus_per_node: int = 2, nodes: int = 1) -> FleetDoc:
    pool = PoolSpec(
        name="gpu",
        gpu_model="A100",
        gpus_per_node=gpus_per_node,
        cpu_millis=64_000,
        memory_mib=512_000,
        node_count=nodes,
    )
    return FleetDoc(
        clusters=[ClusterSpec(name="c1", pools=[pool])],
        teams=[TeamDoc(name="a"), TeamDoc(name="b")],
        queues=[
            QueueDoc(name="a", parent="a", guaranteed={"gpu-eq": 1}),
            QueueDoc(name="b", parent="b", guaranteed={"gpu-eq": 1}),
        ],
    )


def job(id: str, at: float, queue: str, duration: float, gpus: int = 1, priority: int = 100) -> Job:
    return Job(id, at, queue, gpus, 1, duration, priority, WorkloadKind.TRAINING)


def test_metrics_by_hand_on_two_gpus_and_three_jobs() -> None:
    # j1 and j2 start at 0; j3 waits for j2 (ends at 50), starts at 50 and ends at 150.
    fleet = build_fleet(small_fleet())
    jobs = [job("j1", 0, "a", 100), job("j2", 0, "a", 50), job("j3", 0, "b", 100)]
    result = simulate(fleet, jobs, "fifo", config=CHECKED)
    summary = summarize(result, fleet)
    assert summary["jobs"] == {
        "total": 3,
        "completed": 3,
        "rejected": 0,
        "unfinished": 0,
        "evictions": 0,
        "idle_reclaims": 0,
    }
    assert summary["avg_jct_seconds"] == pytest.approx((100 + 50 + 150) / 3, abs=0.1)
    delays = summary["queueing_delay_seconds"]
    # Sorted delays 0, 0, 50; position p/100 * 2, linear between ranks.
    assert delays["p50"] == 0
    assert delays["p95"] == pytest.approx(45.0)
    assert delays["p99"] == pytest.approx(49.0)
    assert summary["makespan_seconds"] == 150
    assert summary["gpu_allocation"] == pytest.approx(250 / (2 * 150), abs=1e-6)
    assert summary["effective_utilization"] == summary["gpu_allocation"]
    # Every job at t=0: the window falls back to the whole run. a got 150 of 250 GPU-s, b 100;
    # entitled 1/2 each: x = 1.2, 0.8 and J = 2^2 / (2 * (1.44 + 0.64)).
    assert summary["jain_fairness"] == pytest.approx(4 / 4.16, abs=1e-6)
    # Demanded 150 and 100 GPU-s too: the max-min fair split is what they got, J = 1.
    assert summary["jain_fairness_demand_aware"] == pytest.approx(1.0)
    assert summary["large_gang_longest_wait_seconds"] is None


def test_effective_utilization_uses_the_utilization_column() -> None:
    fleet = build_fleet(small_fleet())
    jobs = [Job("j1", 0, "a", 2, 1, 100, 100, WorkloadKind.TRAINING, utilization=0.5)]
    summary = summarize(simulate(fleet, jobs, "gpufleet", config=CHECKED), fleet)
    assert summary["gpu_allocation"] == 1.0
    assert summary["effective_utilization"] == 0.5
    assert "per-job utilization" in summary["effective_utilization_source"]


def test_max_min_fair_water_filling() -> None:
    # b asks for only 10 %: a and c split the rest by entitlement (1:2), none above its demand.
    fair = max_min_fair({"a": 0.25, "b": 0.5, "c": 0.25}, {"a": 0.6, "b": 0.1, "c": 0.3})
    assert fair["b"] == pytest.approx(0.1)
    assert fair["c"] == pytest.approx(0.3)  # capped by its demand once a's level passes it
    assert fair["a"] == pytest.approx(0.6)
    fair = max_min_fair({"a": 0.5, "b": 0.5}, {"a": 0.9, "b": 0.1})
    assert fair == {"a": pytest.approx(0.9), "b": pytest.approx(0.1)}


def test_percentile_and_jain() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == 0.25


def test_fair_share_reorders_where_fifo_does_not() -> None:
    # Queue a fills both GPUs (one on b's guarantee); a's 2-GPU job and b's job arrive next.
    fleet = build_fleet(small_fleet())
    jobs = [
        job("a1", 0, "a", 100),
        job("a2", 0, "a", 100),
        job("a3", 1, "a", 100, gpus=2),
        job("b1", 2, "b", 100),
    ]
    outcome = {}
    for policy in ("fifo", "gpufleet"):
        result = simulate(fleet, jobs, policy, config=CHECKED)
        admitted = {result.jobs[i].id: a for i, a in enumerate(result.first_admit)}
        outcome[policy] = (admitted, sum(result.evictions))
    fifo, fifo_evictions = outcome["fifo"]
    fair, fair_evictions = outcome["gpufleet"]
    # FIFO: a3 is older, takes both GPUs at 100; b1 waits until 200.
    assert fifo["a3"] == 100
    assert fifo["b1"] == 200
    assert fifo_evictions == 0
    # gpufleet: b is within its guarantee and a borrows: b1 reclaims at the first cycle after it arrives.
    assert fair["b1"] == 10
    assert fair_evictions == 1


def test_cycles_only_on_change_and_at_most_every_cycle_seconds() -> None:
    fleet = build_fleet(small_fleet())
    # Arrivals at 0, 1 and 5000: the second waits for the cycle at 10; then the clock jumps.
    jobs = [job("j1", 0, "a", 20), job("j2", 1, "b", 20), job("j3", 5000, "a", 20)]
    result = simulate(fleet, jobs, "gpufleet", config=CHECKED)
    assert [result.first_admit[i] for i in range(3)] == [0, 10, 5000]
    assert result.cycles == 3


def test_same_seed_same_json_and_different_seed_differs(tmp_path: Path) -> None:
    def study(seed: int) -> dict[str, Any]:
        out = CliRunner().invoke(
            cli(), ["study", "--jobs", "150", "--gpus", "64", "--seed", str(seed), "--seeds", "1", "--json"]
        )
        assert out.exit_code == 0, out.output
        data: dict[str, Any] = json.loads(out.stdout)
        for run in data["runs"]:
            run.pop("runtime")  # wall and CPU seconds: the only measured, non-simulated part
        for record in data["records"]:
            record.pop("cpu_seconds"), record.pop("cpu_seconds_ci95")
        return data

    first = study(3)
    assert first == study(3)
    assert first != study(4)
    assert [run["policy"] for run in first["runs"]] == ["fifo", "priority", "gpufleet"]


def test_generator_columns_and_distributions(tmp_path: Path) -> None:
    config = GeneratorConfig(jobs=2000, gpus=512, seed=1, max_gang=64, max_duration=86_400)
    generated = generate(config)
    jobs = generated.jobs
    assert len(jobs) == 2000
    assert [j.submit_time for j in jobs] == sorted(j.submit_time for j in jobs)
    queues = {q.name for q in generated.fleet.effective_queues()}
    for j in jobs:
        assert j.gpus in (1, 2, 4, 8, 16, 32, 64)
        assert j.gpus_per_pod == min(j.gpus, 8)
        assert 1 <= j.duration <= 86_400
        assert j.max_runtime is not None
        assert j.duration <= j.max_runtime <= 3 * j.duration + 0.01
        assert j.queue in queues
        assert j.priority in (100, 200)
    # Median job: one GPU, as in every trace of the Acme table.
    assert sorted(j.gpus for j in jobs)[len(jobs) // 2] == 1
    assert any(j.pods > 1 for j in jobs)  # multi-node gangs
    # Guarantees add up to the fleet.
    fleet = build_fleet(generated.fleet)
    assert fleet.capacity_gpus == 512
    assert sum(q.guaranteed["gpu-eq"] for q in generated.fleet.effective_queues()) == 512
    # The written CSV replays to the same jobs.
    path = tmp_path / "jobs.csv"
    write_workload(jobs, path)
    with path.open() as handle:
        header = next(csv.reader(handle))
    assert header == [
        "id",
        "submit_time",
        "queue",
        "gpus_per_pod",
        "pods",
        "duration",
        "priority",
        "kind",
        "max_runtime",
    ]
    assert load_workload(path) == jobs
    assert generate(config).jobs == jobs
    assert generate(GeneratorConfig(jobs=2000, gpus=512, seed=2, max_gang=64)).jobs != jobs


def test_gpu_mix_fits_the_trace_mean_and_quotas_scale() -> None:
    tables = load_tables()
    for trace in ("Philly", "Helios"):
        mean, _median, largest = tables.gpu_stats[trace]
        mix = gpu_mix(mean, largest, int(largest))
        assert sum(p for _, p in mix) == pytest.approx(1.0)
        assert sum(s * p for s, p in mix) == pytest.approx(mean, rel=1e-6)
        assert mix[0][0] == 1
        assert mix[0][1] > 0.5  # median 1, as in the trace
    quotas = team_quotas(tables.vc_quota, 5000)
    assert sum(q for _, q in quotas) == 5000
    assert len(tables.runtime_quantiles) == 1001
    assert tables.runtime_quantiles[500] == pytest.approx(1186.0)  # the Philly median
    assert all(math.isfinite(v) for v in tables.runtime_quantiles)


def cli() -> click.Group:
    @click.group()
    def sim() -> None:
        pass

    add_commands(sim)
    return sim


def test_cli_run_json_shape_and_report(tmp_path: Path) -> None:
    runner = CliRunner()
    jobs, fleet = tmp_path / "jobs.csv", tmp_path / "fleet.yaml"
    out = runner.invoke(
        cli(),
        ["generate", "--jobs", "200", "--gpus", "64", "--seed", "5", "--out", str(jobs), "--fleet-out", str(fleet)],
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["jobs"] == 200
    report = tmp_path / "out.html"
    args = ["run", "--fleet", str(fleet), "--workload", str(jobs), "--policy", "gpufleet", "--seed", "1"]
    out = runner.invoke(cli(), [*args, "--json", "--report", str(report)])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout)
    for key in (
        "jobs",
        "avg_jct_seconds",
        "queueing_delay_seconds",
        "gpu_allocation",
        "effective_utilization",
        "effective_utilization_source",
        "jain_fairness",
        "large_gang_longest_wait_seconds",
        "makespan_seconds",
        "cycles",
        "runtime",
        "per_queue",
    ):
        assert key in summary
    assert set(summary["queueing_delay_seconds"]) == {"mean", "p50", "p95", "p99"}
    assert set(summary["runtime"]) >= {"wall_seconds", "cpu_seconds"}
    assert summary["jobs"]["completed"] == 200
    page = report.read_text()
    for plot in ("plot-utilization", "plot-delay-cdf", "plot-shares"):
        assert f'<svg id="{plot}"' in page
    assert "<script" not in page  # self-contained, nothing to fetch


def test_cli_rejects_unknown_queue(tmp_path: Path) -> None:
    runner = CliRunner()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "clusters:\n- name: c1\n  pools:\n  - {name: gpu, gpu_model: A100, gpus_per_node: 8, cpu_millis: 64000,"
        " memory_mib: 512000, node_count: 1}\nteams:\n- {name: a, guaranteed: {gpu-eq: 8}}\n"
    )
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n- {id: x, submit_time: 0, queue: nope, gpus_per_pod: 1, pods: 1, duration: 5,"
        " priority: 1, kind: batch}\n"
    )
    out = runner.invoke(cli(), ["run", "--fleet", str(fleet), "--workload", str(jobs), "--json"])
    assert out.exit_code != 0
    assert "nope" in out.output
