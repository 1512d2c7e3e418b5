"""Run one policy (a replay), all of them on one workload (a study), or all of them on every
load and seed (the study grid, aggregated over seeds); collect summaries, curves and costs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from controlplane.tracesim.queueing.aggregate import aggregate
from controlplane.tracesim.queueing.engine import ProgressHook, SimConfig, simulate
from controlplane.tracesim.queueing.generate import Generated, GeneratorConfig, generate
from controlplane.tracesim.queueing.inputs import Fleet, Job, build_fleet
from controlplane.tracesim.queueing.metrics import series, summarize
from controlplane.tracesim.queueing.policies import POLICY_NAMES

Replay = tuple[dict[str, Any], dict[str, Any]]  # (summary, series)


def replay(
    fleet: Fleet,
    jobs: Sequence[Job],
    policy: str,
    seed: int,
    config: SimConfig,
    progress: ProgressHook | None = None,
) -> Replay:
    # Wall and CPU time are measured for the record only; they never steer the simulation, and
    # they are the one part of the summary that differs between two runs of the same inputs.
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(fleet, jobs, policy, seed, config, progress)
    summary = summarize(result, fleet)
    summary["runtime"] = {
        "wall_seconds": round(time.perf_counter() - wall, 2),
        "cpu_seconds": round(time.process_time() - cpu, 2),
        "schedule_seconds": round(result.schedule_seconds, 2),
        "max_pending_shown": result.pending_shown_max,
    }
    return summary, series(result, fleet)


def _replay_job(args: tuple[Fleet, Sequence[Job], str, int, SimConfig]) -> Replay:
    return replay(*args)


def study(
    fleet: Fleet,
    jobs: Sequence[Job],
    seed: int,
    config: SimConfig,
    workers: int = 1,
    progress: Callable[[str], ProgressHook | None] | None = None,
    finished: Callable[[str], None] | None = None,
    policies: Sequence[str] = POLICY_NAMES,
) -> list[Replay]:
    """The given policies (default: all) on the same workload, in the order given. With workers > 1
    the replays run in separate processes (each replay stays deterministic: it shares nothing)."""
    names = list(policies)
    if workers <= 1:
        out = []
        for name in names:
            out.append(replay(fleet, jobs, name, seed, config, progress(name) if progress else None))
            if finished:
                finished(name)
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_replay_job, (fleet, jobs, name, seed, config)) for name in names]
        results = []
        for name, future in zip(names, futures, strict=True):
            results.append(future.result())
            if finished:
                finished(name)
        return results


# `burst`: the base load with one day (the second of the arrival window) at twice the rate.
BURST_BASE_LOAD = 1.0
BURST_FACTOR = 2.0


@dataclass(frozen=True)
class LoadSpec:
    label: float | str  # the offered load, or `burst`
    load: float
    burst_factor: float = 1.0


def parse_loads(text: str) -> list[LoadSpec]:
    """`0.9,1.1,1.3,burst`: offered loads (> 0) and/or `burst`; duplicates dropped, order kept."""
    specs: list[LoadSpec] = []
    for raw in text.split(","):
        part = raw.strip().lower()
        if not part:
            continue
        if part == "burst":
            spec = LoadSpec("burst", BURST_BASE_LOAD, BURST_FACTOR)
        else:
            try:
                value = float(part)
            except ValueError:
                raise ValueError(f"{raw.strip()!r} is neither a load nor `burst`") from None
            if not 0 < value <= 100:
                raise ValueError(f"load {value:g} is outside (0, 100]")
            spec = LoadSpec(value, value)
        if spec not in specs:
            specs.append(spec)
    if not specs:
        raise ValueError("name at least one load")
    return specs


@dataclass
class StudyCell:
    """One workload (a load and a seed) replayed under every chosen policy."""

    load: LoadSpec
    seed: int
    facts: dict[str, object]
    runs: list[Replay] = field(default_factory=list)


def study_grid(
    base: GeneratorConfig,
    loads: Sequence[LoadSpec],
    seeds: Sequence[int],
    config: SimConfig,
    policies: Sequence[str] = POLICY_NAMES,
    workers: int = 1,
    finished: Callable[[LoadSpec, int, str], None] | None = None,
    keep: Callable[[LoadSpec, int, Generated], None] | None = None,
) -> list[StudyCell]:
    """Every load and seed: a workload generated from `base` with that load and seed (the seed
    also breaks arrival ties), replayed under every policy. `keep` sees each workload first."""
    cells = []
    for spec in loads:
        for seed in seeds:
            generated = generate(replace(base, seed=seed, load=spec.load, burst_factor=spec.burst_factor))
            if keep:
                keep(spec, seed, generated)
            fleet = build_fleet(generated.fleet)

            def done(name: str, spec: LoadSpec = spec, seed: int = seed) -> None:
                if finished:
                    finished(spec, seed, name)

            runs = study(fleet, generated.jobs, seed, config, workers, None, done, policies)
            cells.append(StudyCell(spec, seed, generated.facts, runs))
    return cells


def records(cells: Sequence[StudyCell], policies: Sequence[str]) -> list[dict[str, Any]]:
    """One record per load and policy (loads in the order given), aggregated over the seeds."""
    out = []
    loads = list(dict.fromkeys(cell.load for cell in cells))
    for spec in loads:
        for name in policies:
            summaries = [s for cell in cells if cell.load == spec for s, _ in cell.runs if s["policy"] == name]
            out.append(aggregate(name, spec.label, summaries))
    return out
