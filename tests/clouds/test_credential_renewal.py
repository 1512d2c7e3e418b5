"""Cloud credentials of a cluster's Kubernetes client are renewed before they expire, and not on
every request: OKE's tokens live 4 minutes, less than the default 5-minute renewal margin, which
made every Kubernetes request of an OKE cluster one more OCI API call (found by the end-to-end
test, whose API server accepts only the token the cloud minted)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from controlplane.bootstrap.real_fleet import _CloudCredentials
from controlplane.service.cloud_ports import ClusterLocator, KubeAccess

LOCATOR = ClusterLocator("oke", "compartment", "us-ashburn-1", "oke-gpu")
START = datetime(2026, 1, 1, tzinfo=UTC)


class Minting:
    """A provider whose tokens live `lifetime` from the clock's time; counts what it mints."""

    def __init__(self, clock: list[datetime], lifetime: timedelta) -> None:
        self.clock, self.lifetime, self.minted = clock, lifetime, 0

    def credentials(self, locator: ClusterLocator) -> KubeAccess:
        self.minted += 1
        return KubeAccess("https://h", f"token-{self.minted}", "", self.clock[0] + self.lifetime)


def _requests(lifetime: timedelta, margin: float, every: timedelta, count: int) -> tuple[list[str], int]:
    clock = [START]
    provider = Minting(clock, lifetime)
    source = _CloudCredentials(provider, LOCATOR, margin, lambda: clock[0])  # type: ignore[arg-type]
    cfg: Any = SimpleNamespace(api_key={})
    sent = []
    for _ in range(count):
        source.hook(cfg)
        sent.append(cfg.api_key["authorization"])
        clock[0] += every
    return sent, source.renewals


def test_a_token_shorter_than_the_margin_is_renewed_half_way_not_per_request() -> None:
    sent, renewals = _requests(timedelta(minutes=4), 300.0, timedelta(seconds=10), 30)  # 5 minutes
    # 4-minute tokens: renewed after 2 minutes (12 requests), then again 2 minutes later.
    assert sent[:12] == ["token-1"] * 12
    assert sent[12:24] == ["token-2"] * 12
    assert renewals == 2


def test_a_long_lived_token_is_renewed_the_margin_before_it_expires() -> None:
    sent, renewals = _requests(timedelta(minutes=60), 300.0, timedelta(minutes=1), 60)
    assert sent[:55] == ["token-1"] * 55  # renewed 5 minutes before its hour is up
    assert sent[55] == "token-2"
    assert renewals == 1
