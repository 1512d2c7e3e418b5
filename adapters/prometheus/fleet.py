"""The fleet gauges (`FleetGauges`, read from SQL) as Prometheus metric families, read when scraped."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.service.metrics import FleetGaugeReader, FleetGauges

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
