"""Handling inbound NATS messages: submit, cancel, cluster pod reports and node inventory.

Each message is applied in one transaction together with its inbox row, so a redelivery is a
no-op; the worker acks only after that commit. Bad input never raises out of here: a message we
cannot parse is `MALFORMED` and one about a cluster or run gpufleet does not know is `UNKNOWN`
(the worker dead-letters both, and neither leaves anything in SQL, not even an inbox row); a
well-formed but unacceptable request is `REJECTED` and leaves a rejection event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from controlplane.service import workloads
from controlplane.service.auth import authenticate
from controlplane.service.cluster_status import PodReport, apply_pod_report
from controlplane.service.commands import CancelWorkload, SubmitWorkload
from controlplane.service.errors import ServiceError
from controlplane.service.events import envelope, workload_subject
from controlplane.service.inventory import InventoryReport, apply_inventory
from controlplane.service.ports import UnitOfWork
from controlplane.service.safejson import UnsafeJson, decode_object

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

    @property
    def dead_letter(self) -> bool:
        """Whether the worker moves the message to the dead-letter stream (and stores nothing)."""
        return self in (Outcome.MALFORMED, Outcome.UNKNOWN)


@dataclass(frozen=True)
class InboundMessage:
    subject: str
    data: bytes
    headers: Mapping[str, str]
    msg_id: str  # Nats-Msg-Id, or stream:sequence when the sender gave none


@dataclass(frozen=True)
class Handled:
    outcome: Outcome
    detail: str


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors())


def _token(headers: Mapping[str, str]) -> str:
    value = headers.get("Authorization", "")
    return value[7:] if value.startswith("Bearer ") else ""


def handle(uow: UnitOfWork, message: InboundMessage, prefix: str, now: datetime) -> Handled:
    parts = message.subject.split(".")
    try:
        body = decode_object(message.data)
    except UnsafeJson as exc:
        return Handled(Outcome.MALFORMED, f"payload refused: {exc}")
    with uow:
        if not uow.inbox.first_time(CONSUMER, message.msg_id, now):
            return Handled(Outcome.DUPLICATE, "already processed")
        if parts[1:2] == ["submit"] and len(parts) == 3:
            result = _submit(uow, parts[2], body, message, prefix, now)
        elif parts[1:] == ["cancel"]:
            result = _cancel(uow, body, message, prefix, now)
        elif parts[1:2] == ["cluster"] and len(parts) == 4 and parts[3] == "pods":
            try:
                report = PodReport.model_validate(body)
            except ValidationError as exc:
                return Handled(Outcome.MALFORMED, _errors(exc))
            if not uow.admin.known_clusters([parts[2]]):
                return Handled(Outcome.UNKNOWN, f"pod report for unknown cluster {parts[2]!r}")
            if uow.runs.status(report.run_id) is None:
                return Handled(Outcome.UNKNOWN, f"pod report for unknown run {report.run_id!r}")
            result = Handled(Outcome.APPLIED, apply_pod_report(uow, parts[2], report, prefix, now))
        elif parts[1:2] == ["cluster"] and len(parts) == 4 and parts[3] == "inventory":
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
    return result


def _reject(uow: UnitOfWork, queue: str, message: InboundMessage, reason: str, prefix: str, now: datetime) -> Handled:
    event_id, payload = envelope(
        "workload.rejected", {"request_id": message.msg_id, "subject": message.subject, "reason": reason}, now
    )
    uow.outbox.add(workload_subject(prefix, queue, "rejected"), event_id, payload, now)
    return Handled(Outcome.REJECTED, reason)


def _submit(
    uow: UnitOfWork, queue: str, body: dict[str, Any], message: InboundMessage, prefix: str, now: datetime
) -> Handled:
    principal = authenticate(uow, _token(message.headers))
    if principal is None:
        return _reject(uow, queue, message, "missing or invalid API token in the Authorization header", prefix, now)
    body.setdefault("queue", queue)
    if body["queue"] != queue:
        return _reject(
            uow, queue, message, f"body names queue {body['queue']!r} but was sent to {queue!r}", prefix, now
        )
    body.setdefault("idempotency_key", message.msg_id[:100])
    try:
        request = SubmitWorkload.model_validate(body)
        view, _ = workloads.submit(uow, principal, request, prefix, now)
    except ValidationError as exc:
        return _reject(uow, queue, message, _errors(exc), prefix, now)
    except ServiceError as exc:
        return _reject(uow, queue, message, str(exc), prefix, now)
    return Handled(Outcome.APPLIED, view.id)


def _cancel(uow: UnitOfWork, body: dict[str, Any], message: InboundMessage, prefix: str, now: datetime) -> Handled:
    principal = authenticate(uow, _token(message.headers))
    queue = "unknown"
    if principal is None:
        return _reject(uow, queue, message, "missing or invalid API token in the Authorization header", prefix, now)
    try:
        request = CancelWorkload.model_validate(body)
        view = workloads.cancel(uow, principal, request.workload_id, request.reason, prefix, now)
    except ValidationError as exc:
        return _reject(uow, queue, message, _errors(exc), prefix, now)
    except ServiceError as exc:
        return _reject(uow, queue, message, str(exc), prefix, now)
    return Handled(Outcome.APPLIED, view.id)
