"""The dead-letter stream: where a message nobody can apply, or an event NATS can never take, is kept
with the reason, always within the server's size limit."""

from __future__ import annotations

from nats.js import JetStreamContext

from adapters.nats.sizes import dead_letter_body


def max_payload_of(js: JetStreamContext) -> int:
    """The server's limit on one message (headers and body), as the connection was told."""
    return int(js._nc.max_payload)  # nats-py keeps a context's connection there


def dead_letter(
    prefix: str, subject: str, data: bytes, reason: str, max_payload: int, msg_id: str | None = None
) -> tuple[str, bytes, dict[str, str]]:
    """(subject, body, headers) of the dead letter of a message: `<prefix>.dlq.<subject without
    prefix>`, with why. Every header is bounded, and the body is carried whole only when it fits
    (else an excerpt and its digest): a dead letter is never larger than the server takes."""
    headers = {"Gpufleet-Dlq-Reason": reason[:1000], "Gpufleet-Original-Subject": subject[:1000]}
    if msg_id is not None:
        headers["Nats-Msg-Id"] = f"dlq:{msg_id[:200]}"
    body = dead_letter_body(data, headers, max_payload)
    return f"{prefix}.dlq.{subject.removeprefix(prefix + '.')}", body, headers


async def publish_dead_letter(
    js: JetStreamContext, prefix: str, subject: str, data: bytes, msg_id: str, reason: str
) -> None:
    """Republish a message nobody can apply to the dead-letter stream (`dead_letter`), acknowledged."""
    target, body, headers = dead_letter(prefix, subject, data, reason, max_payload_of(js), msg_id)
    await js.publish(target, body, timeout=5.0, headers=headers)
