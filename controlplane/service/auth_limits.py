"""A bounded rate of failed authentications per client address.

Each source has a leaky bucket: a failed authentication (an unknown or revoked bearer token, session
cookie or login token) adds one, and the bucket drains at `limit / window` per second. While it
holds `limit`, every request from that source that presents a credential is answered 429 with the
seconds until one more attempt fits, before the credential is looked up: a source guessing tokens
makes at most about `limit` guesses per `window`, and its lookups cost nothing while it waits.
Requests that present no credential are not counted (they are refused without a lookup).

Kept in this process's memory, which is enough for what it is for (a restart forgets it; N API
replicas allow N times the rate). At most `max_sources` addresses are tracked: when full, drained
buckets are forgotten first, then the oldest. IPv6 addresses count by their /64, the block one
host is usually given, so a host cannot multiply its budget by changing its address.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections.abc import Callable


class TooManyFailures(Exception):
    """This source failed to authenticate too often; it may retry after `retry_after` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many failed authentications from this address; retry in {retry_after} s")
        self.retry_after = retry_after


def source_key(address: str) -> str:
    """The bucket of a client address: an IPv4 address, an IPv6 /64, or the text as given."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if ip.version == 6 and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


class FailedAuthLimiter:
    def __init__(
        self,
        limit: int = 100,
        window: float = 60.0,
        max_sources: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.window, self.max_sources, self.clock = limit, window, max_sources, clock
        self.rate = limit / window  # drained per second
        self._buckets: dict[str, tuple[float, float]] = {}  # source -> (level, when)
        self._lock = threading.Lock()

    def _level(self, key: str, now: float) -> float:
        level, at = self._buckets.get(key, (0.0, now))
        return max(0.0, level - (now - at) * self.rate)

    def check(self, address: str) -> None:
        """Raise `TooManyFailures` while this address may not try to authenticate."""
        key, now = source_key(address), self.clock()
        with self._lock:
            level = self._level(key, now)
        if level > self.limit - 1:
            raise TooManyFailures(max(1, math.ceil((level - (self.limit - 1)) / self.rate)))

    def failed(self, address: str) -> None:
        """Count one failed authentication of this address."""
        key, now = source_key(address), self.clock()
        with self._lock:
            level = self._level(key, now)
            self._buckets.pop(key, None)  # re-inserted last: the dict stays in order of last failure
            if len(self._buckets) >= self.max_sources:
                self._forget(now)
            self._buckets[key] = (min(level + 1.0, float(self.limit)), now)

    def _forget(self, now: float) -> None:
        drained = [k for k, (level, at) in self._buckets.items() if level - (now - at) * self.rate <= 0]
        for k in drained:
            del self._buckets[k]
        while len(self._buckets) >= self.max_sources:
            del self._buckets[next(iter(self._buckets))]
