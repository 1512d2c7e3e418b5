"""How the client commands reach the REST API: its URL, the token, one request whose failures become
readable messages (the options that choose them are `output_options.py`'s).

Only HTTP: it works the same against `gpufleet up` on a laptop and against a deployed API.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from controlplane.cli import contexts
from controlplane.paths import default_state_dir

if TYPE_CHECKING:
    import httpx

DEFAULT_API = "http://127.0.0.1:8080"
TIMEOUT_SECONDS = 30.0
TOKEN_FILE = "admin.token"

Json = Any  # a decoded JSON document: the CLI only reads the keys it shows


def state_dir() -> Path:
    """Where `gpufleet up` writes admin.token; honours GPUFLEET_STATE_DIR like the server does."""
    configured = os.environ.get("GPUFLEET_STATE_DIR")
    return Path(configured).expanduser() if configured else default_state_dir()


def token_file() -> Path:
    return state_dir() / TOKEN_FILE


def read_token_file(path: Path) -> str | None:
    # A missing or unreadable file is not an error here: the request goes out without a token
    # and the API's 401 turns into a message that says how to provide one.
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return token or None


@dataclass(frozen=True)
class Api:
    """Where the API is and how to authenticate to it."""

    url: str
    token: str | None

    @classmethod
    def from_options(cls, url: str | None, token: str | None) -> Api:
        """--api and --token as given (None or empty: not given), completed from the current
        context (`contexts.py`) and then from the local defaults: `gpufleet up`'s URL and the
        admin token it wrote to the state directory."""
        url, token = contexts.resolve(url, token, DEFAULT_API)
        return cls(url=url, token=token or read_token_file(token_file()))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | list[str]] | None = None,
        body: Json = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request; any failure becomes a ClickException (message on stderr, exit code 1)."""
        sent = dict(headers or {})
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        content = None
        if body is not None:
            # Serialised here rather than by httpx so YAML dates (e.g. a label `2024-05-01`) become
            # strings instead of a TypeError.
            content = json.dumps(body, default=_json_default)
            sent["Content-Type"] = "application/json"
        # Imported here: httpx takes about a third of a second to import, which every `--help` paid.
        import httpx  # noqa: PLC0415

        try:
            with httpx.Client(base_url=self.url, timeout=TIMEOUT_SECONDS) as client:
                response = client.request(method, path, params=params, content=content, headers=sent)
        except httpx.ConnectError as exc:
            raise click.ClickException(
                f"the gpufleet API is not reachable at {self.url} ({exc}).\n"
                "Start one with `gpufleet up`, or point --api / GPUFLEET_API at a running API."
            ) from exc
        except httpx.TimeoutException as exc:
            raise click.ClickException(
                f"the gpufleet API at {self.url} did not answer within {TIMEOUT_SECONDS:g} s"
            ) from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise click.ClickException(f"request to {self.url} failed: {exc}") from exc
        if response.is_error:
            raise click.ClickException(self._error_message(response))
        return response

    def _error_message(self, response: httpx.Response) -> str:
        detail = error_detail(response)
        if response.status_code == 401:
            how = (
                f"pass --token, set GPUFLEET_TOKEN, save it with `gpufleet login`, or put it in {token_file()} "
                "(`gpufleet up` writes the admin token there)"
            )
            if self.token is None:
                return f"no API token was sent ({detail}); {how}"
            return f"the API token was rejected ({detail}); {how}"
        if response.status_code == 422:
            return f"invalid request: {detail}"
        return f"{detail} (HTTP {response.status_code})"


def error_detail(response: httpx.Response) -> str:
    """The API's `{"detail": ...}` message, or something readable when a proxy answered instead."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    detail = payload.get("detail") if isinstance(payload, dict) else None
    if isinstance(detail, str) and detail:
        return detail
    if isinstance(detail, list):  # FastAPI's default validation shape, should a handler not reformat it
        return "; ".join(_validation_item(item) for item in detail)
    raw = response.text.strip()
    return raw[:300] if raw else response.reason_phrase


def _validation_item(item: Json) -> str:
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(p) for p in item.get("loc", ()) if p not in ("body", "query", "header", "path"))
    return f"{where or 'request'}: {item.get('msg', '')}"


def _json_default(value: object) -> str:
    if isinstance(value, date):  # also datetime
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def decoded(response: httpx.Response) -> Json:
    try:
        return response.json()
    except ValueError as exc:
        raise click.ClickException(
            f"the API answered HTTP {response.status_code} with a body that is not JSON"
        ) from exc
