"""Request ids: every request gets one, every log line logged while serving it carries it.

A caller's `X-Request-ID` is kept when it is sane (1 to 128 characters of letters, digits and
`._:-`, so it can neither forge log structure nor grow without bound); otherwise, or without one,
the API makes a fresh one. Either way the response echoes it in `X-Request-ID`. One access line is
logged per request (method, path without the query string, status, duration; probes and scrapes at
debug level), never headers or bodies, which can hold tokens.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.logs import request_id
from controlplane.service.metrics import NO_METRICS, Metrics

HEADER = "X-Request-ID"
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
log = logging.getLogger("gpufleet.api.access")
# Probes and scrapes come every few seconds: their lines are debug, so `-v` shows them.
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def accepted_request_id(value: bytes | None) -> str:
    """The caller's id when it is sane, else a new one."""
    if value is not None:
        try:
            text = value.decode("ascii")
        except UnicodeDecodeError:
            text = ""
        if _SANE.fullmatch(text):
            return text
    return uuid.uuid4().hex


class RequestIds:
    """Also reports each answered request to `metrics`, by its route's template (bounded: one per
    route, and `unmatched` for every path no route has)."""

    def __init__(self, app: ASGIApp, metrics: Metrics = NO_METRICS) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        rid = accepted_request_id(incoming)
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 500  # unless the app answers

        async def with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        try:
            await self.app(scope, receive, with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None)
            self.metrics.api_request(
                str(scope.get("method", "")), route if isinstance(route, str) else "unmatched", status, elapsed
            )
            # The path is percent-decoded: a %0A in it must not start a forged line in text logs.
            path = "".join(c if c.isprintable() else "?" for c in str(scope.get("path", ""))[:200])
            log.log(
                logging.DEBUG if path in QUIET_PATHS else logging.INFO,
                "%s %s %d",
                scope.get("method", ""),
                path,
                status,
                extra={
                    "method": scope.get("method", ""),
                    "path": path,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 2),
                },
            )
            request_id.reset(token)
