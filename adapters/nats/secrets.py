"""The control plane's own NATS secrets: one private JSON file, created at first start.

It holds the passwords of the three fixed users and the account key that signs the user JWTs of
auth callout. It lives in the state directory with mode 0600 and is never written to SQL, a log
or a stream. For an external nats-server, the operator writes the same file and configures the
server as `docs/nats-security.md` shows.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from adapters.nats.nkeys import KeyPair
from adapters.nats.server import NatsServerAuth


@dataclass(frozen=True)
class NatsSecrets:
    control_password: str
    callout_password: str
    system_password: str
    issuer_seed: str
    control_user: str = "gpufleet"
    callout_user: str = "gpufleet-auth"
    system_user: str = "gpufleet-sys"

    @property
    def issuer(self) -> KeyPair:
        return KeyPair(self.issuer_seed)

    def server_auth(self) -> NatsServerAuth:
        return NatsServerAuth(
            control_password=self.control_password,
            callout_password=self.callout_password,
            system_password=self.system_password,
            issuer=self.issuer.public_key,
            control_user=self.control_user,
            callout_user=self.callout_user,
            system_user=self.system_user,
        )

    def __repr__(self) -> str:  # never print the secrets by accident
        return f"NatsSecrets(control_user={self.control_user!r}, issuer={self.issuer.public_key})"


def load(path: Path) -> NatsSecrets:
    data = json.loads(path.read_text())
    return NatsSecrets(**{k: str(v) for k, v in data.items() if k in NatsSecrets.__dataclass_fields__})


def load_or_create(path: Path) -> NatsSecrets:
    if path.exists():
        return load(path)
    fresh = NatsSecrets(
        control_password=secrets.token_urlsafe(32),
        callout_password=secrets.token_urlsafe(32),
        system_password=secrets.token_urlsafe(32),
        issuer_seed=KeyPair.create().seed,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(fresh), out)
    return fresh
