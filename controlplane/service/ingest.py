"""Handling inbound NATS messages: submit, cancel, cluster pod reports and node inventory.

Each message is applied in one transaction together with its inbox row, so a redelivery is a
no-op; the worker acks only after that commit. Bad input never raises out of here: a message we
cannot parse is `MALFORMED`, one about a cluster or run gpufleet does not know is `UNKNOWN`
(neither leaves anything in SQL, not even an inbox row), and one that claims what its sender may
not (a pod report for another cluster's run or an old epoch) is `REFUSED`; the worker dead-letters
all three with the reason. A well-formed but unacceptable request is `REJECTED` and leaves a
rejection event.

The sender is the subject: NATS lets a team's credential publish only `submit.<team>.*` and
`cancel.<team>`, and a cluster's only `cluster.<name>.>` (see `nats_identity`). No header is read
for identity; a bearer token a client still sends is ignored. Inbox rows (and so duplicate
detection) are keyed by sender and message id, and idempotency keys by team, so nobody can claim
another sender's message ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from controlplane.service import workloads
from controlplane.service.cluster_status import PodReport, RunStarted, apply_pod_report
from controlplane.service.commands import CancelWorkload, SubmitWorkload
from controlplane.service.errors import ServiceError
from controlplane.service.events import envelope, workload_subject
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.inventory import InventoryReport, apply_inventory
from controlplane.service.metrics import NO_METRICS, Metrics, seconds_between
from controlplane.service.ports import UnitOfWork
from controlplane.service.safejson import UnsafeJson, decode_object
from controlplane.service.views import Principal

CONSUMER = "ingest"
# A message that fails on this many deliveries (an exception, or the consumer died holding it) is
# dead-lettered by the worker; the JetStream consumer's `max_deliver` sits a little above, as a
# backstop that the worker's own check always reaches first.
MAX_DELIVERIES = 5


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    MALFORMED = "malformed"
    UNKNOWN = "unknown"  # a report about a cluster or run gpufleet does not know
    REFUSED = "refused"  # a claim its sender may not make (another cluster's run, an old epoch)

    @property
    def dead_letter(self) -> bool:
        """Whether the worker moves the message to the dead-letter stream (and stores nothing)."""
        return self in (Outcome.MALFORMED, Outcome.UNKNOWN, Outcome.REFUSED)


@dataclass(frozen=True)
class InboundMessage:
    subject: str
    data: bytes
    headers: Mapping[str, str]
    msg_id: str  # Gpufleet-Msg-Id (or Nats-Msg-Id), or stream:sequence when the sender gave none


@dataclass(frozen=True)
class Handled:
    outcome: Outcome
    detail: str


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors())


def _sender(parts: list[str]) -> str | None:
    """The identity the server let publish on this subject: `team:<name>` or `cluster:<name>`."""
    if (parts[1:2] == ["submit"] and len(parts) == 4) or (parts[1:2] == ["cancel"] and len(parts) == 3):
        return f"team:{parts[2]}"
    if parts[1:2] == ["cluster"] and len(parts) == 4:
        return f"cluster:{parts[2]}"
    return None


def inbox_key(sender: str, msg_id: str) -> str:
    """Inbox rows are per sender: the same id from two senders is two messages."""
    key = f"{sender}/{msg_id}"
    return key if len(key) <= 200 else f"{sender}/sha256:{hashlib.sha256(msg_id.encode()).hexdigest()}"


def handle(
    uow: UnitOfWork,
    message: InboundMessage,
    prefix: str,
    now: datetime,
    fit: FleetFit | None = None,
    metrics: Metrics = NO_METRICS,
) -> Handled:
    """Apply one inbound message; `fit` is the process's memo of the submit-time fleet check."""
    parts = message.subject.split(".")
    started: list[RunStarted] = []
    try:
        body = decode_object(message.data)
    except UnsafeJson as exc:
        return Handled(Outcome.MALFORMED, f"payload refused: {exc}")
    sender = _sender(parts)
    if sender is None:
        return Handled(Outcome.MALFORMED, f"no handler for subject {message.subject}")
    with uow:
        if not uow.inbox.first_time(CONSUMER, inbox_key(sender, message.msg_id), now):
            return Handled(Outcome.DUPLICATE, "already processed")
        if parts[1] == "submit":
            result = _submit(uow, parts[2], parts[3], body, message, prefix, now, fit)
        elif parts[1] == "cancel":
            result = _cancel(uow, parts[2], body, message, prefix, now)
        elif parts[3] == "pods":
            try:
                report = PodReport.model_validate(body)
            except ValidationError as exc:
                return Handled(Outcome.MALFORMED, _errors(exc))
            if not uow.admin.known_clusters([parts[2]]):
                return Handled(Outcome.UNKNOWN, f"pod report for unknown cluster {parts[2]!r}")
            if uow.runs.status(report.run_id) is None:
                return Handled(Outcome.UNKNOWN, f"pod report for unknown run {report.run_id!r}")
            refusal = check_pod_report(uow, parts[2], report)
            if refusal is not None:
                return Handled(Outcome.REFUSED, refusal)
            result = Handled(Outcome.APPLIED, apply_pod_report(uow, parts[2], report, prefix, now, started))
        elif parts[3] == "inventory":
            try:
                inventory = InventoryReport.model_validate(body)
            except ValidationError as exc:
                return Handled(Outcome.MALFORMED, _errors(exc))
            if not uow.admin.known_clusters([parts[2]]):
                return Handled(Outcome.UNKNOWN, f"inventory for unknown cluster {parts[2]!r}")
            result = Handled(Outcome.APPLIED, apply_inventory(uow, parts[2], inventory, now, prefix))
        else:
            return Handled(Outcome.MALFORMED, f"no handler for subject {message.subject}")
        uow.commit()
    for run in started:
        waited = seconds_between(run.submitted_at, now)
        if waited is not None:
            metrics.started(run.queue, waited)
    return result


def handle_batch(
    uow: UnitOfWork,
    messages: Sequence[InboundMessage],
    prefix: str,
    now: datetime,
    fit: FleetFit | None = None,
    metrics: Metrics = NO_METRICS,
) -> list[Handled]:
    """Apply several messages in one transaction, each in its own savepoint: what one message does (or
    refuses) is exactly what `handle` would do alone, and the batch pays one commit instead of one per
    message. An exception rolls the whole batch back; the caller then applies the messages one by one."""
    with uow:
        # (a gang seen starting in a batch that then rolls back is counted again when retried alone)
        results = [handle(uow, message, prefix, now, fit, metrics) for message in messages]
        uow.commit()
    return results


def check_pod_report(uow: UnitOfWork, cluster: str, report: PodReport) -> str | None:
    """Why a pod report may not be applied, or None: only the run's own cluster, at the run's epoch."""
    run = uow.runs.status(report.run_id)
    if run is None:
        return None  # unknown runs are a no-op in apply_pod_report
    if run.cluster != cluster:
        return f"run {run.run_id} runs on cluster {run.cluster}, not on {cluster} (who sent this report)"
    if run.epoch != report.epoch:
        return f"run {run.run_id} was placed at epoch {run.epoch}; the report carries epoch {report.epoch}"
    return None


def _team_principal(uow: UnitOfWork, team: str) -> Principal | None:
    node = uow.admin.get_tree_node("team", team)
    if node is None or node.name != team:
        return None
    return Principal(f"nats:team:{team}", "team", node.id)


def _reject(
    uow: UnitOfWork, team: str, queue: str, message: InboundMessage, reason: str, prefix: str, now: datetime
) -> Handled:
    event_id, payload = envelope(
        "workload.rejected", {"request_id": message.msg_id, "subject": message.subject, "reason": reason}, now
    )
    uow.outbox.add(workload_subject(prefix, team, queue, "rejected"), event_id, payload, now)
    return Handled(Outcome.REJECTED, reason)


def _submit(
    uow: UnitOfWork,
    team: str,
    queue: str,
    body: dict[str, Any],
    message: InboundMessage,
    prefix: str,
    now: datetime,
    fit: FleetFit | None,
) -> Handled:
    principal = _team_principal(uow, team)
    if principal is None:
        return _reject(uow, team, queue, message, f"no team {team!r}", prefix, now)
    body.setdefault("queue", queue)
    if body["queue"] != queue:
        return _reject(
            uow, team, queue, message, f"body names queue {body['queue']!r} but was sent to {queue!r}", prefix, now
        )
    body.setdefault("idempotency_key", message.msg_id[:100])
    try:
        request = SubmitWorkload.model_validate(body)
        workload_id, _ = workloads.create(uow, principal, request, prefix, now, fit)
    except ValidationError as exc:
        return _reject(uow, team, queue, message, _errors(exc), prefix, now)
    except ServiceError as exc:
        return _reject(uow, team, queue, message, str(exc), prefix, now)
    return Handled(Outcome.APPLIED, workload_id)


def _cancel(
    uow: UnitOfWork, team: str, body: dict[str, Any], message: InboundMessage, prefix: str, now: datetime
) -> Handled:
    queue = "unknown"
    principal = _team_principal(uow, team)
    if principal is None:
        return _reject(uow, team, queue, message, f"no team {team!r}", prefix, now)
    try:
        request = CancelWorkload.model_validate(body)
        view = workloads.cancel(uow, principal, request.workload_id, request.reason, prefix, now)
    except ValidationError as exc:
        return _reject(uow, team, queue, message, _errors(exc), prefix, now)
    except ServiceError as exc:
        return _reject(uow, team, queue, message, str(exc), prefix, now)
    return Handled(Outcome.APPLIED, view.id)
