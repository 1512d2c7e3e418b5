"""What the API believes about a request's edge: who sent it, over what, and to which host name.

- **Trusted proxies.** `X-Forwarded-Proto` and `X-Forwarded-For` are read only from a peer listed
  in `trusted_proxies` (addresses or networks): the proxy that terminates TLS says the request
  came over https (the dashboard cookie is then `Secure`) and whose it is (failed logins are
  counted per real client, not per proxy). From anyone else they are ignored: any client can send
  them. uvicorn's own reading of them is switched off (`proxy_headers=False` in bootstrap), so
  this is the only one.
- **Trusted hosts.** A request whose `Host` is not one of `trusted_hosts` gets a 400: a page that
  rebinds its own DNS name to 127.0.0.1 makes the browser send that name, so it cannot read the
  API of a `gpufleet up` through the browser. The probes and the scrape answer any host
  (`HOST_FREE_PATHS`): kubelets and Prometheus address pods by IP, and none of the three gives a
  page anything (health is public, /metrics needs a bearer token a browser never adds itself).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

HOST_FREE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def host_name(header: str) -> str:
    """The name in a Host header, lower-case, without its port (`[::1]:8080` -> `::1`)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(name: str, trusted: Sequence[str]) -> bool:
    for pattern in (p.lower() for p in trusted):
        if pattern in ("*", name):
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]) and len(name) > len(pattern) - 1:
            return True
    return False


def _networks(entries: Sequence[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def _in(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in networks)


class Edge:
    def __init__(
        self, app: ASGIApp, trusted_hosts: Sequence[str] = ("*",), trusted_proxies: Sequence[str] = ()
    ) -> None:
        self.app = app
        self.trusted_hosts = tuple(trusted_hosts)
        self.proxies = _networks(trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        peer = (scope.get("client") or ("", 0))[0]
        if self.proxies and _in(peer, self.proxies):
            scope = dict(scope)
            proto = headers.get("x-forwarded-proto", "").split(",")[-1].strip().lower()
            if proto in ("http", "https"):
                scope["scheme"] = proto
            client = self._forwarded_client(headers.get("x-forwarded-for", ""))
            if client is not None:
                scope["client"] = (client, 0)
        if str(scope.get("path", "")) not in HOST_FREE_PATHS:
            name = host_name(headers.get("host", ""))
            if not host_allowed(name, self.trusted_hosts):
                shown = "".join(c if c.isprintable() else "?" for c in name[:100])
                detail = f"this server does not answer to the host name {shown!r} (GPUFLEET_API_TRUSTED_HOSTS)"
                await JSONResponse({"detail": detail}, status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _forwarded_client(self, header: str) -> str | None:
        """The nearest address in X-Forwarded-For that is not a trusted proxy (the ones before it
        were written by the client and prove nothing)."""
        for hop in reversed([h.strip() for h in header.split(",") if h.strip()]):
            if not _in(hop, self.proxies):
                return hop[:64]
        return None
