"""What the ingest consumer handles and answers: inbound messages, their outcomes, inbox keys."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import ValidationError

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


# A rejection names a few errors, never all of them: a body with thousands of bad entries would
# otherwise give an event larger than the body itself.
MAX_ERRORS_NAMED = 10
MAX_ERROR_CHARS = 300


def errors_text(exc: ValidationError) -> str:
    errors = exc.errors()
    named = [
        f"{'.'.join(str(p) for p in err['loc'])[:100] or 'body'}: {err['msg'][:MAX_ERROR_CHARS]}"
        for err in errors[:MAX_ERRORS_NAMED]
    ]
    more = len(errors) - len(named)
    return "; ".join(named) + (f"; and {more:,} more errors" if more > 0 else "")


def sender_of(parts: list[str]) -> str | None:
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
