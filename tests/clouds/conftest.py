"""Fixtures shared by the cloud adapter tests."""

from __future__ import annotations

import pytest

from tests.clouds.keys import KeyPair


@pytest.fixture(scope="session")
def rsa_key() -> KeyPair:
    return KeyPair.generate()
