"""Inference serving signals: what a workload declares, what reaches the control plane, what is read.

An inference workload may declare, in its submit body, where its server exposes Prometheus
metrics and which of them tell its traffic and latency (`ServingSpec`). The in-cluster agent (or a
simulated cluster) scrapes that endpoint and puts one `ServingReading` per run in the telemetry
batch it publishes anyway (`telemetry_wire`), so a serving reading is authorised, de-duplicated and
dead-lettered exactly like the DCGM samples beside it. The store keeps the latest reading per run
(`ServingRepository`); the idle pass feeds its request rate to the idle policy, the workload view
and `/metrics` show it, and the audit reads `ServingSignal`s.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Protocol

from pydantic import ConfigDict, Field, model_validator

from controlplane.service.constraints import Strict, matching

# The Prometheus metric name grammar, bounded: a name is a label-free series selector here.
METRIC_NAME = r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$"
MetricName = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=METRIC_NAME),
    matching("is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, at most 200 characters)"),
]
# An HTTP path of printable ASCII without spaces, query or fragment: the agent appends nothing.
METRICS_PATH = r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]{0,199}$"
MetricsPath = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=METRICS_PATH),
    matching("must start with / and hold no spaces, query or fragment"),
]
_NAMED: dict[str, Any] = {"type": "string"}
# Traffic and latency readings beyond these are not a server talking; they are refused on the wire.
MAX_RPS = 1e9
MAX_LATENCY_MS = 86_400_000.0


class ServingSpec(Strict):
    """The `serving` block of an inference workload's submit body (REST and NATS alike).

    `traffic_metric` names a counter of answered requests (its per-second rate is the traffic the
    idle policy reads; `_total` may be left out); `latency_metric` a histogram or summary of request
    latency in seconds (the agent reports its mean over each scrape interval, in milliseconds)."""

    # A block names a signal; an objective needs the latency it is an objective for.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"traffic_metric": _NAMED}, "required": ["traffic_metric"]},
                {"properties": {"latency_metric": _NAMED}, "required": ["latency_metric"]},
            ],
            "if": {"properties": {"latency_objective_ms": {"type": "number"}}, "required": ["latency_objective_ms"]},
            "then": {"properties": {"latency_metric": _NAMED}, "required": ["latency_metric"]},
        },
    )

    traffic_metric: MetricName | None = None
    latency_metric: MetricName | None = None
    latency_objective_ms: float | None = Field(default=None, gt=0, le=3_600_000)
    metrics_port: int = Field(default=8000, ge=1, le=65535)
    metrics_path: MetricsPath = "/metrics"

    @model_validator(mode="after")
    def _names_a_signal(self) -> ServingSpec:
        """A block must name a signal; an objective needs the latency it is an objective for."""
        if self.traffic_metric is None and self.latency_metric is None:
            raise ValueError("serving must name traffic_metric, latency_metric or both")
        if self.latency_objective_ms is not None and self.latency_metric is None:
            raise ValueError("serving.latency_objective_ms needs serving.latency_metric")
        return self


@dataclass(frozen=True, slots=True)
class ServingReading:
    """One run's serving signal at one moment, as an agent measured it over its last interval."""

    run_id: str
    observed_at: datetime
    requests_per_second: float | None  # None: the traffic metric was not found
    latency_ms: float | None  # None: no latency declared, or no request in the interval


@dataclass(frozen=True)
class ServingSignal:
    """Per live inference run: whether it declared a signal, the latest reading, the objective."""

    run_id: str
    workload_id: str
    workload: str
    team: str
    queue: str
    cluster: str
    declared: bool  # a `serving` block naming a traffic or latency metric
    traffic_declared: bool
    latency_objective_ms: float | None
    requests_per_second: float | None
    latency_ms: float | None
    observed_at: datetime | None  # of the latest reading; None when none arrived

    @property
    def objective_breached(self) -> bool:
        return (
            self.latency_objective_ms is not None
            and self.latency_ms is not None
            and self.latency_ms > self.latency_objective_ms
        )


class ServingRepository(Protocol):
    def put_readings(self, readings: Sequence[tuple[str, ServingReading]], now: datetime) -> int:
        """Keep the newest reading per run ((cluster, reading) pairs); an older or equal one than
        what is stored changes nothing, so redelivered and reordered batches end alike. Returns rows
        written."""
        ...

    def latest(self, run_ids: Collection[str]) -> dict[str, ServingReading]:
        """The stored reading of each of these runs that has one."""
        ...

    def signals(self, limit: int = 10_000) -> list[ServingSignal]:
        """Every live (admitted, dispatching or running) inference run, with its declaration and
        latest reading, ordered by run id; at most `limit`."""
        ...
