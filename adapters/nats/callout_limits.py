"""What the auth callout remembers between requests: the open connections of each credential (for the
per-credential cap and for revocation) and the recent failed authentications of each source host.

Both are plain in-memory state of one control-plane process, fed by the callout itself and by the
server's connect and disconnect events (`adapters/nats/revoker.py`); nothing here talks to NATS.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

Connection = tuple[str, int]  # (server id, client id): what a kick names
MAX_HOSTS = 100_000  # source hosts whose failures are remembered (the oldest are forgotten first)
MAX_KNOWN_GOOD = 100_000  # secrets (hashes) that have authenticated here


@dataclass(frozen=True)
class CalloutLimits:
    """0 turns a limit off. A credential is one team or admin API token, or one cluster credential."""

    per_identity: int = 16  # open connections of one team or admin API token
    per_cluster: int = 1024  # of one cluster credential (the telemetry agent runs on every GPU node)
    failures_per_host: int = 20  # failed authentications of one source host within the window
    failure_window: float = 60.0  # seconds

    def cap(self, kind: str) -> int:
        return self.per_cluster if kind == "cluster" else self.per_identity


def credential_of(user: str) -> str | None:
    """The credential id at the end of a connection's user name `<kind>:<name>/<credential id>`
    (the name the callout gives every user JWT), or None for any other user."""
    if ":" not in user or "/" not in user:
        return None
    return user.rsplit("/", 1)[1] or None


class ConnectionTable:
    """Open connections by credential, as the callout authorized them and the server reported them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._owner: dict[Connection, tuple[str, float]] = {}  # -> (credential id, when learned)
        self._by_credential: dict[str, set[Connection]] = {}

    def add(self, credential_id: str, connection: Connection) -> None:
        self.remove(connection)  # a client id reused by a restarted server belongs to the new owner
        self._owner[connection] = (credential_id, self.clock())
        self._by_credential.setdefault(credential_id, set()).add(connection)

    def remove(self, connection: Connection) -> None:
        owner = self._owner.pop(connection, None)
        if owner is None:
            return
        held = self._by_credential.get(owner[0])
        if held is not None:
            held.discard(connection)
            if not held:
                del self._by_credential[owner[0]]

    def count(self, credential_id: str) -> int:
        return len(self._by_credential.get(credential_id, ()))

    def credentials(self) -> list[str]:
        return list(self._by_credential)

    def connections(self, credential_id: str) -> list[Connection]:
        return sorted(self._by_credential.get(credential_id, ()))

    def __len__(self) -> int:
        return len(self._owner)

    def replace(self, listed: Mapping[Connection, str], since: float) -> None:
        """Make the table what the servers listed: `listed` maps each connection they reported to its
        credential. Connections learned at or after `since` (when the listing was asked for) stay,
        since the listing may predate them; every other one not listed is gone, also those of a
        server that no longer answers (a restarted server has a new id, its old clients are gone)."""
        for connection, (_, learned) in list(self._owner.items()):
            if connection not in listed and learned < since:
                self.remove(connection)
        for connection, credential_id in listed.items():
            if self._owner.get(connection, ("", 0.0))[0] != credential_id:
                self.add(credential_id, connection)


class FailureLimiter:
    """Failed authentications per source host, in a sliding window.

    A host with `limit` failures younger than `window` seconds is blocked: the callout refuses it
    without looking its secret up, unless the secret is one that authenticated here before (so a
    known agent or team behind the same address, or on the same machine, still gets in while
    someone there guesses). Refusals of a blocked host do not count as failures: a host that stops
    failing gets in again `window` seconds after its last counted failure at the latest."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.clock = limit, window, clock
        self._failures: dict[str, deque[float]] = {}
        self._known_good: dict[str, None] = {}  # secret hashes, oldest first

    def _recent(self, host: str) -> deque[float] | None:
        failures = self._failures.get(host)
        if failures is None:
            return None
        horizon = self.clock() - self.window
        while failures and failures[0] <= horizon:
            failures.popleft()
        if not failures:
            del self._failures[host]
            return None
        return failures

    def blocked(self, host: str, secret_hash: str) -> bool:
        if self.limit <= 0 or secret_hash in self._known_good:
            return False
        failures = self._recent(host)
        return failures is not None and len(failures) >= self.limit

    def failed(self, host: str) -> None:
        if self.limit <= 0:
            return
        failures = self._recent(host) or deque(maxlen=self.limit)
        self._failures.pop(host, None)  # re-inserted last: the dict is kept oldest-failure first
        failures.append(self.clock())
        self._failures[host] = failures
        while len(self._failures) > MAX_HOSTS:
            del self._failures[next(iter(self._failures))]

    def succeeded(self, secret_hash: str) -> None:
        self._known_good.pop(secret_hash, None)
        self._known_good[secret_hash] = None
        while len(self._known_good) > MAX_KNOWN_GOOD:
            del self._known_good[next(iter(self._known_good))]
