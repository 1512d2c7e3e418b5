"""What gpufleet exports: a registry as a process builds it, every port method called once and the
SQL-gauge collector fed a full `FleetGauges`, read back through prometheus_client's parser."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from adapters.prometheus import FleetCollector, PrometheusMetrics, exposition, new_registry
from controlplane.service.metrics import (
    ClusterGpus,
    ClusterOperation,
    CyclePhase,
    DispatchFailure,
    FleetGauges,
    LeaseState,
    Metrics,
    QueueQuota,
    QueueWaits,
    RunServing,
    RunUtilization,
    TeamUtilization,
)

SERIES_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    labels: frozenset[str]


class _Reader:
    def read(self, now: datetime) -> FleetGauges:
        return FleetGauges(
            pending={("q", "no-fit"): 1},
            workloads={("q", "queued"): 1},
            quotas=(QueueQuota("q", "t", {"gpu-eq": 1.0}, {"gpu-eq": 1.0}, {"gpu-eq": 1.0}),),
            gpus=(ClusterGpus("c", "H100", 8.0, 1.0),),
            idle_findings={("notify", "t"): 1},
            idle_gpus={("notify", "t"): 1.0},
            sm_active={"c": 0.5},
            measured_gpus={"c": 1},
            cluster_sync_errors={"c": 0},
            outbox_backlog=1,
            outbox_oldest_seconds=1.0,
            leases=(LeaseState("scheduler", 1, 5.0),),
            run_utilization=(RunUtilization("r", "w", "t", "q", "c", 0.5),),
            team_utilization=(TeamUtilization("t", 2.0, 1.0, 0.5, 0.5, 2.0),),
            idle_notified_gpus={("c", "t"): 1.0},
            unmeasured_gpus={"c": 1.0},
            queue_waits=(QueueWaits("q", "t", 1, 60.0, 60.0, 60.0),),
            serving=(RunServing("r", "w", "t", "c", 1.0, 200.0, 500.0),),
        )


def exercise(m: Metrics) -> set[str]:
    """Call every method of the port once; returns the names called."""
    m.cycle_phase(CyclePhase.APPLY, 0.1)
    m.cycle_done(0.1, 1)
    m.admitted("q", 1.0)
    m.evicted("idle")
    m.started("q", 2.0)
    m.dispatched("c", 0.1, True)
    m.dispatch_failed("c", ClusterOperation.LIST, DispatchFailure.TRANSIENT)
    m.torn_down("c")
    m.ingested("ingest", "applied", 0.1)
    m.telemetry_batch(1, 1, 1)
    m.relayed(1, True)
    m.relay_dead_lettered()
    m.inbound_refused("reply")
    m.lease("scheduler", 1)
    m.consumer_pending("ingest", 1, 1)
    m.cloud_call("eks", "discover", "ok", 0.1)
    m.api_request("POST", "/v1/workloads", 201, 0.01)
    return {
        "cycle_phase", "cycle_done", "admitted", "evicted", "started", "dispatched", "dispatch_failed", "torn_down",
        "ingested", "telemetry_batch", "relayed", "relay_dead_lettered", "inbound_refused", "lease",
        "consumer_pending", "cloud_call", "api_request",
    }  # fmt: skip


def port_methods() -> set[str]:
    return {name for name, _ in inspect.getmembers(Metrics, inspect.isfunction) if not name.startswith("_")}


def exported_families() -> dict[str, Family]:
    registry = new_registry()
    metrics = PrometheusMetrics(registry)
    called = exercise(metrics)
    assert called == port_methods(), "the exercise must call every method of the port"
    registry.register(FleetCollector(_Reader(), lambda: datetime.now(UTC)))
    body, _ = exposition(registry)
    families: dict[str, Family] = {}
    for family in text_string_to_metric_families(body.decode()):
        assert family.samples, f"{family.name} was not exercised: its labels are unknown"
        labels = frozenset(label for s in family.samples for label in s.labels if label != "le")
        families[family.name] = Family(family.name, family.type, labels)
    return families


def series_names(families: dict[str, Family]) -> dict[str, Family]:
    """Every name a query may use: gauges by name, counters with `_total`, histograms' `_bucket`,
    `_count` and `_sum` (with `le` on the buckets)."""
    names: dict[str, Family] = {}
    for family in families.values():
        suffixes = SERIES_SUFFIXES.get(family.type, ("",))
        for suffix in suffixes:
            labels = family.labels | ({"le"} if suffix == "_bucket" else set())
            names[family.name + suffix] = Family(family.name, family.type, frozenset(labels))
    return names
