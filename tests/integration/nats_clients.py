"""NATS clients for the security tests: connect as a credential, read the server's refusal off the
wire, collect a client's asynchronous errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import nats
from nats.aio.client import Client

from controlplane.config import Settings


class Watch:
    """A client's asynchronous errors (the server reports permission violations this way)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    async def on_error(self, exc: Exception) -> None:
        self.errors.append(str(exc).lower())

    async def saw(self, text: str, timeout: float = 3.0) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if any(text.lower() in e for e in self.errors):
                return True
            await asyncio.sleep(0.05)
        return False


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached in time")


async def connect_as(settings: Settings, token: str, inbox: str, watch: Watch | None = None) -> Client:
    return await nats.connect(
        settings.nats_url,
        token=token,
        inbox_prefix=inbox,
        error_cb=(watch or Watch()).on_error,
        allow_reconnect=False,
        connect_timeout=3,
    )


async def refused(settings: Settings, **credentials: str) -> str:
    """The server's answer to a CONNECT with `credentials`, read off the wire.

    nats-py takes any first line other than PONG or -ERR (an async INFO, or the end of the
    stream) as a successful connect, so it cannot tell a refusal from an admission on a slow
    server. This speaks the protocol itself: INFO lines are skipped and PINGs answered until the
    server says PONG (admitted: the test fails), -ERR (the refusal, returned) or closes."""
    url = urlsplit(settings.nats_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        connect = {"verbose": False, "pedantic": False, "protocol": 1, "headers": True, **credentials}
        if "token" in connect:
            connect["auth_token"] = connect.pop("token")
        if "password" in connect:
            connect["pass"] = connect.pop("password")
        await asyncio.wait_for(reader.readline(), 10)  # the server's INFO
        writer.write(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
        await writer.drain()
        while True:
            line = (await asyncio.wait_for(reader.readline(), 10)).decode().strip()
            if line.startswith("-ERR"):
                return line
            if line == "PONG":
                raise AssertionError(f"connected with {sorted(credentials)}")
            if line == "PING":
                writer.write(b"PONG\r\n")
                await writer.drain()
            elif not line:
                return "closed by the server without an answer"
    finally:
        writer.close()
