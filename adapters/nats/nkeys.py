"""NATS nkeys and the `ed25519-nkey` JWTs of auth callout, on nats-io's own `nkeys` library.

Keys, seeds and signatures are nats-io's `nkeys` (ed25519 through PyNaCl/libsodium); verifying a
signature made by a public key uses PyNaCl's `VerifyKey`, because `nkeys` 0.2 can only verify with a
key pair it holds the seed of. What stays here is the JWT envelope, which no maintained Python
library writes for auth callout (see docs/nats-security.md, "Keys and JWTs"): a JOSE header
`{"typ": "JWT", "alg": "ed25519-nkey"}`, base64url parts, and the ed25519 signature of
`header.payload`, as nats-io's jwt library (Go) writes it.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

_HEADER_FIELDS = {"typ": "JWT", "alg": "ed25519-nkey"}


class NkeyError(ValueError):
    pass


def _checked(text: str) -> bytes:
    """The bytes of an nkey's text form whose CRC-16 checksum (nkeys' own) is right, checksum removed.

    `nkeys.from_seed` does not check a seed's checksum, so a seed mistyped into a secrets file would
    silently become another key: checked here first."""
    try:
        data = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError) as exc:
        raise NkeyError("not an nkey: not base32") from exc
    if len(data) < 3 or nkeys.crc16_checksum(data[:-2]) != data[-2:]:
        raise NkeyError("not an nkey: bad checksum")
    return data[:-2]


def public_key_bytes(public: str) -> bytes:
    """The raw ed25519 key of a public nkey (account, user, server, operator or cluster)."""
    raw = _checked(public)
    if len(raw) != 33 or not nkeys.valid_public_prefix_byte(raw[0]):
        raise NkeyError("not a public nkey")
    return raw[1:]


@dataclass(frozen=True)
class KeyPair:
    seed: str  # "SA...": the secret; keep it out of logs

    @staticmethod
    def create(prefix: int = nkeys.PREFIX_BYTE_ACCOUNT) -> KeyPair:
        return KeyPair(nkeys.encode_seed(secrets.token_bytes(32), prefix).decode())

    @cached_property  # derived once per key: every answer of the callout signs with it
    def _pair(self) -> nkeys.KeyPair:
        raw = _checked(self.seed)
        if len(raw) != 34:
            raise NkeyError("not an nkey seed")
        try:
            return nkeys.from_seed(self.seed.encode())
        except nkeys.NkeysError as exc:
            raise NkeyError(str(exc)) from exc

    @property
    def public_key(self) -> str:
        return str(self._pair.public_key.decode())

    def sign(self, data: bytes) -> bytes:
        return bytes(self._pair.sign(data))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_HEADER = _b64(json.dumps(_HEADER_FIELDS, separators=(",", ":")).encode())


def encode_jwt(claims: dict[str, Any], issuer: KeyPair) -> str:
    """Sign `claims` as `issuer` (sets `iss`, `iat` and a random `jti`)."""
    body = {"jti": _b64(secrets.token_bytes(16)), "iat": int(time.time()), **claims, "iss": issuer.public_key}
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signature = issuer.sign(f"{_HEADER}.{payload}".encode())
    return f"{_HEADER}.{payload}.{_b64(signature)}"


def decode_jwt(token: str) -> dict[str, Any]:
    """The claims of a JWT whose signature verifies against its own `iss` nkey (a server's request)."""
    try:
        header_text, payload_text, signature_text = token.split(".")
        header = json.loads(_unb64(header_text))
        claims = json.loads(_unb64(payload_text))
        signature = _unb64(signature_text)
    except (ValueError, binascii.Error) as exc:
        raise NkeyError("malformed JWT") from exc
    if not isinstance(header, dict) or header.get("alg") != "ed25519-nkey" or not isinstance(claims, dict):
        raise NkeyError("not an ed25519-nkey JWT")
    key = VerifyKey(public_key_bytes(str(claims.get("iss", ""))))
    try:
        key.verify(f"{header_text}.{payload_text}".encode(), signature)
    except (BadSignatureError, ValueError) as exc:  # ValueError: a signature of the wrong length
        raise NkeyError("JWT signature does not verify") from exc
    return claims
