"""One JSON parse per request body: routes take the document the body guard already decoded.

`BodyGuard` (app.py) reads every JSON body and decodes it with the hardened decoder (size, UTF-8,
depth, NaN/Infinity, duplicate keys) before any route runs. FastAPI would then parse the same bytes a
second time with `json.loads`; on the submit path that second parse is pure cost. The guard leaves
its result in the ASGI scope, and a route of this class hands it to FastAPI in place of a new parse.
FastAPI still decides whether a body is JSON (by its content type) and validates the document against
the route's model exactly as before; only where the document comes from changes."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

# The scope key under which the guard leaves the decoded body (absent when it decoded none).
DECODED_BODY = "gpufleet.decoded_body"


class DecodedRequest(Request):
    async def json(self) -> Any:
        if DECODED_BODY in self.scope:
            return self.scope[DECODED_BODY]
        # A body the guard did not decode (not JSON by its content type): FastAPI parses as it would.
        return await super().json()


class DecodedBodyRoute(APIRoute):
    """A route whose JSON body is the guard's decoded document, parsed once per request."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(DecodedRequest(request.scope, request.receive))

        return route
