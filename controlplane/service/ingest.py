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

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from controlplane.service import workloads
from controlplane.service.cluster_status import PodReport, RunStarted, apply_pod_report
from controlplane.service.commands import CancelWorkload, SubmitWorkload
from controlplane.service.errors import ServiceError
from controlplane.service.fleet_fit import FleetFit
from controlplane.service.ingest_messages import (
    CONSUMER,
    MAX_DELIVERIES,
    Handled,
    InboundMessage,
    Outcome,
    errors_text,
    inbox_key,
    sender_of,
)
from controlplane.service.ingest_submits import SubmitMessage, apply_submits, rejection, team_principal
from controlplane.service.inventory import InventoryReport, apply_inventory
from controlplane.service.metrics import NO_METRICS, Metrics, seconds_between
from controlplane.service.ports import RunStatus, UnitOfWork
from controlplane.service.safejson import UnsafeJson, decode_object

# The longest run or workload id a pod report or a cancel may name (their models' bound).
MAX_ID_CHARS = 40

# The message types live in `ingest_messages` (the batched submits use them too); they are
# re-exported here, where the workers and adapters have always found them.
__all__ = [
    "CONSUMER",
    "MAX_DELIVERIES",
    "Handled",
    "InboundMessage",
    "Outcome",
    "check_pod_report",
    "handle",
    "handle_batch",
    "inbox_key",
]


def handle(
    uow: UnitOfWork,
    message: InboundMessage,
    prefix: str,
    now: datetime,
    fit: FleetFit | None = None,
    metrics: Metrics = NO_METRICS,
) -> Handled:
    """Apply one inbound message; `fit` is the process's memo of the submit-time fleet check."""
    try:
        body = decode_object(message.data)
    except UnsafeJson as exc:
        return Handled(Outcome.MALFORMED, f"payload refused: {exc}")
    return _handle(uow, message, body, prefix, now, fit, metrics, locked=False)


def _handle(
    uow: UnitOfWork,
    message: InboundMessage,
    body: dict[str, Any],
    prefix: str,
    now: datetime,
    fit: FleetFit | None,
    metrics: Metrics,
    locked: bool,
) -> Handled:
    """`handle` of a decoded message; `locked`: the batch took the locks of what it writes."""
    parts = message.subject.split(".")
    started: list[RunStarted] = []
    sender = sender_of(parts)
    if sender is None:
        return Handled(Outcome.MALFORMED, f"no handler for subject {message.subject}")
    with uow:
        if not locked:  # before the inbox row: a redelivery racing its first delivery waits here
            _lock_targets(uow, [(parts, body)])
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
                return Handled(Outcome.MALFORMED, errors_text(exc))
            if not uow.admin.known_clusters([parts[2]]):
                return Handled(Outcome.UNKNOWN, f"pod report for unknown cluster {parts[2]!r}")
            run = uow.runs.status(report.run_id)
            if run is None:
                return Handled(Outcome.UNKNOWN, f"pod report for unknown run {report.run_id!r}")
            refusal = pod_report_refusal(run, parts[2], report)
            if refusal is not None:
                return Handled(Outcome.REFUSED, refusal)
            result = Handled(Outcome.APPLIED, apply_pod_report(uow, parts[2], report, prefix, now, started))
        elif parts[3] == "inventory":
            try:
                inventory = InventoryReport.model_validate(body)
            except ValidationError as exc:
                return Handled(Outcome.MALFORMED, errors_text(exc))
            if not uow.admin.known_clusters([parts[2]]):
                return Handled(Outcome.UNKNOWN, f"inventory for unknown cluster {parts[2]!r}")
            result = Handled(Outcome.APPLIED, apply_inventory(uow, parts[2], inventory, now, prefix))
        else:
            return Handled(Outcome.MALFORMED, f"no handler for subject {message.subject}")
        uow.commit()
    for gang in started:
        waited = seconds_between(gang.submitted_at, now)
        if waited is not None:
            metrics.started(gang.queue, waited)
    return result


def handle_batch(
    uow: UnitOfWork,
    messages: Sequence[InboundMessage],
    prefix: str,
    now: datetime,
    fit: FleetFit | None = None,
    metrics: Metrics = NO_METRICS,
) -> list[Handled]:
    """Apply several messages in one transaction: what each message does (or refuses) is exactly what
    `handle` would do alone, and the batch pays one commit instead of one per message. Runs of
    submits are applied together (`ingest_submits`: a few statements for the run, no savepoints);
    every other message in its own savepoint, in order. The workloads the pod reports and cancels
    write are locked first, all at once (the one lock order, adapters/sql/row_locks.py); an inventory
    report, which learns which runs it ends (on nodes that left) only as it applies, gets a
    transaction of its own in its place in the order. An exception rolls back the messages of its
    transaction; the caller then applies the messages one by one (those committed before are
    found in the inbox)."""
    results: list[Handled] = []
    start = 0
    for end, message in enumerate(messages):
        if _is_inventory(message):
            results += _handle_together(uow, messages[start:end], prefix, now, fit, metrics)
            results.append(handle(uow, message, prefix, now, fit, metrics))
            start = end + 1
    return results + _handle_together(uow, messages[start:], prefix, now, fit, metrics)


def _handle_together(
    uow: UnitOfWork,
    messages: Sequence[InboundMessage],
    prefix: str,
    now: datetime,
    fit: FleetFit | None,
    metrics: Metrics,
) -> list[Handled]:
    """`handle_batch` of messages that are no inventory reports: one transaction."""
    if not messages:
        return []
    results: list[Handled | None] = [None] * len(messages)
    run: list[tuple[int, SubmitMessage]] = []

    def apply_run() -> None:
        for (index, _), result in zip(run, apply_submits(uow, [m for _, m in run], prefix, now, fit), strict=True):
            results[index] = result
        run.clear()

    # Each message decoded once: a submit, a body, or what `handle` answers a body it cannot decode.
    prepared: list[SubmitMessage | dict[str, Any] | Handled] = []
    for message in messages:
        submit = _as_submit(message)
        if submit is not None:
            prepared.append(submit)
            continue
        try:
            prepared.append(decode_object(message.data))
        except UnsafeJson as exc:
            prepared.append(Handled(Outcome.MALFORMED, f"payload refused: {exc}"))
    with uow:
        _lock_targets(
            uow, [(m.subject.split("."), p) for m, p in zip(messages, prepared, strict=True) if isinstance(p, dict)]
        )
        for index, (message, item) in enumerate(zip(messages, prepared, strict=True)):
            if isinstance(item, SubmitMessage):
                run.append((index, item))
                continue
            if run:
                apply_run()
            # (a gang seen starting in a batch that then rolls back is counted again when retried alone)
            results[index] = (
                item if isinstance(item, Handled) else _handle(uow, message, item, prefix, now, fit, metrics, True)
            )
        if run:
            apply_run()
        uow.commit()
    return [r for r in results if r is not None]


def _is_inventory(message: InboundMessage) -> bool:
    parts = message.subject.split(".")
    return len(parts) == 4 and parts[1] == "cluster" and parts[3] == "inventory"


def _lock_targets(uow: UnitOfWork, messages: Sequence[tuple[list[str], dict[str, Any]]]) -> None:
    """Lock the workloads these pod reports and cancels may write, before anything else: the run
    a pod report names (by its workload) and the workload a cancel names. Whatever a body says is
    only an id to look up: a message that is then refused has locked a row for nothing, no more."""
    workloads: list[str] = []
    runs: list[str] = []
    for parts, body in messages:
        if len(parts) == 4 and parts[1] == "cluster" and parts[3] == "pods":
            run_id = body.get("run_id")
            if isinstance(run_id, str) and 0 < len(run_id) <= MAX_ID_CHARS:
                runs.append(run_id)
        elif len(parts) == 3 and parts[1] == "cancel":
            workload_id = body.get("workload_id")
            if isinstance(workload_id, str) and 0 < len(workload_id) <= MAX_ID_CHARS:
                workloads.append(workload_id)
    uow.workloads.lock(workloads, of_runs=runs)


def _as_submit(message: InboundMessage) -> SubmitMessage | None:
    """The message as a submit with a JSON object body, or None (anything else, and any submit
    `handle` would refuse before its inbox row, goes through `handle`)."""
    parts = message.subject.split(".")
    if parts[1:2] != ["submit"] or sender_of(parts) is None:
        return None
    try:
        body = decode_object(message.data)
    except UnsafeJson:
        return None
    return SubmitMessage(message, parts[2], parts[3], body)


def check_pod_report(uow: UnitOfWork, cluster: str, report: PodReport) -> str | None:
    """Why a pod report may not be applied, or None: only the run's own cluster, at the run's epoch."""
    run = uow.runs.status(report.run_id)
    if run is None:
        return None  # unknown runs are a no-op in apply_pod_report
    return pod_report_refusal(run, cluster, report)


def pod_report_refusal(run: RunStatus, cluster: str, report: PodReport) -> str | None:
    """`check_pod_report` on the run's status already read (one read per report, not two)."""
    if run.cluster != cluster:
        return f"run {run.run_id} runs on cluster {run.cluster}, not on {cluster} (who sent this report)"
    if run.epoch != report.epoch:
        return f"run {run.run_id} was placed at epoch {run.epoch}; the report carries epoch {report.epoch}"
    return None


def _reject(
    uow: UnitOfWork, team: str, queue: str, message: InboundMessage, reason: str, prefix: str, now: datetime
) -> Handled:
    uow.outbox.add(*rejection(team, queue, message, reason, prefix, now), now)
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
    principal = team_principal(uow, team)
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
        return _reject(uow, team, queue, message, errors_text(exc), prefix, now)
    except ServiceError as exc:
        return _reject(uow, team, queue, message, str(exc), prefix, now)
    return Handled(Outcome.APPLIED, workload_id)


def _cancel(
    uow: UnitOfWork, team: str, body: dict[str, Any], message: InboundMessage, prefix: str, now: datetime
) -> Handled:
    queue = "unknown"
    principal = team_principal(uow, team)
    if principal is None:
        return _reject(uow, team, queue, message, f"no team {team!r}", prefix, now)
    try:
        request = CancelWorkload.model_validate(body)
        view = workloads.cancel(uow, principal, request.workload_id, request.reason, prefix, now)
    except ValidationError as exc:
        return _reject(uow, team, queue, message, errors_text(exc), prefix, now)
    except ServiceError as exc:
        return _reject(uow, team, queue, message, str(exc), prefix, now)
    return Handled(Outcome.APPLIED, view.id)
