"""A synthetic but trace-shaped workload and the fleet it runs on.

Distributions (vendored in `data/queueing/`, derived by `data/queueing/derive.py`):
- run time: the empirical Philly distribution (83,154 jobs), as 1,001 quantiles sampled by
  inverse transform with linear interpolation, clipped to [1 s, `max_duration`];
- GPUs per job: a power-of-two mix `P(2^k) ∝ q^k, k = 0..log2(max)` whose `q` is fitted so the
  mean equals the chosen trace's mean GPUs per job in the Acme cross-trace table, then cut at
  `max_gang` (and half a cluster) and renormalised; the traces' median of 1 GPU holds for Philly
  (P(1) = 0.67) and Helios (0.55), barely not for Seren (0.496); Kalos (mean 26.8) cannot be fitted
  with median 1 by this family;
- team quotas: Helios Venus per-VC GPU counts (mean over 180 days), scaled to the fleet size by
  largest remainder so the guarantees add up to the fleet;
- which team submits: its quota times a seeded log-normal skew (some teams ask for more than
  they are entitled to, others less: without that every policy would hand out the same shares);
- arrivals: a Poisson process with a daily cycle, rate `λ(t) = λ̄ (1 - A cos(2π t / 1 day))`
  (quiet at midnight, busiest at noon), `λ̄` set so the offered load (GPU-seconds asked per second
  over the fleet's GPUs) is `load`; sampled by thinning;
- gangs: jobs above one node's GPUs become gangs of whole-node pods (multi-node);
- priorities: a share `high_priority_share` of jobs at priority 200, the rest at 100;
- declared bound (`max_runtime`): the run time times a uniform factor in [1, 3] (people
  over-declare), which lets reservations and backfill plan;
- burst (optional): within `[burst_start, burst_start + 1 day)` the arrival rate is multiplied
  by `burst_factor` (a day at 2x load: `burst_factor=2`);
- hoarding mix (optional): a share `hoarding_share` of jobs hold their GPUs idle for the last
  `hoarding_idle_fraction` of their run (`idle_after`); drawn from a stream of their own so the
  rest of the workload is the same with and without hoarding.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

from controlplane.domain.model import GPU_EQ, WorkloadKind
from controlplane.service.cluster_specs import ClusterSpec, PoolSpec
from controlplane.tracesim.queueing.inputs import FleetDoc, Job, QueueDoc, TeamDoc

DATA_DIR = Path(__file__).resolve().parents[3] / "data" / "queueing"
DAY = 86_400.0


@dataclass(frozen=True)
class GeneratorConfig:
    jobs: int
    gpus: int
    seed: int = 0
    load: float = 0.9
    daily_amplitude: float = 0.5
    gpu_mix: str = "Helios"
    max_gang: int = 256
    max_duration: float = 7 * DAY
    high_priority_share: float = 0.1
    demand_skew: float = 0.75  # sigma of the log-normal team demand skew
    gpus_per_node: int = 8
    max_nodes_per_cluster: int = 256
    burst_factor: float = 1.0  # arrival rate multiplier during the burst day
    burst_start: float = DAY
    hoarding_share: float = 0.0  # share of jobs that hold GPUs idle at the end of their run
    hoarding_idle_fraction: float = 0.5  # the idle part of a hoarding job's run


@dataclass(frozen=True)
class Tables:
    runtime_quantiles: list[float]  # at levels i / (len - 1)
    gpu_stats: dict[str, tuple[float, float, float]]  # trace -> (mean, median, max) GPUs per job
    vc_quota: list[tuple[str, float]]  # (vc, mean GPUs)


def load_tables(data_dir: Path = DATA_DIR) -> Tables:
    with (data_dir / "philly_runtime_quantiles.csv").open() as handle:
        quantiles = [float(row["runtime_seconds"]) for row in csv.DictReader(handle)]
    with (data_dir / "gpu_count_stats.csv").open() as handle:
        stats = {
            row["trace"]: (float(row["avg_gpu_num"]), float(row["med_gpu_num"]), float(row["max_gpu"]))
            for row in csv.DictReader(handle)
        }
    with (data_dir / "venus_vc_quota.csv").open() as handle:
        quota = [(row["vc"], float(row["mean_gpus"])) for row in csv.DictReader(handle)]
    return Tables(quantiles, stats, quota)


def _mix_mean(q: float, top: int) -> float:
    weights = [float(q**k) for k in range(top + 1)]
    return sum((1 << k) * w for k, w in enumerate(weights)) / sum(weights)


def gpu_mix(mean: float, largest: float, cap: int) -> list[tuple[int, float]]:
    """(GPUs, probability) over powers of two: fitted to the trace's mean over its own range, then
    cut at `cap`. Bisection on q: the mean grows with q."""
    top = int(math.log2(largest))
    low, high = 1e-9, 4.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if _mix_mean(mid, top) < mean else (low, mid)
    q = (low + high) / 2
    keep = min(top, int(math.log2(cap)))
    weights = [q**k for k in range(keep + 1)]
    total = sum(weights)
    return [(1 << k, w / total) for k, w in enumerate(weights)]


def quantile_at(quantiles: list[float], u: float) -> float:
    pos = u * (len(quantiles) - 1)
    low = min(int(pos), len(quantiles) - 2)
    return quantiles[low] + (quantiles[low + 1] - quantiles[low]) * (pos - low)


def mean_duration(quantiles: list[float], clip: float, steps: int = 100_000) -> float:
    """E[clip(D)] by the midpoint rule over the inverse CDF."""
    return sum(min(max(quantile_at(quantiles, (i + 0.5) / steps), 1.0), clip) for i in range(steps)) / steps


def team_quotas(vc_quota: list[tuple[str, float]], gpus: int) -> list[tuple[str, int]]:
    """Scale the VC sizes to `gpus` by largest remainder, so the guarantees sum to the fleet."""
    total = sum(size for _, size in vc_quota)
    exact = [(name, size * gpus / total) for name, size in vc_quota]
    floors = {name: int(value) for name, value in exact}
    left = gpus - sum(floors.values())
    by_remainder = sorted(exact, key=lambda item: (-(item[1] - int(item[1])), item[0]))
    for name, _ in by_remainder[:left]:
        floors[name] += 1
    # Team names must be DNS labels: the anonymised VC ids are mixed case (unique once lowered,
    # the index only disambiguates if that ever stops being true).
    names = [name.lower() for name, _ in vc_quota]
    if len(set(names)) != len(names):
        names = [f"{name}-{i}" for i, name in enumerate(names)]
    return [(label, floors[name]) for label, (name, _) in zip(names, vc_quota, strict=True) if floors[name] > 0]


def fleet_doc(config: GeneratorConfig, quotas: list[tuple[str, int]]) -> FleetDoc:
    nodes = config.gpus // config.gpus_per_node
    clusters = max(1, math.ceil(nodes / config.max_nodes_per_cluster))
    sizes = [nodes // clusters + (1 if i < nodes % clusters else 0) for i in range(clusters)]
    specs = [
        ClusterSpec(
            name=f"c{i + 1}",
            pools=[
                PoolSpec(
                    name="gpu",
                    gpu_model="H100-80GB",
                    gpus_per_node=config.gpus_per_node,
                    cpu_millis=192_000,
                    memory_mib=2_000_000,
                    node_count=size,
                )
            ],
        )
        for i, size in enumerate(sizes)
    ]
    teams = [TeamDoc(name=name, guaranteed={GPU_EQ: float(q)}) for name, q in quotas]
    queues = [QueueDoc(name=name, parent=name, guaranteed={GPU_EQ: float(q)}) for name, q in quotas]
    return FleetDoc(clusters=specs, teams=teams, queues=queues)


@dataclass(frozen=True)
class Generated:
    jobs: list[Job]
    fleet: FleetDoc
    facts: dict[str, object]  # the derived parameters, for the record


def generate(config: GeneratorConfig, tables: Tables | None = None) -> Generated:
    if config.gpus < config.gpus_per_node:
        raise ValueError(f"the fleet needs at least one node of {config.gpus_per_node} GPUs")
    tables = tables or load_tables()
    if config.gpu_mix not in tables.gpu_stats:
        raise ValueError(f"unknown GPU mix {config.gpu_mix!r}; choose from {', '.join(tables.gpu_stats)}")
    rng = random.Random(config.seed)
    quotas = team_quotas(tables.vc_quota, (config.gpus // config.gpus_per_node) * config.gpus_per_node)
    fleet = fleet_doc(config, quotas)
    smallest_cluster = min(c.pools[0].node_count for c in fleet.clusters) * config.gpus_per_node
    cap = max(1, min(config.max_gang, smallest_cluster // 2))
    mean, _, largest = tables.gpu_stats[config.gpu_mix]
    mix = gpu_mix(mean, largest, cap)
    sizes = [size for size, _ in mix]
    probabilities = [p for _, p in mix]
    mean_gpus = sum(s * p for s, p in mix)
    mean_run = mean_duration(tables.runtime_quantiles, config.max_duration)
    rate = config.load * config.gpus / (mean_gpus * mean_run)
    burst = max(1.0, config.burst_factor)
    peak = rate * (1 + config.daily_amplitude) * burst
    hoarding = random.Random(f"hoarding/{config.seed}")

    def intensity(at: float) -> float:
        daily = rate * (1 - config.daily_amplitude * math.cos(2 * math.pi * at / DAY))
        return daily * burst if config.burst_start <= at < config.burst_start + DAY else daily

    skews = [rng.lognormvariate(0.0, config.demand_skew) for _ in quotas]
    demand = [q * s for (_, q), s in zip(quotas, skews, strict=True)]
    names = [name for name, _ in quotas]
    jobs: list[Job] = []
    t = 0.0
    width = len(str(config.jobs))
    while len(jobs) < config.jobs:
        t += rng.expovariate(peak)
        if rng.random() * peak > intensity(t):
            continue  # thinning: keep the candidate with probability λ(t) / λmax
        gpus = rng.choices(sizes, probabilities)[0]
        duration = min(max(quantile_at(tables.runtime_quantiles, rng.random()), 1.0), config.max_duration)
        per_pod = min(gpus, config.gpus_per_node)
        queue = rng.choices(names, demand)[0]
        priority = 200 if rng.random() < config.high_priority_share else 100
        kind = WorkloadKind.TRAINING if gpus > 1 or duration >= 3600 else WorkloadKind.BATCH
        jobs.append(
            Job(
                id=f"j{len(jobs):0{width}d}",
                submit_time=round(t, 3),
                queue=queue,
                gpus_per_pod=per_pod,
                pods=gpus // per_pod,
                duration=round(duration, 3),
                priority=priority,
                kind=kind,
                max_runtime=round(duration * rng.uniform(1.0, 3.0), 3),
                idle_after=round(duration * (1 - config.hoarding_idle_fraction), 3)
                if config.hoarding_share > 0 and hoarding.random() < config.hoarding_share
                else None,
            )
        )
    facts: dict[str, object] = {
        "gpu_mix_trace": config.gpu_mix,
        "gpu_mix": {str(s): round(p, 6) for s, p in mix},
        "mean_gpus_per_job": round(mean_gpus, 4),
        "mean_duration_seconds": round(mean_run, 1),
        "mean_arrival_rate_per_second": round(rate, 6),
        "offered_load": config.load,
        "multi_node_share": round(sum(p for s, p in mix if s > config.gpus_per_node), 6),
        "teams": len(quotas),
        "clusters": len(fleet.clusters),
        "burst_factor": config.burst_factor,
        "burst_window_seconds": [config.burst_start, config.burst_start + DAY] if burst > 1 else None,
        "arrival_window_seconds": round(t, 1),
        "hoarding_share": config.hoarding_share,
        "hoarding_jobs": sum(1 for job in jobs if job.idle_after is not None),
        "hoarding_idle_fraction": config.hoarding_idle_fraction if config.hoarding_share > 0 else None,
    }
    return Generated(jobs, fleet, facts)
