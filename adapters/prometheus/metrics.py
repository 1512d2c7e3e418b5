"""The `Metrics` port over prometheus_client, one `CollectorRegistry` per process (never the global one).

Names follow Prometheus conventions: a `gpufleet_` prefix, the unit in the name (`_seconds`,
`_gpus`, `_events`), `_total` on counters. Label values are registered names or small enums; as a
backstop each label keeps at most `MAX_LABEL_VALUES` distinct values, later ones are reported as
`_other`, so no input can grow a series set without bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.service.metrics import (
    ClusterOperation,
    CyclePhase,
    DispatchFailure,
    RetryCause,
    Writer,
    eviction_kind,
)

MAX_LABEL_VALUES = 1000
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OVERFLOW = "_other"

CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WAIT_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)


class _BoundedLabel:
    """Passes the first `limit` distinct values of one label, then `_other`."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, value: str) -> str:
        value = value or "_none"
        if value in self.seen:
            return value
        with self.lock:
            if len(self.seen) >= self.limit:
                return OVERFLOW
            self.seen.add(value)
        return value


class PrometheusMetrics:
    """Implements `controlplane.service.metrics.Metrics`."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.clock = clock
        self.queue, self.cluster, self.provider = _BoundedLabel(), _BoundedLabel(), _BoundedLabel()
        r = registry
        self.phase_seconds = Histogram(
            "gpufleet_scheduler_cycle_phase_seconds",
            "Duration of each phase of a scheduling cycle (snapshot, schedule, check, apply)",
            ["phase"],
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.cycle_seconds = Histogram(
            "gpufleet_scheduler_cycle_seconds",
            "Duration of a whole scheduling cycle that committed",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self.last_cycle = Gauge(
            "gpufleet_scheduler_last_cycle_timestamp_seconds",
            "Unix time of this process's last committed scheduling cycle",
            registry=r,
        )
        self.cycle_pending = Gauge(
            "gpufleet_scheduler_cycle_pending_gangs", "Gangs left pending by the last cycle", registry=r
        )
        self.admissions = Counter(
            "gpufleet_admissions_total", "Gangs admitted (placed on a cluster), by queue", ["queue"], registry=r
        )
        self.evictions = Counter(
            "gpufleet_evictions_total",
            "Running gangs evicted, by kind (preempt, reclaim, idle, rebalance, take-back)",
            ["kind"],
            registry=r,
        )
        self.to_admission = Histogram(
            "gpufleet_submit_to_admission_seconds",
            "Time from a workload's submission to each of its admissions",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.to_running = Histogram(
            "gpufleet_submit_to_running_seconds",
            "Time from a workload's submission until a run of it reached running",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.dispatch_seconds = Histogram(
            "gpufleet_dispatch_duration_seconds",
            "Duration of the call that applies a run to its cluster",
            ["cluster"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.dispatches = Counter(
            "gpufleet_dispatches_total",
            "Runs applied to clusters (result: created, or already present after a repeat)",
            ["cluster", "result"],
            registry=r,
        )
        self.dispatch_failures = Counter(
            "gpufleet_dispatch_failures_total",
            "Failed calls to clusters, by operation (apply, teardown, list) and kind (transient, permanent, no-driver)",
            ["cluster", "operation", "kind"],
            registry=r,
        )
        self.teardowns = Counter("gpufleet_teardowns_total", "Runs removed from their cluster", ["cluster"], registry=r)
        self.ingested_messages = Counter(
            "gpufleet_ingest_messages_total",
            "Inbound messages handled, by consumer and outcome",
            ["consumer", "outcome"],
            registry=r,
        )
        self.ingest_lag = Histogram(
            "gpufleet_ingest_lag_seconds",
            "Time from the stream storing an inbound message to its handling",
            ["consumer"],
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.telemetry_messages = Counter(
            "gpufleet_telemetry_batches_total", "DCGM sample batches (messages) folded into windows", registry=r
        )
        self.telemetry_samples = Counter(
            "gpufleet_telemetry_samples_total", "DCGM samples folded into telemetry windows", registry=r
        )
        self.telemetry_windows = Counter(
            "gpufleet_telemetry_windows_written_total", "Telemetry window rows upserted", registry=r
        )
        self.relayed_events = Counter(
            "gpufleet_outbox_published_events_total", "Outbox events published to NATS by the relay", registry=r
        )
        self.relay_failures = Counter(
            "gpufleet_outbox_publish_failures_total", "Relay passes that stopped on a failed publish", registry=r
        )
        self.relay_dead_letters = Counter(
            "gpufleet_outbox_dead_lettered_events_total",
            "Outbox events the relay could never publish, moved to the dead-letter stream",
            registry=r,
        )
        self.inbound_refusals = Counter(
            "gpufleet_inbound_refused_messages_total",
            "Messages the inbound gateway refused (reply outside the sender's inbox, size, id, subject)",
            ["reason"],
            registry=r,
        )
        self.consumer_pending_gauge = Gauge(
            "gpufleet_consumer_pending_messages",
            "Messages the broker holds for a durable consumer that were not delivered yet",
            ["consumer"],
            registry=r,
        )
        self.consumer_ack_pending = Gauge(
            "gpufleet_consumer_ack_pending_messages",
            "Messages delivered to a durable consumer and not acknowledged yet",
            ["consumer"],
            registry=r,
        )
        self.cloud_calls = Counter(
            "gpufleet_cloud_calls_total",
            "Calls to cloud provider APIs, by provider, operation and outcome (ok, error)",
            ["provider", "operation", "outcome"],
            registry=r,
        )
        self.cloud_seconds = Histogram(
            "gpufleet_cloud_call_duration_seconds",
            "Duration of calls to cloud provider APIs",
            ["provider", "operation"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.api_requests = Counter(
            "gpufleet_api_requests_total",
            "API requests answered, by method, route template and status code",
            ["method", "route", "code"],
            registry=r,
        )
        self.api_seconds = Histogram(
            "gpufleet_api_request_duration_seconds",
            "Time to answer API requests, by method and route template",
            ["method", "route"],
            buckets=CALL_BUCKETS,
            registry=r,
        )
        self.db_retries = Counter(
            "gpufleet_db_retries_total",
            "Database transactions run again, by writer and cause (deadlock, serialization, unavailable)",
            ["writer", "cause"],
            registry=r,
        )
        self.leases = _LeaseCollector(clock)
        registry.register(self.leases)

    # -- the port ------------------------------------------------------------------------------

    def cycle_phase(self, phase: CyclePhase, seconds: float) -> None:
        self.phase_seconds.labels(phase.value).observe(seconds)

    def cycle_done(self, seconds: float, pending: int) -> None:
        self.cycle_seconds.observe(seconds)
        self.last_cycle.set_to_current_time()
        self.cycle_pending.set(pending)

    def admitted(self, queue: str, since_submit_seconds: float | None) -> None:
        label = self.queue(queue)
        self.admissions.labels(label).inc()
        if since_submit_seconds is not None:
            self.to_admission.labels(label).observe(since_submit_seconds)

    def evicted(self, kind: str) -> None:
        self.evictions.labels(eviction_kind(kind)).inc()

    def started(self, queue: str, since_submit_seconds: float) -> None:
        self.to_running.labels(self.queue(queue)).observe(since_submit_seconds)

    def dispatched(self, cluster: str, seconds: float, created: bool) -> None:
        label = self.cluster(cluster)
        self.dispatch_seconds.labels(label).observe(seconds)
        self.dispatches.labels(label, "created" if created else "present").inc()

    def dispatch_failed(self, cluster: str, operation: ClusterOperation, failure: DispatchFailure) -> None:
        self.dispatch_failures.labels(self.cluster(cluster), operation.value, failure.value).inc()

    def torn_down(self, cluster: str) -> None:
        self.teardowns.labels(self.cluster(cluster)).inc()

    def ingested(self, consumer: str, outcome: str, lag_seconds: float | None, count: int = 1) -> None:
        self.ingested_messages.labels(consumer, outcome).inc(count)
        if lag_seconds is not None:
            self.ingest_lag.labels(consumer).observe(lag_seconds)

    def telemetry_batch(self, messages: int, samples: int, windows: int) -> None:
        self.telemetry_messages.inc(messages)
        self.telemetry_samples.inc(samples)
        self.telemetry_windows.inc(windows)

    def relayed(self, published: int, failed: bool) -> None:
        self.relayed_events.inc(published)
        if failed:
            self.relay_failures.inc()

    def relay_dead_lettered(self) -> None:
        self.relay_dead_letters.inc()

    def inbound_refused(self, reason: str) -> None:
        self.inbound_refusals.labels(reason).inc()

    def lease(self, lease: str, epoch: int | None) -> None:
        self.leases.set(lease, epoch)

    def consumer_pending(self, consumer: str, pending: int, ack_pending: int) -> None:
        self.consumer_pending_gauge.labels(consumer).set(pending)
        self.consumer_ack_pending.labels(consumer).set(ack_pending)

    def cloud_call(self, provider: str, operation: str, outcome: str, seconds: float) -> None:
        label = self.provider(provider)
        self.cloud_calls.labels(label, operation, outcome).inc()
        self.cloud_seconds.labels(label, operation).observe(seconds)

    def api_request(self, method: str, route: str, status: int, seconds: float) -> None:
        verb = method if method in HTTP_METHODS else OVERFLOW
        self.api_requests.labels(verb, route, str(status)).inc()
        self.api_seconds.labels(verb, route).observe(seconds)

    def db_retry(self, writer: Writer, cause: RetryCause) -> None:
        self.db_retries.labels(writer.value, cause.value).inc()


class _LeaseCollector(Collector):
    """Which leases this process holds, at which epoch, and how long since it last renewed each."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.state: dict[str, tuple[int | None, float]] = {}
        self.lock = threading.Lock()

    def set(self, lease: str, epoch: int | None) -> None:
        with self.lock:
            self.state[lease] = (epoch, self.clock())

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily("gpufleet_lease_held", "1 while this process holds the lease", labels=["lease"])
        epochs = GaugeMetricFamily(
            "gpufleet_lease_held_epoch", "Epoch of the lease this process holds", labels=["lease"]
        )
        age = GaugeMetricFamily(
            "gpufleet_lease_renewal_age_seconds",
            "Seconds since this process last acquired or renewed the lease it holds",
            labels=["lease"],
        )
        now = self.clock()
        with self.lock:
            state = dict(self.state)
        for lease, (epoch, at) in sorted(state.items()):
            held.add_metric([lease], 0 if epoch is None else 1)
            if epoch is not None:
                epochs.add_metric([lease], epoch)
                age.add_metric([lease], now - at)
        yield from (held, epochs, age)
