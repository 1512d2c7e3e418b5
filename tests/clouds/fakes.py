"""Small threaded HTTP servers that stand in for cloud APIs and record every request they get."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Recorded:
    method: str
    target: str  # path and query exactly as sent, which request signatures cover
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = None  # dict/list -> JSON, str/bytes -> as is
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "application/json"


Route = Callable[[Recorded], Reply]


class FakeServer:
    """Serves `route` on 127.0.0.1 on a free port; `requests` lists what arrived, in order."""

    def __init__(self, route: Route) -> None:
        self.requests: list[Recorded] = []
        self.failures: list[str] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' connection pools expect

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                parts = urlsplit(self.path)
                recorded = Recorded(
                    method=self.command,
                    target=self.path,
                    path=parts.path,
                    query=parse_qs(parts.query, keep_blank_values=True),
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=self.rfile.read(length) if length else b"",
                )
                with fake._lock:
                    fake.requests.append(recorded)
                try:
                    reply = route(recorded)
                except Exception as exc:
                    # A failed check in the fake must fail the test at once: 400, because every SDK retries
                    # a 5xx (OCI's default strategy for minutes).
                    fake.failures.append(repr(exc))
                    reply = Reply(400, {"error": {"code": "FakeFailure", "message": repr(exc)}})
                if isinstance(reply.body, (dict, list)):
                    payload = json.dumps(reply.body).encode()
                elif isinstance(reply.body, str):
                    payload = reply.body.encode()
                else:
                    payload = reply.body or b""
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in reply.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, format: str, *args: Any) -> None:
                return None  # keep pytest output to the assertions

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll interval so `stop()` returns in milliseconds rather than the default half second.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def calls(self, method: str, path_part: str = "") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method and path_part in r.path]
