"""Run one policy (a replay) or all of them (the study) and collect summaries, curves and costs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from controlplane.tracesim.queueing.engine import ProgressHook, SimConfig, simulate
from controlplane.tracesim.queueing.inputs import Fleet, Job
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
