"""The official Kubernetes client as gpufleet uses it: a configuration from explicit credentials, raw JSON bodies.

Shared by the driver, the pod status watcher and the node and pod listings.
"""

from __future__ import annotations

import json
from typing import Any, cast

import urllib3
from kubernetes import client


def configuration_for(
    host: str,
    token: str,
    *,
    ca_cert_file: str | None = None,
    verify_ssl: bool = True,
) -> client.Configuration:
    """A client configuration from explicit credentials (no kubeconfig, no exec plugins)."""
    cfg = client.Configuration()
    cfg.host = host
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    cfg.verify_ssl = verify_ssl
    if ca_cert_file is not None:
        cfg.ssl_ca_cert = ca_cert_file
    return cfg


def json_body(resp: object) -> dict[str, Any]:
    """The JSON body of a call made with `_preload_content=False` (a raw urllib3 response).

    Raw bodies are read instead of the client's models because custom objects come back as dicts
    anyway, and one representation keeps label and annotation handling in one place.
    """
    raw = cast(urllib3.BaseHTTPResponse, resp)
    body: dict[str, Any] = json.loads(raw.data)
    return body
