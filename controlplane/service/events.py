"""Versioned event envelopes `{type, version, id, occurred_at, data}` written to the outbox."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

ENVELOPE_VERSION = 1


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
    return event_id, json.dumps(body, separators=(",", ":"), sort_keys=True)


def workload_subject(prefix: str, team: str, queue: str, event: str) -> str:
    """Carries the team, so NATS can let a team's credential read its own workloads' events only."""
    return f"{prefix}.events.workload.{team}.{queue}.{event}"
