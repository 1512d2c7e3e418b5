"""NATS nkeys (ed25519 keys in NATS' base32 text form) and the `ed25519-nkey` JWTs signed with them.

Written from the formats nats-io documents (nkeys: a prefix byte naming the key's role, the raw key,
a CRC-16/XMODEM checksum, base32 without padding; JWT: a JOSE header `{"typ": "JWT", "alg":
"ed25519-nkey"}`, base64url parts, an ed25519 signature over `header.payload`). Only what auth callout
needs: account keys that sign, and reading the server's signed requests.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PREFIX_SEED = 18 << 3  # "S"
PREFIX_ACCOUNT = 0  # "A"
PREFIX_USER = 20 << 3  # "U"
PREFIX_SERVER = 13 << 3  # "N"
_PUBLIC_PREFIXES = {PREFIX_ACCOUNT, PREFIX_USER, PREFIX_SERVER, 14 << 3, 2 << 3}  # and operator, cluster


class NkeyError(ValueError):
    pass


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _encode(raw: bytes) -> str:
    checked = raw + _crc16(raw).to_bytes(2, "little")
    return base64.b32encode(checked).decode().rstrip("=")


def _decode(text: str) -> bytes:
    try:
        data = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError) as exc:
        raise NkeyError("not base32") from exc
    if len(data) < 3 or _crc16(data[:-2]) != int.from_bytes(data[-2:], "little"):
        raise NkeyError("bad checksum")
    return data[:-2]


def public_key_bytes(public: str) -> bytes:
    raw = _decode(public)
    if len(raw) != 33 or raw[0] not in _PUBLIC_PREFIXES:
        raise NkeyError("not a public nkey")
    return raw[1:]


@dataclass(frozen=True)
class KeyPair:
    seed: str  # "SA...": the secret; keep it out of logs

    @staticmethod
    def create(prefix: int = PREFIX_ACCOUNT) -> KeyPair:
        raw = secrets.token_bytes(32)
        head = bytes([PREFIX_SEED | (prefix >> 5), (prefix & 31) << 3])
        return KeyPair(_encode(head + raw))

    def _raw(self) -> tuple[int, bytes]:
        data = _decode(self.seed)
        if len(data) != 34 or data[0] & 0xF8 != PREFIX_SEED:
            raise NkeyError("not an nkey seed")
        prefix = ((data[0] & 7) << 5) | ((data[1] & 0xF8) >> 3)
        return prefix, data[2:]

    def _private(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self._raw()[1])

    @property
    def public_key(self) -> str:
        prefix, _ = self._raw()
        return _encode(bytes([prefix]) + self._private().public_key().public_bytes_raw())

    def sign(self, data: bytes) -> bytes:
        return self._private().sign(data)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_HEADER = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}, separators=(",", ":")).encode())


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
    try:
        key = Ed25519PublicKey.from_public_bytes(public_key_bytes(str(claims.get("iss", ""))))
        key.verify(signature, f"{header_text}.{payload_text}".encode())
    except (InvalidSignature, ValueError) as exc:
        raise NkeyError("JWT signature does not verify") from exc
    return claims
