"""NATS auth callout: the server asks, the control plane answers with a signed user JWT.

Every client that is not one of the control plane's fixed users connects with a gpufleet credential
as its token (or password). The server sends an authorization request (a JWT it signed) to
`$SYS.REQ.USER.AUTH`; we check the credential in SQL (`authorize`, by its SHA-256 hash) and answer
with an authorization response carrying a user JWT, signed by our account key, whose permissions
are exactly the grant's. With `ttl` > 0 a user JWT expires after that many seconds and the server
disconnects the client (nats-py then closes the connection for good: its owner must reconnect), so
the default is no expiry.

Two limits are kept here (`callout_limits.py`): a credential may hold only so many open connections
(the connection table, which `revoker.py` keeps current from the server's events, counts them), and
a source host that failed to authenticate too often is refused for a while. Connections of revoked
credentials are closed by `revoker.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from adapters.nats.callout_limits import CalloutLimits, ConnectionTable, FailureLimiter
from adapters.nats.nkeys import KeyPair, NkeyError, decode_jwt, encode_jwt
from adapters.nats.server import APP_ACCOUNT
from controlplane.service.nats_identity import NatsGrant

log = logging.getLogger(__name__)
AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"


def user_claims(grant: NatsGrant, user_nkey: str, ttl: float) -> dict[str, Any]:
    # An empty allow list would mean "everything": an identity that may publish nothing is denied ">".
    publish: dict[str, list[str]] = {"allow": list(grant.publish)} if grant.publish else {"deny": [">"]}
    claims: dict[str, Any] = {
        "sub": user_nkey,
        "aud": APP_ACCOUNT,
        # The server shows this as the connection's user (connz), which lets a later sweep, even
        # after a control-plane restart, tell which credential each connection authenticated with.
        "name": f"{grant.kind}:{grant.name}/{grant.credential_id}",
        "nats": {
            "pub": publish,
            "sub": {"allow": list(grant.subscribe)},
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": "user",
            "version": 2,
        },
    }
    if ttl > 0:
        claims["exp"] = int(time.time() + ttl)
    return claims


class AuthCallout:
    def __init__(
        self,
        issuer: KeyPair,
        authorize: Callable[[str], NatsGrant | None],
        table: ConnectionTable,
        limits: CalloutLimits,
        ttl: float = 0.0,
    ) -> None:
        self.issuer = issuer
        self.authorize = authorize
        self.table = table  # open connections by credential (kept current by `revoker.ConnectionWatch`)
        self.limits = limits
        self.failures = FailureLimiter(limits.failures_per_host, limits.failure_window)
        self.ttl = ttl
        self.refused = 0

    async def serve(self, nc: Client) -> None:
        # A queue group: with several ingest replicas, one answers each request. nats-py runs one
        # subscription's callbacks one at a time, so a count and the connection it admits are one step.
        await nc.subscribe(AUTH_SUBJECT, queue="gpufleet-auth", cb=self._handle)

    def _respond_claims(self, user_nkey: str, server_id: str, user_jwt: str, error: str) -> bytes:
        body: dict[str, Any] = {"type": "authorization_response", "version": 2}
        if user_jwt:
            body["jwt"] = user_jwt
        if error:
            body["error"] = error
        return encode_jwt({"sub": user_nkey, "aud": server_id, "nats": body}, self.issuer).encode()

    async def _handle(self, msg: Msg) -> None:
        try:
            claims = decode_jwt(msg.data.decode())
            request = claims["nats"]
            user_nkey, server_id = str(request["user_nkey"]), str(request["server_id"]["id"])
            options = request.get("connect_opts") or {}
            client = request.get("client_info") or {}
            host = str(client.get("host") or "")
        except (NkeyError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring an authorization request we cannot read: %s", exc)
            return  # the server times out and refuses the client
        grant, error = await self._decide(str(options.get("auth_token") or options.get("pass") or ""), host)
        if grant is None:
            self.refused += 1
            await msg.respond(self._respond_claims(user_nkey, server_id, "", error))
            return
        if isinstance(client.get("id"), int):
            # Counted at once: the server's connect event comes only after this answer.
            self.table.add(grant.credential_id, (server_id, client["id"]))
        user_jwt = encode_jwt(user_claims(grant, user_nkey, self.ttl), self.issuer)
        await msg.respond(self._respond_claims(user_nkey, server_id, user_jwt, ""))

    async def _decide(self, secret: str, host: str) -> tuple[NatsGrant | None, str]:
        """The grant for `secret` from `host`, or None and why not (the server logs the reason; the
        client is told only "authorization violation")."""
        secret_hash = hashlib.sha256(secret.encode()).hexdigest()
        if self.failures.blocked(host, secret_hash):
            return None, f"too many failed authentications from {host}; try again later"
        try:
            grant = await asyncio.to_thread(self.authorize, secret) if secret else None
        except Exception:
            log.exception("authorization lookup failed; refusing the connection")
            return None, "authorization lookup failed"  # our fault, not the client's: not counted
        if grant is None:
            self.failures.failed(host)
            return None, "invalid or revoked gpufleet credential"
        self.failures.succeeded(secret_hash)
        cap = self.limits.cap(grant.kind)
        if cap and self.table.count(grant.credential_id) >= cap:
            return None, f"credential {grant.credential_id} already has {cap} open connections"
        return grant, ""
