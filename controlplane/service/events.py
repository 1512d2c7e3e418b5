"""Versioned event envelopes `{type, version, id, occurred_at, data}` written to the outbox."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # ports imports nothing from here; only the type is needed
    from controlplane.service.ports import UnitOfWork
    from controlplane.service.views import WorkloadView

ENVELOPE_VERSION = 1
# Every event fits in a NATS message with room to spare, whatever a sender put in the request it
# describes: an event above this is cut down (`_bounded`) before it reaches the outbox.
MAX_EVENT_BYTES = 64 * 1024
_MAX_TEXT = 1000  # characters a string value keeps in a cut-down event
_MAX_ITEMS = 100  # items a list keeps in a cut-down event


@dataclass(frozen=True)
class OutgoingEvent:
    id: str
    subject: str
    payload: str


def envelope(event_type: str, data: dict[str, Any], now: datetime, event_id: str | None = None) -> tuple[str, str]:
    """(id, JSON payload); pass `event_id` for events keyed by what they describe (idempotent ones)."""
    event_id = event_id or uuid.uuid4().hex
    body = {
        "type": event_type,
        "version": ENVELOPE_VERSION,
        "id": event_id,
        "occurred_at": now.isoformat(),
        "data": data,
    }
    try:
        payload = _dumps(body)
    except ValueError:
        # A NaN or infinity is never written into an event (consumers' JSON parsers refuse
        # them): such a figure means "no value" and is sent as null.
        payload = _dumps(_finite(body))
    if len(payload) <= MAX_EVENT_BYTES // 4 or len(payload.encode()) <= MAX_EVENT_BYTES:
        return event_id, payload
    return event_id, _bounded(body, len(payload.encode()))


def _dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"), sort_keys=True, allow_nan=False)


def _bounded(body: dict[str, Any], size: int) -> str:
    """An event above `MAX_EVENT_BYTES`, cut down and marked (`data.truncated`,
    `data.original_bytes`): long strings and lists shortened; if that is still too large, only its
    short scalar fields; failing that, only the marks."""
    data = _shortened(_finite(body["data"]))
    marks = {"truncated": True, "original_bytes": size}
    scalars = {
        key: value
        for key, value in data.items()
        if not isinstance(value, (dict, list)) and len(str(value)) <= 200 and len(key) <= 100
    }
    for kept in (data, dict(list(scalars.items())[:50]), {}):
        payload = _dumps({**body, "data": {**kept, **marks}})
        if len(payload.encode()) <= MAX_EVENT_BYTES:
            break
    return payload


def _shortened(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= _MAX_TEXT else value[:_MAX_TEXT] + "…"
    if isinstance(value, dict):
        return {str(key)[:_MAX_TEXT]: _shortened(item) for key, item in list(value.items())[:_MAX_ITEMS]}
    if isinstance(value, (list, tuple)):
        return [_shortened(item) for item in value[:_MAX_ITEMS]]
    return value


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def workload_subject(prefix: str, team: str, queue: str, event: str) -> str:
    """Carries the team, so NATS can let a team's credential read its own workloads' events only."""
    return f"{prefix}.events.workload.{team}.{queue}.{event}"


def emit(
    uow: UnitOfWork, prefix: str, queue: str, event: str, workload_id: str, now: datetime, **extra: object
) -> None:
    """Write a `workload.<event>` event about one workload to the outbox (in the caller's transaction)."""
    emit_each(uow, prefix, [(workload_id, queue, event, extra)], now)


def emit_view(uow: UnitOfWork, prefix: str, event: str, view: WorkloadView, now: datetime) -> None:
    """`emit` with the event data taken from a view the caller holds (a workload it just wrote), so
    nothing is read back."""
    uow.outbox.add_many([view_event(prefix, event, view, now)], now)  # a Core insert, no ORM object


def view_event(prefix: str, event: str, view: WorkloadView, now: datetime) -> tuple[str, str, str]:
    """(subject, event id, payload) of a `workload.<event>` event about a workload just added: the
    data `WorkloadRepository.event_data` would read back (its version is 1)."""
    data = {
        "workload_id": view.id,
        "name": view.name,
        "team": view.team,
        "queue": view.queue,
        "state": view.state,
        "reason": view.reason,
        "priority_class": view.priority_class,
        "version": 1,
    }
    event_id, payload = envelope(f"workload.{event}", data, now)
    return workload_subject(prefix, view.team, view.queue, event), event_id, payload


def emit_many(
    uow: UnitOfWork, prefix: str, event: str, items: Sequence[tuple[str, str]], now: datetime, **extra: object
) -> None:
    """`emit` for many workloads at once, `items` as (workload id, queue name): the same events,
    their data read in a few queries instead of one per workload (a cycle may admit thousands)."""
    emit_each(uow, prefix, [(workload_id, queue, event, extra) for workload_id, queue in items], now)


def emit_each(
    uow: UnitOfWork, prefix: str, items: Sequence[tuple[str, str, str, Mapping[str, object]]], now: datetime
) -> None:
    """`emit` for many workloads, `items` as (workload id, queue name, event, extra fields): each
    its own event, their data read in a few queries."""
    found = uow.workloads.event_data_many([workload_id for workload_id, _, _, _ in items])
    for workload_id, queue, event, extra in items:
        data = dict(found[workload_id])
        data.update(extra)
        event_id, payload = envelope(f"workload.{event}", data, now)
        subject = workload_subject(prefix, str(data.get("team", "unknown")), str(data.get("queue", queue)), event)
        uow.outbox.add(subject, event_id, payload, now)
