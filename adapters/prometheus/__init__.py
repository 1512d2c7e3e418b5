"""Prometheus exposition of gpufleet's metrics: the `Metrics` adapter, the SQL gauge collector, and
the metrics port of worker processes."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)

from adapters.prometheus.fleet import FleetCollector
from adapters.prometheus.metrics import PrometheusMetrics

__all__ = ["FleetCollector", "PrometheusMetrics", "exposition", "new_registry", "serve_metrics"]


def new_registry() -> CollectorRegistry:
    """A registry of this process's own (never the library's global one, so two control planes in
    one test process do not collide)."""
    # No `<name>_created` series beside every counter and histogram: in the text format they are
    # separate gauges that double the series count and that nothing of gpufleet's reads.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    return CollectorRegistry(auto_describe=False)


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition format of everything in `registry`, with its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> Callable[[], None]:
    """Serve `registry` on http://host:port/metrics in a thread; returns the function that stops it."""
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
