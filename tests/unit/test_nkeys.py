"""nkeys and ed25519-nkey JWTs (the live check is tests/integration/test_nats_security.py: a real
nats-server accepts the callout's signatures and the issuer's public key)."""

from __future__ import annotations

import base64

import nkeys
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


# Made by the hand-written encoding that came before nats-io's `nkeys` library: secrets files
# written then (their issuer seed) must give the same account key and the same signatures now.
EARLIER_SEED = "SAAAAAICAMCAKBQHBAEQUCYMBUHA6EARCIJRIFIWC4MBSGQ3DQOR4HYMHI"
EARLIER_PUBLIC = "AAB2CB576PHBBPQ5ODORRZ2LYCMWPZGWGCN2KDK7DXOIMZASKUY3QPZV"
EARLIER_SIGNATURE = "Mztm/bkNk0HjC8k/8foL1OB3NXymkPJ40bk3gUNQ27Gn8qmZvzkhKNo1jQQjlJBH0rXuqnJx1gBY0pbhBwVoCQ=="


def test_a_seed_from_before_the_library_gives_the_same_key_and_signatures() -> None:
    key = KeyPair(EARLIER_SEED)
    assert key.public_key == EARLIER_PUBLIC
    assert base64.b64encode(key.sign(b"gpufleet")).decode() == EARLIER_SIGNATURE


def test_the_jwt_signature_is_the_nkeys_librarys_own() -> None:
    key = KeyPair.create()
    header, payload, signature = encode_jwt({"sub": "UABC"}, key).split(".")
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    assert nkeys.from_seed(key.seed.encode()).verify(f"{header}.{payload}".encode(), raw)


def test_a_mistyped_seed_or_a_short_signature_is_refused() -> None:
    mistyped = EARLIER_SEED[:-1] + ("A" if EARLIER_SEED[-1] != "A" else "B")
    with pytest.raises(NkeyError):
        _ = KeyPair(mistyped).public_key  # nkeys.from_seed alone would take it as another key
    with pytest.raises(NkeyError):
        _ = KeyPair(EARLIER_PUBLIC).public_key  # a public key is not a seed
    header, payload, _signature = encode_jwt({"sub": "x"}, KeyPair(EARLIER_SEED)).split(".")
    with pytest.raises(NkeyError):
        decode_jwt(f"{header}.{payload}.AAAA")
