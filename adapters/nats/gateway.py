"""The inbound gateway: the only way a sender's message reaches a stream.

Teams and clusters publish on their own subjects (`<p>.submit.<team>.<queue>`, `<p>.cancel.<team>`,
`<p>.cluster.<c>.…`, `<p>.telemetry.<c>.…`), which no stream captures. The gateway (a queue group
of the ingest processes) takes each message and

- answers only inside the sender's own inbox prefix (`_INBOX.<kind>-<name>.`): a message whose
  reply subject points anywhere else is refused. A stream that captured the senders' subjects
  would publish its acknowledgement on any reply subject a sender named, so one tenant could
  have JetStream write onto another tenant's event or report subjects;
- refuses a body above the inbound limit (the server's `max_payload` less room for gpufleet's
  envelope), so whatever it stores can always be dead-lettered, logged and answered;
- keeps only the message ids of the sender's headers (`Gpufleet-Msg-Id`, which the ingest inbox
  de-duplicates per sender, and `Nats-Msg-Id`), and gives JetStream the latter scoped to the
  sender (`<kind>:<name>/<id>`): nobody can have the server drop another sender's message by
  using its id first;
- stores the message under `<p>.in.…` (where only the control plane may publish) and hands the
  stream's acknowledgement back to the sender, so a client's `js.publish` works as before.

A refused message is answered with a JetStream-style error (the client's publish raises with the
sentence) when its reply subject is the sender's own, and dead-lettered (an excerpt when it is
large) with the reason: nothing is lost silently.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from adapters.nats.connection import INBOUND_ID_HEADER
from adapters.nats.dead_letters import dead_letter
from adapters.nats.sizes import inbound_limit
from adapters.nats.topology import SENT_KINDS, stored_subject
from controlplane.service.nats_identity import NatsGrant, sender_of_subject

log = logging.getLogger(__name__)

GATEWAY_QUEUE = "gpufleet-gateway"
MAX_ID_LENGTH = 200  # the inbox keys ids of up to 200 characters
# An acknowledgement that has not come back by then never will (the sender gave up long before).
_ACK_PATIENCE = 60.0


@dataclass(frozen=True)
class Refusal:
    code: int  # the HTTP-like status of the JetStream-style error answered to the sender
    reason: str  # a short machine-readable cause, the metric's label
    sentence: str


class InboundGateway:
    """`confine_replies`: answer only inside the sender's inbox (on for an authenticated server;
    without authentication every client may publish anywhere, so there is nothing to confine)."""

    def __init__(
        self,
        nc: Client,
        prefix: str,
        confine_replies: bool,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.nc = nc
        self.prefix = prefix
        self.confine_replies = confine_replies
        self.on_refused = on_refused or (lambda _reason: None)
        self._tokens = itertools.count()
        self._waiting: dict[str, tuple[str, float]] = {}  # ack token -> (sender's reply, deadline)
        self._subs: list[Subscription] = []
        self._ack_prefix = ""

    async def start(self) -> None:
        self._ack_prefix = self.nc.new_inbox()
        self._subs.append(await self.nc.subscribe(f"{self._ack_prefix}.*", cb=self._on_ack))
        for kind in SENT_KINDS:
            # `>`: a deeper subject a sender may use still reaches ingest, which dead-letters it
            subject = f"{self.prefix}.{kind}.>"
            self._subs.append(await self.nc.subscribe(subject, queue=GATEWAY_QUEUE, cb=self._on_message))
        await self.nc.flush()

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()

    def refusal(self, msg: Msg, sender: NatsGrant | None) -> Refusal | None:
        """Why `msg`, from `sender` (the identity its subject belongs to), may not be stored, or None."""
        if sender is None:
            return Refusal(400, "subject", f"no sender may publish on {msg.subject[:200]!r}")
        if self.confine_replies and msg.reply and not msg.reply.startswith(sender.inbox_prefix + "."):
            return Refusal(403, "reply", f"the reply subject must be in the sender's own inbox {sender.inbox_prefix}.>")
        limit = inbound_limit(self.nc.max_payload)
        if len(msg.data) > limit:
            return Refusal(413, "size", f"a message body of {len(msg.data):,} bytes is above the limit of {limit:,}")
        for header in (INBOUND_ID_HEADER, "Nats-Msg-Id"):
            length = len((msg.headers or {}).get(header) or "")
            if length > MAX_ID_LENGTH:
                return Refusal(400, "id", f"the {header} header has {length:,} characters; at most {MAX_ID_LENGTH}")
        return None

    async def _on_message(self, msg: Msg) -> None:
        try:
            sender = sender_of_subject(self.prefix, msg.subject)
            refusal = self.refusal(msg, sender)
            if refusal is not None:
                await self._refuse(msg, refusal)
                return
            assert sender is not None  # `refusal` refuses a subject that names no sender
            message_id = _message_id(msg)
            headers = {INBOUND_ID_HEADER: message_id} if message_id else None
            stream_id = (msg.headers or {}).get("Nats-Msg-Id")
            if headers is not None and stream_id:  # the sender asked JetStream to de-duplicate
                headers["Nats-Msg-Id"] = f"{sender.kind}:{sender.name}/{stream_id}"
            reply = ""
            if msg.reply:
                token = str(next(self._tokens))
                self._waiting[token] = (msg.reply, asyncio.get_running_loop().time() + _ACK_PATIENCE)
                reply = f"{self._ack_prefix}.{token}"
                if len(self._waiting) % 4096 == 0:
                    self._forget_expired()
            await self.nc.publish(stored_subject(self.prefix, msg.subject), msg.data, reply=reply, headers=headers)
        except Exception:  # one message must never stop the gateway
            log.exception("inbound gateway: message on %s not forwarded", msg.subject[:200])

    async def _on_ack(self, msg: Msg) -> None:
        waiting = self._waiting.pop(msg.subject.rsplit(".", 1)[-1], None)
        if waiting is not None:
            try:
                await self.nc.publish(waiting[0], msg.data)
            except Exception:
                log.exception("inbound gateway: acknowledgement not forwarded")

    async def _refuse(self, msg: Msg, refusal: Refusal) -> None:
        self.on_refused(refusal.reason)
        log.warning("inbound gateway refused a message on %s: %s", msg.subject[:200], refusal.sentence)
        if msg.reply and refusal.reason != "reply":  # never answer outside the sender's inbox
            error = {"error": {"code": refusal.code, "description": refusal.sentence}}
            await self.nc.publish(msg.reply, json.dumps(error).encode())
        # A core publish into the DLQ stream, not a JetStream request: refusals must not make the
        # gateway wait, whatever their number.
        reason = f"refused by the inbound gateway: {refusal.sentence}"
        target, body, headers = dead_letter(self.prefix, msg.subject, msg.data, reason, self.nc.max_payload)
        await self.nc.publish(target, body, headers=headers)

    def _forget_expired(self) -> None:
        now = asyncio.get_running_loop().time()
        for token in [t for t, (_, deadline) in self._waiting.items() if deadline < now]:
            del self._waiting[token]


def _message_id(msg: Msg) -> str | None:
    headers = msg.headers or {}
    return headers.get(INBOUND_ID_HEADER) or headers.get("Nats-Msg-Id") or None
