"""The pods the telemetry agent scrapes for serving signals, listed through the Kubernetes API.

Only pods gpufleet created (those with a `gpufleet.io/run` label), optionally only those on one
node (the agent runs as a DaemonSet beside its node's dcgm-exporter), read as raw JSON like every
other listing here (`api_client.json_body`). The agent needs `list` on pods in gpufleet's
namespaces for this, and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client, config

from adapters.kubernetes.api_client import json_body
from adapters.kubernetes.manifest_model import LABEL_RUN

REQUEST_TIMEOUT = 10.0


def pod_lister(api: client.ApiClient, node: str | None) -> Callable[[str], list[dict[str, Any]]]:
    """`list_pods(namespace)` over this API client: gpufleet's pods there, on `node` if given."""
    core = client.CoreV1Api(api)

    def list_pods(namespace: str) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {"label_selector": LABEL_RUN, "_preload_content": False}
        if node:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        body = json_body(core.list_namespaced_pod(namespace, _request_timeout=REQUEST_TIMEOUT, **kwargs))
        items = body.get("items")
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    return list_pods


def in_cluster_pod_lister(node: str | None) -> Callable[[str], list[dict[str, Any]]]:
    """The lister for an agent running in the cluster, with its service account's token."""
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return pod_lister(client.ApiClient(), node)
