"""Prometheus exposition of gpufleet's metrics: the `Metrics` adapter, the SQL gauge collector, and
the metrics port of worker processes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer

from adapters.prometheus.fleet import FleetCollector
from adapters.prometheus.metrics import PrometheusMetrics
from controlplane.service.auth import ScrapeVerdict

# (client address, its Authorization header or None) -> whether it may read the exposition.
Authorize = Callable[[str, str | None], ScrapeVerdict]

__all__ = ["FleetCollector", "PrometheusMetrics", "exposition", "new_registry", "serve_metrics"]


def new_registry() -> CollectorRegistry:
    """A registry of this process's own (never the library's global one, so two control planes in
    one test process do not collide)."""
    # No `<name>_created` series beside every counter and histogram: in the text format they are
    # separate gauges that double the series count and that nothing of gpufleet's reads.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=False)
    # The process's own health, as every Prometheus client exports it: CPU seconds, resident memory,
    # open file descriptors and start time (`process_*`, Linux), the interpreter's version and its
    # garbage collector (`python_*`). Registered on this registry, not the library's global one.
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition format of everything in `registry`, with its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _Quiet(WSGIRequestHandler):
    """No access line on stderr per scrape (the library's own server is silent too)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _guarded(registry: CollectorRegistry, authorize: Authorize) -> Callable[..., Iterable[bytes]]:
    """The library's WSGI exposition app, behind `authorize` (a bearer token of role metrics or admin)."""
    exposition_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        authorization = environ.get("HTTP_AUTHORIZATION")
        verdict = authorize(str(environ.get("REMOTE_ADDR", "")), None if authorization is None else str(authorization))
        if verdict.status == 200:
            return exposition_app(environ, start_response)  # type: ignore[no-any-return]
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if verdict.status == 401:
            headers.append(("WWW-Authenticate", "Bearer"))
        if verdict.retry_after is not None:
            headers.append(("Retry-After", str(verdict.retry_after)))
        reasons = {401: "Unauthorized", 403: "Forbidden", 429: "Too Many Requests"}
        start_response(f"{verdict.status} {reasons.get(verdict.status, 'Refused')}", headers)
        return [verdict.detail.encode() + b"\n"]

    return app


def serve_metrics(registry: CollectorRegistry, host: str, port: int, authorize: Authorize) -> Callable[[], None]:
    """Serve `registry` on http://host:port/metrics in a thread, to bearer tokens `authorize`
    admits; returns the function that stops it."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(host, port, _guarded(registry, authorize), Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="metrics-port", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
