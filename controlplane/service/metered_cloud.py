"""A `CloudProvider` that reports every call it makes (count, outcome, duration) to `Metrics`.

The composition root wraps each provider it builds; nothing else changes for the callers. The
outcome label is `ok` or `error` (never the error's text: labels stay bounded; the logs say why).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from controlplane.service.cloud_ports import (
    CloudProvider,
    ClusterLocator,
    DiscoveredCluster,
    KubeAccess,
    ScaleResult,
    autoscaling_bounds,
)
from controlplane.service.metrics import Metrics

T = TypeVar("T")


class MeteredProvider:
    def __init__(self, inner: CloudProvider, metrics: Metrics) -> None:
        self.inner, self.metrics = inner, metrics
        self.provider = inner.provider

    def _call(self, operation: str, call: Callable[[], T]) -> T:
        started = time.perf_counter()
        outcome = "error"
        try:
            result = call()
            outcome = "ok"
            return result
        finally:
            self.metrics.cloud_call(self.provider, operation, outcome, time.perf_counter() - started)

    def list_clusters(self, account: str, region: str) -> list[ClusterLocator]:
        return self._call("list_clusters", lambda: self.inner.list_clusters(account, region))

    def discover(self, locator: ClusterLocator) -> DiscoveredCluster:
        return self._call("discover", lambda: self.inner.discover(locator))

    def credentials(self, locator: ClusterLocator) -> KubeAccess:
        return self._call("credentials", lambda: self.inner.credentials(locator))

    def scale_pool(self, locator: ClusterLocator, pool: str, desired: int) -> ScaleResult:
        return self._call("scale_pool", lambda: self.inner.scale_pool(locator, pool, desired))


class MeteredBoundsProvider(MeteredProvider):
    """For clouds that keep autoscaling bounds: the capability stays visible through the wrapper."""

    def set_autoscaling_bounds(self, locator: ClusterLocator, pool: str, min_size: int, max_size: int) -> None:
        bounds = autoscaling_bounds(self.inner)
        assert bounds is not None  # only built for providers that have the capability
        self._call("set_autoscaling_bounds", lambda: bounds.set_autoscaling_bounds(locator, pool, min_size, max_size))


def metered(provider: CloudProvider, metrics: Metrics) -> CloudProvider:
    if autoscaling_bounds(provider) is not None:
        return MeteredBoundsProvider(provider, metrics)
    return MeteredProvider(provider, metrics)
