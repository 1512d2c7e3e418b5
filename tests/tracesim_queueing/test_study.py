"""The study over loads and seeds: confidence intervals, the JSON records, the workload options
(load lists, burst, hoarding) and the idle-reclaim and preemption accounting, by hand."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import click
import pytest
from click.testing import CliRunner

from controlplane.cli.sim_study_commands import add_commands
from controlplane.tracesim.queueing.aggregate import aggregate, mean_ci95, t975
from controlplane.tracesim.queueing.engine import simulate
from controlplane.tracesim.queueing.generate import DAY, GeneratorConfig, generate
from controlplane.tracesim.queueing.inputs import build_fleet, load_fleet, load_workload, write_workload
from controlplane.tracesim.queueing.metrics import summarize
from controlplane.tracesim.queueing.study import BURST_BASE_LOAD, BURST_FACTOR, LoadSpec, parse_loads
from tests.tracesim_queueing.test_queueing import CHECKED, job, small_fleet


def _cli() -> click.Group:
    @click.group()
    def sim() -> None:
        pass

    add_commands(sim)
    return sim


def test_confidence_interval_by_hand() -> None:
    # 1..5: mean 3, sample sd sqrt(2.5); t(0.975, 4) = 2.776 -> 2.776 * sqrt(2.5) / sqrt(5) = 1.9629.
    mean, half = mean_ci95([1.0, 2.0, 3.0, 4.0, 5.0])
    assert mean == 3.0
    assert half == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5))
    assert half == pytest.approx(1.9629, abs=1e-4)
    # Two values: t(0.975, 1) = 12.706 and s / sqrt(n) = |a - b| / 2.
    assert mean_ci95([2.0, 4.0]) == (3.0, pytest.approx(12.706))
    assert mean_ci95([7.0]) == (7.0, None)  # no interval from one value
    assert mean_ci95([5.0, 5.0, 5.0]) == (5.0, 0.0)
    assert t975(30) == 2.042
    assert t975(31) == 1.96
    with pytest.raises(ValueError, match="no values"):
        mean_ci95([])


def test_aggregate_keeps_policy_load_and_skips_undefined_values() -> None:
    def summary(seed: int, jct: float | None, wait: float | None) -> dict[str, Any]:
        fleet = build_fleet(small_fleet())
        result = simulate(fleet, [job("j1", 0, "a", 100)], "fifo", seed=seed, config=CHECKED)
        s = summarize(result, fleet)
        s["runtime"] = {"cpu_seconds": 0.0}
        s["avg_jct_seconds"], s["large_gang_longest_wait_seconds"] = jct, wait
        return s

    record = aggregate("fifo", 1.1, [summary(0, 10.0, None), summary(1, 20.0, None), summary(2, 30.0, 5.0)])
    assert (record["policy"], record["load"], record["seeds"]) == ("fifo", 1.1, [0, 1, 2])
    assert record["avg_jct_seconds"] == 20.0
    assert record["avg_jct_seconds_ci95"] == pytest.approx(4.303 * 10 / math.sqrt(3), abs=1e-5)
    assert (record["large_gang_longest_wait_seconds"], record["large_gang_longest_wait_seconds_ci95"]) == (5.0, None)


def test_parse_loads() -> None:
    assert parse_loads("0.9, 1.1,1.3,burst,1.1") == [
        LoadSpec(0.9, 0.9),
        LoadSpec(1.1, 1.1),
        LoadSpec(1.3, 1.3),
        LoadSpec("burst", BURST_BASE_LOAD, BURST_FACTOR),
    ]
    for bad in ("", "fast", "0", "-1"):
        with pytest.raises(ValueError, match="load"):
            parse_loads(bad)


def test_tiny_study_json_records_over_two_loads_two_seeds_two_policies() -> None:
    args = ["study", "--jobs", "80", "--gpus", "32", "--load", "1.1,burst", "--seeds", "2", "--seed", "4"]
    out = CliRunner().invoke(_cli(), [*args, "--policies", "fifo,gpufleet", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["seeds"] == [4, 5]
    assert [(r["load"], r["policy"]) for r in data["records"]] == [
        (1.1, "fifo"),
        (1.1, "gpufleet"),
        ("burst", "fifo"),
        ("burst", "gpufleet"),
    ]
    for record in data["records"]:
        assert record["seeds"] == [4, 5]
        assert isinstance(record["avg_jct_seconds"], float)
        for name in ("avg_jct_seconds", "queueing_delay_p99_seconds", "effective_utilization", "jct_p95_seconds"):
            assert record[f"{name}_ci95"] is not None
            assert record[f"{name}_ci95"] >= 0
        assert record["idle_reclaimed_gpu_hours"] == 0.0  # no hoarding mix asked for
    # Every replay of every seed is there too, tagged with its load; the means are theirs.
    runs = data["runs"]
    assert len(runs) == 8
    assert {(r["load"], r["seed"]) for r in runs} == {(1.1, 4), (1.1, 5), ("burst", 4), ("burst", 5)}
    fifo = [r["avg_jct_seconds"] for r in runs if r["load"] == 1.1 and r["policy"] == "fifo"]
    assert data["records"][0]["avg_jct_seconds"] == pytest.approx(sum(fifo) / 2)
    burst = [w for w in data["workloads"] if w["load"] == "burst"]
    assert all(w["burst_factor"] == 2.0 and w["offered_load"] == 1.0 for w in burst)


def test_study_report_has_the_table_and_plots_per_load(tmp_path: Any) -> None:
    report = tmp_path / "study.html"
    args = ["study", "--jobs", "40", "--gpus", "16", "--load", "0.9,1.3", "--seeds", "2", "--policies", "fifo,kueue"]
    out = CliRunner().invoke(_cli(), [*args, "--report", str(report)])
    assert out.exit_code == 0, out.output
    page = report.read_text()
    for plot in ("plot-utilization-0", "plot-delay-cdf-1", "plot-jct-cdf-0", "plot-shares-1"):
        assert f'id="{plot}"' in page
    assert "1.3 / kueue" in page
    assert " ± " in page


def test_idle_reclaim_returns_a_hoarders_idle_tail_to_a_waiting_gang() -> None:
    # One node of 2 GPUs. j1 takes both for 10,000 s but its work is done at 2,000 s; j2 asks for
    # both at 100 s. The idle policy counts idle windows after the 1,800 s grace, from 2,000 s:
    # 6 windows of 300 s make j1 reclaimable at 3,800 s. gpufleet reclaims it then (j1 completes,
    # its work done; 2 GPUs x 6,200 s returned); FIFO has no idle reclaim: j2 waits until 10,000.
    fleet = build_fleet(small_fleet())
    hoarder = replace(job("j1", 0, "a", 10_000, gpus=2), idle_after=2_000)
    jobs = [hoarder, job("j2", 100, "b", 1_000, gpus=2)]
    reclaimed = summarize(simulate(fleet, jobs, "gpufleet", config=CHECKED), fleet)
    plain = summarize(simulate(fleet, jobs, "fifo", config=CHECKED), fleet)
    assert reclaimed["jobs"]["idle_reclaims"] == 1
    assert reclaimed["jobs"]["evictions"] == 0
    assert reclaimed["idle_reclaimed_gpu_hours"] == round(2 * 6_200 / 3600, 3)
    assert reclaimed["idle_held_gpu_seconds"] == 2 * 1_800
    assert reclaimed["avg_jct_seconds"] == round((3_800 + (4_800 - 100)) / 2, 1)
    assert plain["idle_reclaimed_gpu_hours"] == 0.0
    assert plain["idle_held_gpu_seconds"] == 2 * 8_000
    assert plain["avg_jct_seconds"] == round((10_000 + (11_000 - 100)) / 2, 1)
    # Busy GPU-time is the same (2 x 2,000 + 2 x 1,000); over the makespan it is a larger share.
    assert reclaimed["effective_utilization"] == round(6_000 / (2 * 4_800), 6)
    assert plain["effective_utilization"] == round(6_000 / (2 * 11_000), 6)


def test_a_hoarder_that_ends_before_its_reclaim_stage_is_not_reclaimed() -> None:
    fleet = build_fleet(small_fleet())
    # Idle from 2,000 s; reclaimable only at 3,800 s, after its run ends at 3,500 s.
    jobs = [replace(job("j1", 0, "a", 3_500, gpus=2), idle_after=2_000), job("j2", 100, "b", 1_000, gpus=2)]
    summary = summarize(simulate(fleet, jobs, "gpufleet", config=CHECKED), fleet)
    assert summary["jobs"]["idle_reclaims"] == 0
    assert summary["idle_held_gpu_seconds"] == 2 * 1_500


def test_work_lost_to_preemption_is_the_evicted_runs_gpu_time() -> None:
    # j1 (priority 100) holds both GPUs from 0; j2 (priority 200, same queue) arrives at 500 and
    # preempts it at the cycle at 500: j1 loses 2 x 500 GPU-seconds and restarts after j2.
    fleet = build_fleet(small_fleet())
    jobs = [job("j1", 0, "a", 1_000, gpus=2), job("j2", 500, "a", 100, gpus=2, priority=200)]
    summary = summarize(simulate(fleet, jobs, "gpufleet", config=CHECKED), fleet)
    assert summary["jobs"]["evictions"] == 1
    assert summary["preemption_lost_gpu_seconds"] == 2 * 500
    assert summary["evicted_gpu_seconds"] == 2 * 500
    # Useful: j2's 100 s and j1's second, complete run of 1,000 s, on 2 GPUs, over 1,600 s.
    assert summary["effective_utilization"] == round(2 * 1_100 / (2 * 1_600), 6)
    assert summary["gpu_allocation"] == round(2 * 1_600 / (2 * 1_600), 6)


def test_hoarding_mix_marks_a_share_and_leaves_the_rest_of_the_workload_alone(tmp_path: Any) -> None:
    base = GeneratorConfig(jobs=2000, gpus=256, seed=2)
    plain = generate(base).jobs
    hoarding = generate(replace(base, hoarding_share=0.5, hoarding_idle_fraction=0.5)).jobs
    assert [replace(j, idle_after=None) for j in hoarding] == plain
    marked = [j for j in hoarding if j.idle_after is not None]
    assert 900 < len(marked) < 1100
    assert all(j.idle_after == pytest.approx(j.duration * 0.5, abs=1e-3) for j in marked)
    path = tmp_path / "jobs.csv"
    write_workload(hoarding, path)
    assert [j.idle_after for j in load_workload(path)] == [j.idle_after for j in hoarding]


def test_burst_doubles_the_arrival_rate_for_one_day() -> None:
    base = GeneratorConfig(jobs=4000, gpus=512, seed=1, load=1.0, daily_amplitude=0.0)
    steady = generate(base).jobs
    burst = generate(replace(base, burst_factor=2.0)).jobs

    def per_day(jobs: list[Any], day: int) -> int:
        return sum(1 for j in jobs if day * DAY <= j.submit_time < (day + 1) * DAY)

    assert 1.7 < per_day(burst, 1) / per_day(steady, 1) < 2.3
    assert 0.8 < per_day(burst, 0) / per_day(steady, 0) < 1.2


def test_out_dir_keeps_each_workload_and_a_replay_of_it_gives_the_studys_summary(tmp_path: Any) -> None:
    args = ["study", "--jobs", "50", "--gpus", "16", "--load", "1.3", "--seeds", "2", "--policies", "gpufleet"]
    out = CliRunner().invoke(_cli(), [*args, "--json", "--out-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    run = next(r for r in json.loads(out.stdout)["runs"] if r["seed"] == 1)
    fleet = load_fleet(tmp_path / "fleet-1.3-seed1.yaml")
    jobs = load_workload(tmp_path / "jobs-1.3-seed1.csv")
    again = summarize(simulate(fleet, jobs, "gpufleet", seed=1), fleet)
    assert again["avg_jct_seconds"] == run["avg_jct_seconds"]
    assert again["queueing_delay_seconds"] == run["queueing_delay_seconds"]
