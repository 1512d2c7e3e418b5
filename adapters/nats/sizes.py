"""What fits in one NATS message, and what the control plane sends instead of what does not.

The server's `max_payload` (1 MiB by default) bounds a message's headers and body together. A
client that publishes more is not refused: the server closes its connection. nats-py checks the
body alone, so a body just under the limit plus a few headers takes the publisher off NATS. Every
publish of the control plane therefore measures the whole message first (`check_fits`), and a
dead letter carries the offending body only when it fits, else an excerpt and a digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

# What the HPUB framing adds around the headers: "NATS/1.0\r\n", "key: value\r\n" each, "\r\n".
_HEADER_LINE = len(b"NATS/1.0\r\n")
# Room kept under the server's limit for the headers the control plane adds to a message it
# stores or dead-letters (ids, reasons, the original subject): inbound bodies must leave it free.
ENVELOPE_ROOM = 16 * 1024
# A dead letter whose body cannot be carried whole keeps this much of it.
DEAD_LETTER_EXCERPT = 4 * 1024


class MessageTooLarge(ValueError):
    """A message the server would refuse by closing the connection: never sent."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message of {size:,} bytes (headers and body) is above the server's limit of {limit:,}")
        self.size = size
        self.limit = limit


def header_bytes(headers: Mapping[str, str] | None) -> int:
    """Bytes the headers take on the wire (0 without headers: a PUB, not an HPUB)."""
    if not headers:
        return 0
    lines = sum(len(key.encode()) + 2 + len(str(value).encode()) + 2 for key, value in headers.items())
    return _HEADER_LINE + lines + 2


def message_bytes(payload: bytes, headers: Mapping[str, str] | None) -> int:
    return len(payload) + header_bytes(headers)


def check_fits(payload: bytes, headers: Mapping[str, str] | None, max_payload: int) -> None:
    size = message_bytes(payload, headers)
    if size > max_payload:
        raise MessageTooLarge(size, max_payload)


def inbound_limit(max_payload: int) -> int:
    """The largest body gpufleet accepts from a sender: the server's limit less the envelope room,
    so that whatever it stores can always be dead-lettered, logged and answered."""
    return max(0, max_payload - ENVELOPE_ROOM)


def dead_letter_body(data: bytes, headers: dict[str, str], max_payload: int) -> bytes:
    """The body to dead-letter: all of `data` when it fits beside `headers`, else an excerpt (and
    `headers` gains the original size and SHA-256, so the whole can be recognised elsewhere)."""
    if message_bytes(data, headers) + 256 <= max_payload:
        return data
    headers["Gpufleet-Dlq-Excerpt"] = f"first {DEAD_LETTER_EXCERPT} bytes"
    headers["Gpufleet-Original-Bytes"] = str(len(data))
    headers["Gpufleet-Original-Sha256"] = hashlib.sha256(data).hexdigest()
    return data[:DEAD_LETTER_EXCERPT]
