"""nkeys and ed25519-nkey JWTs (the live check is tests/integration/test_nats_security.py: a real
nats-server accepts the callout's signatures and the issuer's public key)."""

from __future__ import annotations

import pytest

from adapters.nats.nkeys import KeyPair, NkeyError, decode_jwt, encode_jwt, public_key_bytes


def test_a_seed_gives_an_account_key_whose_signatures_verify() -> None:
    key = KeyPair.create()
    assert key.seed.startswith("SA")
    assert key.public_key.startswith("A")
    assert len(key.public_key) == 56
    assert len(public_key_bytes(key.public_key)) == 32
    assert KeyPair(key.seed).public_key == key.public_key
    claims = decode_jwt(encode_jwt({"sub": "UABC", "nats": {"type": "user"}}, key))
    assert claims["iss"] == key.public_key
    assert claims["sub"] == "UABC"


def test_a_corrupted_key_or_a_tampered_jwt_is_refused() -> None:
    key = KeyPair.create()
    flipped = key.public_key[:-3] + ("B" if key.public_key[-3] != "B" else "C") + key.public_key[-2:]
    with pytest.raises(NkeyError):
        public_key_bytes(flipped)
    header, _payload, signature = encode_jwt({"sub": "x"}, key).split(".")
    other = encode_jwt({"sub": "y"}, key).split(".")[1]
    with pytest.raises(NkeyError):
        decode_jwt(f"{header}.{other}.{signature}")
    forged = encode_jwt({"sub": "x"}, KeyPair.create())
    assert decode_jwt(forged)["iss"] != key.public_key  # verifies against its own issuer only
    with pytest.raises(NkeyError):
        decode_jwt("not.a.jwt")
