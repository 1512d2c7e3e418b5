"""What the REST API needs from the composition root."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from controlplane.api.group_commit import SubmitBatcher
from controlplane.core.audit import AuditThresholds
from controlplane.core.idle import IdleRules
from controlplane.service.auth import PrincipalCache
from controlplane.service.auth_limits import FailedAuthLimiter
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.metrics import NO_METRICS, FleetGaugeReader, Metrics
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.service.submit_batch import Answer, SubmitItem, submit_many


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class ApiContext:
    uow_factory: UnitOfWorkFactory
    subject_prefix: str = "gpufleet"
    clock: Callable[[], datetime] = utc_now
    # Named readiness checks (database reachable, NATS connected, ...): each returns None or an error.
    readiness: dict[str, Callable[[], str | None]] = field(default_factory=dict)
    # The process's memo of recent authentications, for the submit route only (it checks the token
    # again in its own transaction).
    principals: PrincipalCache = field(default_factory=PrincipalCache)
    # The process's memo of the submit-time fleet check ("could this gang ever run here").
    fleet_fit: FleetFit = field(default_factory=FleetFit)
    # The process's Prometheus exposition (body, content type) for GET /metrics (which answers only
    # a metrics or admin token); None: no such route.
    exposition: Callable[[], tuple[bytes, str]] | None = None
    # Failed authentications per client address (a bounded rate, then 429).
    auth_failures: FailedAuthLimiter = field(default_factory=FailedAuthLimiter)
    # The Host names answered (`*`: any; the composition root passes `api_trusted_hosts`, loopback
    # names by default) and the proxies whose X-Forwarded-* headers are believed (edge.py).
    trusted_hosts: tuple[str, ...] = ("*",)
    trusted_proxies: tuple[str, ...] = ()
    # How long a dashboard login lasts.
    session_ttl: timedelta = timedelta(hours=8)
    # Where answered requests are counted and timed.
    metrics: Metrics = NO_METRICS
    # What the audit judges by: the idle policy (when telemetry is stale) and its own thresholds.
    idle_rules: IdleRules = field(default_factory=IdleRules)
    audit_thresholds: AuditThresholds = field(default_factory=AuditThresholds)
    # The fleet gauges (bounded aggregate reads) the dashboard's fleet and queue pages show; None:
    # those two pages fail (only tests that do not open them leave it out).
    gauges: FleetGaugeReader | None = None
    # Group commit of REST submits (group_commit.py): at most this many submits per transaction, and
    # this many transactions (database connections) writing submits at a time.
    submit_batch_items: int = 64
    submit_batch_writers: int = 2
    submits: SubmitBatcher = field(init=False)

    def __post_init__(self) -> None:
        self.submits = SubmitBatcher(self._write_submits, self.submit_batch_items, self.submit_batch_writers)

    def _write_submits(self, items: Sequence[SubmitItem]) -> list[Answer]:
        return submit_many(self.uow_factory, items, self.subject_prefix, self.clock(), self.fleet_fit)
