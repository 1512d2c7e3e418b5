"""The fleet gauges (`FleetGauges`, read from SQL) as Prometheus metric families, read when scraped."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.service.metrics import FleetGaugeReader, FleetGauges, RunServing, TeamUtilization

log = logging.getLogger(__name__)


class FleetCollector(Collector):
    """The SQL gauges (`FleetGauges`), read when scraped and kept `min_interval` seconds, so a burst
    of scrapes (several Prometheus servers, a curl loop) costs one read."""

    def __init__(
        self,
        reader: FleetGaugeReader,
        clock: Callable[[], datetime],
        min_interval: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader, self.clock, self.min_interval, self.monotonic = reader, clock, min_interval, monotonic
        self.lock = threading.Lock()
        self.cached: tuple[float, list[Metric]] | None = None
        self.failures = 0

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            if self.cached is None or self.monotonic() - self.cached[0] >= self.min_interval:
                started = self.monotonic()
                try:
                    families = list(fleet_families(self.reader.read(self.clock())))
                except Exception as exc:
                    self.failures += 1
                    log.warning("fleet gauges not read: %s: %s", type(exc).__name__, exc)
                    families = []
                seconds = GaugeMetricFamily(
                    "gpufleet_fleet_gauges_read_seconds", "Duration of the last read of the SQL gauges"
                )
                seconds.add_metric([], self.monotonic() - started)
                errors = GaugeMetricFamily(
                    "gpufleet_fleet_gauges_read_failures", "Reads of the SQL gauges that failed since start"
                )
                errors.add_metric([], self.failures)
                self.cached = (self.monotonic(), [*families, seconds, errors])
            cached = self.cached[1]
        yield from cached


def _gauge(
    name: str, documentation: str, labels: Sequence[str], values: Iterable[tuple[Sequence[str], float]]
) -> Metric:
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    for label_values, value in values:
        family.add_metric(list(label_values), value)
    return family


def fleet_families(g: FleetGauges) -> Iterator[Metric]:
    yield _gauge(
        "gpufleet_pending_gangs",
        "Queued gangs by queue and the kind of their pending reason",
        ["queue", "reason"],
        (([q, k], n) for (q, k), n in sorted(g.pending.items())),
    )
    yield _gauge(
        "gpufleet_workloads",
        "Unfinished workloads by queue and state",
        ["queue", "state"],
        (([q, s], n) for (q, s), n in sorted(g.workloads.items())),
    )
    for name, doc, part in (
        ("gpufleet_queue_used_gpus", "GPU-equivalents held by the queue's live runs, per resource", "used"),
        ("gpufleet_queue_guaranteed_gpus", "The queue's guaranteed quota, per resource", "guaranteed"),
        ("gpufleet_queue_limit_gpus", "The queue's quota limit, per resource", "limit"),
    ):
        yield _gauge(
            name,
            doc,
            ["queue", "team", "resource"],
            (([q.queue, q.team, resource], amount) for q in g.quotas for resource, amount in getattr(q, part).items()),
        )
    yield _gauge(
        "gpufleet_cluster_gpus",
        "GPUs on the cluster's schedulable nodes, by GPU model",
        ["cluster", "gpu_model"],
        (([c.cluster, c.gpu_model], c.capacity) for c in g.gpus),
    )
    yield _gauge(
        "gpufleet_cluster_allocated_gpus",
        "GPU-equivalents held by live runs on the cluster, by GPU model",
        ["cluster", "gpu_model"],
        (([c.cluster, c.gpu_model], c.allocated) for c in g.gpus),
    )
    yield _gauge(
        "gpufleet_cluster_sync_error",
        "1 while the cluster's last fleet sync (cloud discovery) failed",
        ["cluster"],
        (([c], v) for c, v in sorted(g.cluster_sync_errors.items())),
    )
    yield _gauge(
        "gpufleet_idle_findings",
        "Live runs by the stage the idle policy reached for them, and team",
        ["stage", "team"],
        (([s, t], n) for (s, t), n in sorted(g.idle_findings.items())),
    )
    yield _gauge(
        "gpufleet_idle_gpus",
        "GPU-equivalents held by live runs, by idle stage and team",
        ["stage", "team"],
        (([s, t], n) for (s, t), n in sorted(g.idle_gpus.items())),
    )
    yield _gauge(
        "gpufleet_gpu_activity_ratio",
        "Mean DCGM activity (SM active, else graphics engine, else utilization) of GPUs held by runs, recent windows",
        ["cluster"],
        (([c], v) for c, v in sorted(g.sm_active.items())),
    )
    yield _gauge(
        "gpufleet_measured_gpus",
        "GPUs held by runs with a recent telemetry window",
        ["cluster"],
        (([c], v) for c, v in sorted(g.measured_gpus.items())),
    )
    yield from slo_families(g)
    yield _gauge("gpufleet_outbox_backlog_events", "Outbox events not published yet", [], [([], g.outbox_backlog)])
    yield _gauge(
        "gpufleet_outbox_oldest_unpublished_age_seconds",
        "Age of the oldest unpublished outbox event (the relay's lag)",
        [],
        [([], g.outbox_oldest_seconds)],
    )
    yield _gauge(
        "gpufleet_lease_epoch", "Current epoch of each lease", ["lease"], (([x.lease], x.epoch) for x in g.leases)
    )
    yield _gauge(
        "gpufleet_lease_expires_in_seconds",
        "Seconds until the lease expires unless renewed (negative: nobody holds it)",
        ["lease"],
        (([x.lease], x.expires_in_seconds) for x in g.leases),
    )


RUN_LABELS = ("run", "workload", "team", "queue", "cluster")
SERVING_LABELS = ("run", "workload", "team", "cluster")


def slo_families(g: FleetGauges) -> Iterator[Metric]:
    """The SLO link: effective utilization, idle and unmeasured GPUs, waits, serving signals."""
    yield _gauge(
        "gpufleet_run_effective_utilization_ratio",
        "Activity mean (0..1) of the live run's latest telemetry window; the lowest-utilization runs, bounded",
        RUN_LABELS,
        (([r.run, r.workload, r.team, r.queue, r.cluster], r.activity) for r in g.run_utilization),
    )
    yield _gauge(
        "gpufleet_team_effective_utilization_ratio",
        "Used / measured GPU-hours of the team's runs over the last hour (the utilization report's efficiency)",
        ["team"],
        (([t.team], t.efficiency) for t in g.team_utilization if t.efficiency is not None),
    )
    for name, doc, part in (
        ("gpufleet_team_allocated_gpu_hours", "GPU-hours (gpu-eq) allocated to the team's runs, last hour", "alloc"),
        ("gpufleet_team_measured_gpu_hours", "Allocated GPU-hours with an activity reading, last hour", "measured"),
        ("gpufleet_team_used_gpu_hours", "Measured GPU-hours times their activity, last hour", "used"),
    ):
        yield _gauge(name, doc, ["team"], (([t.team], _team_part(t, part)) for t in g.team_utilization))
    yield _gauge(
        "gpufleet_team_allocated_gpus",
        "GPU-equivalents held by the team's live runs now",
        ["team"],
        (([t.team], t.allocated_gpus) for t in g.team_utilization),
    )
    yield _gauge(
        "gpufleet_idle_notified_gpus",
        "GPU-equivalents held by live runs whose idle finding is at notify or beyond, by cluster and team",
        ["cluster", "team"],
        (([c, t], v) for (c, t), v in sorted(g.idle_notified_gpus.items())),
    )
    yield _gauge(
        "gpufleet_unmeasured_gpus",
        "GPU-equivalents held by running runs with no recent telemetry window (allocated but unmeasured)",
        ["cluster"],
        (([c], v) for c, v in sorted(g.unmeasured_gpus.items())),
    )
    yield _gauge(
        "gpufleet_queue_pending_workloads",
        "Queued workloads of the queue",
        ["queue", "team"],
        (([w.queue, w.team], w.pending) for w in g.queue_waits),
    )
    yield _gauge(
        "gpufleet_queue_oldest_pending_seconds",
        "Seconds since the oldest queued workload of the queue was submitted (0 with none queued)",
        ["queue", "team"],
        (([w.queue, w.team], w.oldest_seconds) for w in g.queue_waits),
    )
    yield _gauge(
        "gpufleet_queue_pending_wait_seconds",
        "Quantiles (nearest rank) of the current waits of the queue's queued workloads, since submission",
        ["queue", "team", "quantile"],
        (
            ([w.queue, w.team, q], value)
            for w in g.queue_waits
            for q, value in (("0.5", w.p50_seconds), ("0.95", w.p95_seconds))
        ),
    )
    for name, doc, attr in (
        ("gpufleet_run_requests_per_second", "Request rate of the run's declared traffic metric", "rps"),
        ("gpufleet_run_latency_seconds", "Mean request latency of the run's declared latency metric", "latency"),
        ("gpufleet_run_latency_objective_seconds", "The run's declared latency objective", "objective"),
    ):
        yield _gauge(
            name,
            f"{doc}; live inference runs with a serving reading, the slowest against their objective first, bounded",
            SERVING_LABELS,
            (
                ([r.run, r.workload, r.team, r.cluster], value)
                for r in g.serving
                if (value := _serving_part(r, attr)) is not None
            ),
        )


def _team_part(t: TeamUtilization, part: str) -> float:
    return {"alloc": t.allocated_gpu_hours, "measured": t.measured_gpu_hours, "used": t.used_gpu_hours}[part]


def _serving_part(r: RunServing, part: str) -> float | None:
    # Prometheus' base unit is the second; the declaration and the readings are in milliseconds.
    value = {"rps": r.requests_per_second, "latency": r.latency_ms, "objective": r.objective_ms}[part]
    return value if value is None or part == "rps" else value / 1000.0
