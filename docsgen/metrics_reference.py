"""The metrics reference: every Prometheus family gpufleet exports, read from a registry built as a
process builds it (adapters/prometheus), with its type, labels and help.

Families with labels only show them once they hold a sample, so every method of the `Metrics`
port is called once and the SQL-gauge collector reads a `FleetGauges` with one value in every
field. A family still without a sample fails the build: the sample below must learn its field.
"""

from __future__ import annotations

import inspect
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
    RetryCause,
    RunServing,
    RunUtilization,
    TeamUtilization,
    Writer,
)
from docsgen import markdown as md

# Series a process exports whatever gpufleet does (prometheus_client's own collectors).
_STANDARD_PREFIXES = ("process_", "python_")


def metrics_reference() -> str:
    registry = new_registry()
    exercise_every_method(PrometheusMetrics(registry))
    registry.register(FleetCollector(SampleGauges(), lambda: datetime(2026, 1, 1, tzinfo=UTC)))
    body, _ = exposition(registry)
    rows = []
    for family in sorted(text_string_to_metric_families(body.decode()), key=lambda f: f.name):
        if family.name.startswith(_STANDARD_PREFIXES):
            continue
        if not family.samples:
            raise ValueError(f"{family.name} holds no sample, so its labels are unknown: exercise it in docsgen")
        labels = sorted({label for sample in family.samples for label in sample.labels if label != "le"})
        name = family.name + ("_total" if family.type == "counter" else "")
        rows.append(
            [md.code(name), family.type, ", ".join(md.code(label) for label in labels), md.cell(family.documentation)]
        )
    return md.table(["metric", "type", "labels", "meaning"], rows) + "\n"


def exercise_every_method(metrics: Metrics) -> None:
    """Call every method of the `Metrics` port once, so every labelled family has a sample (also what
    the tests check dashboard queries and alert expressions against: tests/observability)."""
    calls = {
        "cycle_phase": (CyclePhase.APPLY, 0.1),
        "cycle_done": (0.1, 1),
        "admitted": ("q", 1.0),
        "evicted": ("idle",),
        "started": ("q", 2.0),
        "dispatched": ("c", 0.1, True),
        "dispatch_failed": ("c", ClusterOperation.LIST, DispatchFailure.TRANSIENT),
        "torn_down": ("c",),
        "ingested": ("ingest", "applied", 0.1),
        "telemetry_batch": (1, 1, 1),
        "relayed": (1, True),
        "relay_dead_lettered": (),
        "inbound_refused": ("reply",),
        "lease": ("scheduler", 1),
        "consumer_pending": ("ingest", 1, 1),
        "cloud_call": ("eks", "discover", "ok", 0.1),
        "api_request": ("POST", "/v1/workloads", 201, 0.01),
        "db_retry": (Writer.INGEST, RetryCause.DEADLOCK),
    }
    port = {name for name, _ in inspect.getmembers(Metrics, inspect.isfunction) if not name.startswith("_")}
    if set(calls) != port:
        raise ValueError(f"docsgen must call every method of the Metrics port; differ: {sorted(set(calls) ^ port)}")
    for name, arguments in calls.items():
        getattr(metrics, name)(*arguments)


class SampleGauges:
    """A `FleetGaugeReader` with one value in every field of `FleetGauges`."""

    def read(self, now: datetime) -> FleetGauges:  # noqa: ARG002 (the reader's signature)
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
