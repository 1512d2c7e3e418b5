"""The metrics port and its Prometheus adapter without a running plane: reason kinds, bounded labels,
naming conventions, the cached SQL-gauge collector, and metered cloud calls."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.prometheus import FleetCollector, PrometheusMetrics, exposition, new_registry
from adapters.prometheus.metrics import MAX_LABEL_VALUES, OVERFLOW
from controlplane.core.decision import PendingKind
from controlplane.service.cloud_ports import autoscaling_bounds
from controlplane.service.metered_cloud import metered
from controlplane.service.metrics import (
    PENDING_REASON_KINDS,
    ClusterGpus,
    ClusterOperation,
    CyclePhase,
    DispatchFailure,
    FleetGauges,
    LeaseState,
    QueueQuota,
    pending_reason_kind,
)


@pytest.mark.parametrize(
    ("stored", "label"),
    [
        ("no-fit", "no-fit"),
        ("quota-limit", "quota-limit"),
        ("fair-share", "fair-share"),
        ("error", "error"),
        ("", "unscheduled"),  # submitted or requeued, not decided on since
        ("something-else", "other"),
        ("No-Fit", "other"),
    ],
)
def test_pending_reason_kind_is_bounded_to_the_typed_kinds(stored: str, label: str) -> None:
    assert pending_reason_kind(stored) == label


def test_every_typed_kind_is_its_own_label() -> None:
    assert set(PENDING_REASON_KINDS) == {str(kind) for kind in PendingKind}
    for kind in PENDING_REASON_KINDS:
        assert pending_reason_kind(kind) == kind


def _families(registry: Any) -> dict[str, Any]:
    body, content_type = exposition(registry)
    assert content_type.startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def _exercised() -> tuple[Any, PrometheusMetrics]:
    registry = new_registry()
    m = PrometheusMetrics(registry)
    m.cycle_phase(CyclePhase.SNAPSHOT, 0.01)
    m.cycle_done(0.02, 3)
    m.admitted("q", 1.5)
    m.evicted("preempt")
    m.evicted("something-new")
    m.started("q", 4.0)
    m.dispatched("c", 0.1, True)
    m.dispatch_failed("c", ClusterOperation.APPLY, DispatchFailure.TRANSIENT)
    m.torn_down("c")
    m.ingested("ingest", "applied", 0.2)
    m.telemetry_batch(2, 10, 4)
    m.relayed(5, True)
    m.lease("scheduler", 7)
    m.lease("relay", 3)
    m.lease("relay", None)
    m.consumer_pending("ingest", 4, 1)
    m.cloud_call("eks", "discover", "ok", 0.3)
    m.api_request("GET", "/v1/workloads/{workload_id}", 200, 0.01)
    m.api_request("BREW", "unmatched", 405, 0.01)
    return registry, m


UNIT_SUFFIXES = (
    "_seconds",
    "_gpus",
    "_events",
    "_messages",
    "_gangs",
    "_workloads",
    "_ratio",
    "_epoch",
    "_gpu_hours",
    "_per_second",
)
# The bounded per-run SLO gauges (at most `metrics_max_run_series` runs each): the only families
# whose label values are run ids and workload names.
PER_RUN = {
    "gpufleet_run_effective_utilization_ratio",
    "gpufleet_run_requests_per_second",
    "gpufleet_run_latency_seconds",
    "gpufleet_run_latency_objective_seconds",
}
# Gauges that count the things they name, or say 0/1: no unit to put in the name.
UNITLESS = {
    "gpufleet_workloads",
    "gpufleet_idle_findings",
    "gpufleet_cluster_sync_error",
    "gpufleet_fleet_gauges_read_failures",
    "gpufleet_lease_held",
}


def test_names_follow_prometheus_conventions() -> None:
    registry, _ = _exercised()
    registry.register(FleetCollector(_Reader(), lambda: datetime.now(UTC)))
    families = _families(registry)
    assert families
    # prometheus_client's own process and interpreter collectors keep their standard names
    standard = {name for name in families if name.startswith(("process_", "python_"))}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info", "python_gc_objects_collected"} <= (
        standard
    )
    for name, family in families.items():
        if name in standard:
            continue
        assert re.fullmatch(r"gpufleet_[a-z][a-z0-9_]*", name), name
        if family.type == "counter":
            assert any(s.name == f"{name}_total" for s in family.samples) or not family.samples, name
        if family.type == "histogram":
            assert name.endswith("_seconds"), name
        if family.type == "gauge" and name not in UNITLESS:
            assert name.endswith(UNIT_SUFFIXES), name
        for sample in family.samples:
            for label in sample.labels:
                # never an id or free text: labels are names of registered things or small enums
                assert label in {
                    "phase",
                    "queue",
                    "kind",
                    "cluster",
                    "result",
                    "operation",
                    "consumer",
                    "outcome",
                    "lease",
                    "provider",
                    "reason",
                    "state",
                    "team",
                    "resource",
                    "gpu_model",
                    "stage",
                    "method",
                    "route",
                    "code",
                    "le",
                    "quantile",
                } or (name in PER_RUN and label in {"run", "workload"}), (name, label)


def test_port_calls_move_the_named_series() -> None:
    registry, _ = _exercised()
    f = _families(registry)

    def sample(name: str, family: str | None = None, **labels: str) -> float:
        found = [s.value for s in f[family or name].samples if s.name == name and labels.items() <= s.labels.items()]
        assert found, (name, labels)
        return float(sum(found))

    assert (
        sample(
            "gpufleet_scheduler_cycle_phase_seconds_count", "gpufleet_scheduler_cycle_phase_seconds", phase="snapshot"
        )
        == 1
    )
    assert sample("gpufleet_admissions_total", "gpufleet_admissions", queue="q") == 1
    assert sample("gpufleet_evictions_total", "gpufleet_evictions", kind="preempt") == 1
    assert sample("gpufleet_evictions_total", "gpufleet_evictions", kind="other") == 1
    assert sample("gpufleet_telemetry_samples_total", "gpufleet_telemetry_samples") == 10
    assert sample("gpufleet_outbox_publish_failures_total", "gpufleet_outbox_publish_failures") == 1
    assert sample("gpufleet_lease_held", lease="scheduler") == 1
    assert sample("gpufleet_lease_held", lease="relay") == 0
    assert sample("gpufleet_lease_held_epoch", lease="scheduler") == 7
    assert not [s for s in f["gpufleet_lease_held_epoch"].samples if s.labels["lease"] == "relay"]
    assert sample("gpufleet_cloud_calls_total", "gpufleet_cloud_calls", provider="eks", outcome="ok") == 1
    requests = "gpufleet_api_requests_total", "gpufleet_api_requests"
    assert sample(*requests, method="GET", route="/v1/workloads/{workload_id}", code="200") == 1
    assert sample(*requests, method="_other", route="unmatched", code="405") == 1


def test_label_values_are_capped() -> None:
    registry = new_registry()
    m = PrometheusMetrics(registry)
    for i in range(MAX_LABEL_VALUES + 50):
        m.admitted(f"queue-{i}", None)
    queues = {
        s.labels["queue"] for s in _families(registry)["gpufleet_admissions"].samples if s.name.endswith("_total")
    }
    assert len(queues) == MAX_LABEL_VALUES + 1
    assert OVERFLOW in queues


class _Reader:
    def __init__(self, fail: bool = False) -> None:
        self.reads = 0
        self.fail = fail

    def read(self, now: datetime) -> FleetGauges:
        self.reads += 1
        if self.fail:
            raise ConnectionError("database down")
        return FleetGauges(
            pending={("q", "no-fit"): 2},
            workloads={("q", "running"): 1},
            quotas=(QueueQuota("q", "t", {"gpu-eq": 8.0}, {"gpu-eq": 4.0}, {"gpu-eq": 16.0}),),
            gpus=(ClusterGpus("c", "H100", 32.0, 8.0),),
            idle_findings={("notify", "t"): 1},
            idle_gpus={("notify", "t"): 8.0},
            sm_active={"c": 0.25},
            measured_gpus={"c": 8},
            cluster_sync_errors={"c": 0},
            outbox_backlog=3,
            outbox_oldest_seconds=1.5,
            leases=(LeaseState("scheduler", 4, 9.0),),
        )


def test_fleet_collector_reads_at_most_once_per_interval() -> None:
    ticks = [0.0]
    reader = _Reader()
    registry = new_registry()
    registry.register(FleetCollector(reader, lambda: datetime.now(UTC), 5.0, monotonic=lambda: ticks[0]))
    first = _families(registry)
    _families(registry)
    assert reader.reads == 1
    ticks[0] = 6.0
    _families(registry)
    assert reader.reads == 2
    assert [s.value for s in first["gpufleet_pending_gangs"].samples] == [2]
    assert {s.labels["resource"]: s.value for s in first["gpufleet_queue_limit_gpus"].samples} == {"gpu-eq": 16.0}
    assert first["gpufleet_lease_expires_in_seconds"].samples[0].value == 9.0


def test_fleet_collector_survives_a_failed_read() -> None:
    registry = new_registry()
    registry.register(FleetCollector(_Reader(fail=True), lambda: datetime.now(UTC), 0.0))
    families = _families(registry)
    assert "gpufleet_pending_gangs" not in families
    assert families["gpufleet_fleet_gauges_read_failures"].samples[0].value == 1


class _Provider:
    provider = "eks"

    def __init__(self) -> None:
        self.calls = 0

    def list_clusters(self, account: str, region: str) -> list[Any]:
        return []

    def discover(self, locator: Any) -> Any:
        raise RuntimeError("throttled")

    def credentials(self, locator: Any) -> Any:
        return "access"

    def scale_pool(self, locator: Any, pool: str, desired: int) -> Any:
        return desired


class _BoundsProvider(_Provider):
    def set_autoscaling_bounds(self, locator: Any, pool: str, min_size: int, max_size: int) -> None:
        self.calls += 1


def test_metered_cloud_calls_keep_results_errors_and_capabilities() -> None:
    registry = new_registry()
    m = PrometheusMetrics(registry)
    plain = metered(_Provider(), m)  # type: ignore[arg-type]
    assert plain.credentials(None) == "access"  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="throttled"):
        plain.discover(None)  # type: ignore[arg-type]
    assert autoscaling_bounds(plain) is None
    inner = _BoundsProvider()
    bounded = metered(inner, m)  # type: ignore[arg-type]
    capability = autoscaling_bounds(bounded)
    assert capability is not None
    capability.set_autoscaling_bounds(None, "p", 0, 3)  # type: ignore[arg-type]
    assert inner.calls == 1
    calls = {
        (s.labels["operation"], s.labels["outcome"]): s.value
        for s in _families(registry)["gpufleet_cloud_calls"].samples
        if s.name.endswith("_total")
    }
    assert calls == {("credentials", "ok"): 1, ("discover", "error"): 1, ("set_autoscaling_bounds", "ok"): 1}
