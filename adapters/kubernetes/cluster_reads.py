"""One-shot reads of a Kubernetes cluster: its nodes (as the API returns them, or as the short
`NodeInfo`) and its live pods, which the inventory is built from. The blocking client calls run in
a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from adapters.kubernetes.api_client import json_body
from adapters.kubernetes.nodes import pool_key
from adapters.kubernetes.reserved import LIVE_POD_FIELD_SELECTOR
from controlplane.domain.model import Taint


@dataclass(frozen=True)
class NodeInfo:
    """One node as the GPU inventory needs it."""

    name: str
    pool: str | None
    gpu_product: str | None  # GFD `nvidia.com/gpu.product`
    gpu_count: int  # GFD `nvidia.com/gpu.count`, else the allocatable nvidia.com/gpu
    allocatable: Mapping[str, str]
    unschedulable: bool
    ready: bool
    taints: tuple[Taint, ...]
    labels: Mapping[str, str]

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.unschedulable


def node_info(node: Mapping[str, Any], pool_label_key: str | None = None) -> NodeInfo:
    """A short view of one node; `adapters/kubernetes/nodes.py` `observe_node` reads it for the inventory."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    allocatable: dict[str, str] = dict(status.get("allocatable") or {})
    pool = pool_key(labels, dict(meta.get("annotations") or {}), pool_label_key)[1] or None
    count_label = labels.get("nvidia.com/gpu.count")
    try:
        gpu_count = int(count_label) if count_label is not None else int(allocatable.get("nvidia.com/gpu", "0"))
    except ValueError:
        gpu_count = 0
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    taints = tuple(
        Taint(key=t["key"], value=t.get("value") or "", effect=t.get("effect") or "NoSchedule")
        for t in spec.get("taints") or []
        if t.get("key")
    )
    return NodeInfo(
        name=meta.get("name", ""),
        pool=pool,
        gpu_product=labels.get("nvidia.com/gpu.product"),
        gpu_count=gpu_count,
        allocatable=allocatable,
        unschedulable=bool(spec.get("unschedulable", False)),
        ready=ready,
        taints=taints,
        labels=labels,
    )


async def list_node_objects(api: client.ApiClient, *, label_selector: str | None = None) -> list[dict[str, Any]]:
    """Every Node object (or those matching `label_selector`) as the API returns it, sorted by name."""
    core = client.CoreV1Api(api)

    def fetch() -> dict[str, Any]:
        resp: object = core.list_node(label_selector=label_selector, _preload_content=False, _request_timeout=60)
        return json_body(resp)

    body = await asyncio.to_thread(fetch)
    items = [item for item in body.get("items") or [] if isinstance(item, dict)]
    return sorted(items, key=lambda n: str((n.get("metadata") or {}).get("name", "")))


async def list_live_pod_objects(api: client.ApiClient, page: int = 500) -> list[dict[str, Any]]:
    """Every pod of every namespace that is not finished, as the API returns it, read in pages (a
    large cluster's pod list is too big for one answer)."""
    core = client.CoreV1Api(api)

    def fetch() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            resp: object = core.list_pod_for_all_namespaces(
                field_selector=LIVE_POD_FIELD_SELECTOR,
                limit=page,
                _continue=token,
                _preload_content=False,
                _request_timeout=60,
            )
            body = json_body(resp)
            items.extend(item for item in body.get("items") or [] if isinstance(item, dict))
            token = (body.get("metadata") or {}).get("continue") or None
            if not token:
                return items

    return await asyncio.to_thread(fetch)


async def list_nodes(
    api: client.ApiClient, *, label_selector: str | None = None, pool_label_key: str | None = None
) -> list[NodeInfo]:
    """Every node (or those matching `label_selector`), sorted by name."""
    return [node_info(item, pool_label_key) for item in await list_node_objects(api, label_selector=label_selector)]
