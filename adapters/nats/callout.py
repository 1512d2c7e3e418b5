"""NATS auth callout: the server asks, the control plane answers with a signed user JWT.

Every client that is not one of the control plane's fixed users connects with a gpufleet credential
as its token (or password). The server sends an authorization request (a JWT it signed) to
`$SYS.REQ.USER.AUTH`; we check the credential in SQL (`authorize`, by its SHA-256 hash) and answer
with an authorization response carrying a user JWT, signed by our account key, whose permissions
are exactly the grant's. With `ttl` > 0 a user JWT expires after that many seconds and the server
disconnects the client (nats-py then closes the connection for good: its owner must reconnect), so
the default is no expiry. `sweep` disconnects (kicks) clients whose
credential has been revoked since they connected, through the system account.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from adapters.nats.nkeys import KeyPair, NkeyError, decode_jwt, encode_jwt
from adapters.nats.server import APP_ACCOUNT
from controlplane.service.nats_identity import NatsGrant

log = logging.getLogger(__name__)
AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"
MAX_TRACKED = 100_000  # credentials
MAX_PER_CREDENTIAL = 256  # connections remembered per credential (agents reconnect as JWTs expire)


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
        still_valid: Callable[[Sequence[str]], set[str]],
        ttl: float = 0.0,
    ) -> None:
        self.issuer = issuer
        self.authorize = authorize
        self.still_valid = still_valid
        self.ttl = ttl
        # credential id -> the latest connections it opened (server id, client id), oldest first, for
        # kicking on revocation; closed ones linger harmlessly (a kick of a gone client is a no-op)
        self.connections: dict[str, dict[tuple[str, int], None]] = {}
        self.refused = 0

    async def serve(self, nc: Client) -> None:
        # A queue group: with several ingest replicas, one answers each request.
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
        except (NkeyError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring an authorization request we cannot read: %s", exc)
            return  # the server times out and refuses the client
        secret = str(options.get("auth_token") or options.get("pass") or "")
        try:
            grant = await asyncio.to_thread(self.authorize, secret) if secret else None
        except Exception:
            log.exception("authorization lookup failed; refusing the connection")
            grant = None
        if grant is None:
            self.refused += 1
            await msg.respond(self._respond_claims(user_nkey, server_id, "", "invalid or revoked gpufleet credential"))
            return
        user_jwt = encode_jwt(user_claims(grant, user_nkey, self.ttl), self.issuer)
        if isinstance(client.get("id"), int) and len(self.connections) < MAX_TRACKED:
            opened = self.connections.setdefault(grant.credential_id, {})
            opened[(server_id, client["id"])] = None
            while len(opened) > MAX_PER_CREDENTIAL:
                del opened[next(iter(opened))]
        await msg.respond(self._respond_claims(user_nkey, server_id, user_jwt, ""))

    async def adopt(self, system: Client) -> None:
        """Learn the connections the server has now (those authorized before a restart, or by another
        replica): their user name, which we set, ends with the credential id."""
        try:
            answer = await system.request(
                "$SYS.REQ.SERVER.PING.CONNZ",
                json.dumps({"account": APP_ACCOUNT, "auth": True, "limit": 100_000}).encode(),
                timeout=2.0,
            )
            data = json.loads(answer.data)["data"]
            server_id, connections = str(data["server_id"]), data.get("connections") or []
        except Exception as exc:  # no answer: keep what we know
            log.info("connection listing failed: %s", exc)
            return
        for connection in connections:
            user = str(connection.get("authorized_user") or "")
            if ":" in user and "/" in user and isinstance(connection.get("cid"), int):
                credential_id = user.rsplit("/", 1)[1]
                if credential_id in self.connections or len(self.connections) < MAX_TRACKED:
                    self.connections.setdefault(credential_id, {})[(server_id, connection["cid"])] = None

    async def sweep(self, system: Client) -> int:
        """Disconnect the connections of credentials revoked since they connected; returns how many."""
        await self.adopt(system)
        if not self.connections:
            return 0
        valid = await asyncio.to_thread(self.still_valid, list(self.connections))
        kicked = 0
        for credential_id in [c for c in self.connections if c not in valid]:
            for server_id, cid in self.connections.pop(credential_id):
                try:
                    answer = await system.request(
                        f"$SYS.REQ.SERVER.{server_id}.KICK", json.dumps({"cid": cid}).encode(), timeout=2.0
                    )
                    kicked += b'"error"' not in answer.data  # a client that is gone already is not counted
                except Exception as exc:  # gone already, or a server that does not answer: nothing to do
                    log.info("kick of client %s on %s: %s", cid, server_id, exc)
        return kicked
