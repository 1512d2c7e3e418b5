"""Schemathesis hook: schema-valid requests also keep the rules the OpenAPI states under `x-rules`.

JSON Schema cannot compare two fields, sum a list or tell unique names by one field, so the API
states those rules as sentences under `x-rules` (on an operation or a body schema, keyed by rule id;
see controlplane/service/constraints.py). Positive data must keep them, as a client reading the
document would; this hook makes each generated positive case keep every rule its operation states,
with the smallest change (a value clamped, a duplicate renamed) and never by calling the server's
own checks. It only knows the rules by their ids: a rule the schema does not state is never kept
for the server, so a server refusing on one fails `positive_data_acceptance`; a stated rule this
hook does not know stops the run, so a new one cannot slip by untested.

Negative cases are left as generated: they break the schema itself and must be refused anyway.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import schemathesis
from schemathesis import Case
from schemathesis.hooks import HookContext

# The report window and buckets (GET /v1/reports/*).
MAX_RANGE = timedelta(days=92)
MAX_BUCKETS = 1000
MAX_PODS_PER_GANG = 5000
MAX_CLUSTER_NODES = 20_000
MAX_CONTAINER_BYTES = 64 * 1024
# A kubeconfig of the shape the API accepts; its server answers nothing (port 9, discard, is closed).
KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:9"}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""

Json = dict[str, Any]


def _stated_rules(case: Case) -> set[str]:
    """The ids of the rules stated for this operation: on it, and in its request body's schema."""
    root = case.operation.schema.raw_schema
    found: set[str] = set(case.operation.definition.raw.get("x-rules", {}))
    seen: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref not in seen:
                seen.add(ref)
                target: Any = root
                for part in ref.removeprefix("#/").split("/"):
                    target = target[part]
                walk(target)
            found.update(node.get("x-rules", {}))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(case.operation.definition.raw.get("requestBody"))
    return found


def _pick(text: str, low: int, high: int) -> int:
    """A deterministic number in [low, high], drawn from the generated text (the run is seeded)."""
    return low + zlib.crc32(text.encode()) % (high - low + 1)


def _parse(value: object) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("z", "Z").replace("t", "T"))
    except ValueError:
        return None


def _span(start: datetime, end: datetime) -> timedelta:
    """`end - start`, naive times read as UTC as the API reads them."""

    def utc(moment: datetime) -> datetime:
        return moment.replace(tzinfo=None) - (moment.utcoffset() or timedelta())

    return utc(end) - utc(start)


def keep_window(case: Case) -> None:
    start, end = _parse(case.query.get("from")), _parse(case.query.get("to"))
    if start is None or end is None or timedelta(0) < _span(start, end) <= MAX_RANGE:
        return
    length = timedelta(seconds=_pick(str(case.query["from"]), 1, int(MAX_RANGE.total_seconds())))
    try:
        end = start + length
    except OverflowError:  # near year 9999: the window ends where `from` was
        start, end = start - length, start
    case.query["from"] = start.isoformat()
    case.query["to"] = end.isoformat()


def keep_buckets(case: Case) -> None:
    bucket = case.query.get("bucket")
    start, end = _parse(case.query.get("from")), _parse(case.query.get("to"))
    if bucket is None or start is None or end is None:
        return
    needed = math.ceil(_span(start, end).total_seconds() / MAX_BUCKETS)
    if int(bucket) < needed:
        case.query["bucket"] = str(needed) if isinstance(bucket, str) else needed


def _items(case: Case, field: str) -> Iterator[Json]:
    items = case.body.get(field) if isinstance(case.body, dict) else None
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            yield item


def _rename_duplicates(items: list[Json], default: str | None) -> None:
    seen: set[str] = set()
    for index, item in enumerate(items):
        name = item.get("name", default)
        if name in seen:
            item["name"] = f"{str(name)[:55].rstrip('-')}-d{index}"
        seen.add(str(item.get("name", default)))


def keep_gang_pods(case: Case) -> None:
    pod_sets = list(_items(case, "pod_sets"))
    total = sum(p.get("replicas", 1) for p in pod_sets)
    if total > MAX_PODS_PER_GANG:
        budget = MAX_PODS_PER_GANG - len(pod_sets)  # room for the `max(1, ...)` below
        for p in pod_sets:
            p["replicas"] = max(1, int(p.get("replicas", 1)) * budget // total)


def keep_unique_pod_set_names(case: Case) -> None:
    _rename_duplicates(list(_items(case, "pod_sets")), "workers")


def keep_min_replicas(case: Case) -> None:
    for p in _items(case, "pod_sets"):
        if p.get("min_replicas") is not None and p["min_replicas"] > p.get("replicas", 1):
            p["min_replicas"] = p.get("replicas", 1)


def keep_min_available(case: Case) -> None:
    body, pod_sets = case.body, list(_items(case, "pod_sets"))
    total = sum(p.get("replicas", 1) for p in pod_sets)
    if body.get("min_available") is not None and body["min_available"] > total:
        body["min_available"] = total


def keep_min_available_sum(case: Case) -> None:
    body, pod_sets = case.body, list(_items(case, "pod_sets"))
    if body.get("min_available") is not None and any(p.get("min_replicas") is not None for p in pod_sets):
        body["min_available"] = sum(
            p["min_replicas"] if p.get("min_replicas") is not None else p.get("replicas", 1) for p in pod_sets
        )


def keep_container_bytes(case: Case) -> None:
    container = case.body.get("container")
    if container is not None and len(json.dumps(container, separators=(",", ":"))) > MAX_CONTAINER_BYTES:
        case.body["container"] = {}


def keep_guarantee_within_limit(case: Case) -> None:
    guaranteed, limit = case.body.get("guaranteed") or {}, case.body.get("limit") or {}
    for key, amount in guaranteed.items():
        if key in limit and amount > limit[key]:
            guaranteed[key] = limit[key]


def keep_unique_pool_names(case: Case) -> None:
    _rename_duplicates(list(_items(case, "pools")), None)


def keep_cluster_nodes(case: Case) -> None:
    pools = list(_items(case, "pools"))
    total = sum(p.get("node_count", 0) for p in pools)
    if total > MAX_CLUSTER_NODES:
        for p in pools:
            p["node_count"] = int(p.get("node_count", 0) * MAX_CLUSTER_NODES // total)


def keep_mig_layout_fits(case: Case) -> None:
    """An explicit layout becomes one instance of its first profile, which fits any GPU of a model
    that has the profile (the schema already ties a layout's profiles to the pool's model)."""
    for pool in _items(case, "pools"):
        layout = str(pool.get("sharing", "")).removeprefix("mig:")
        if pool.get("sharing", "").startswith("mig:") and not layout.startswith("all-"):
            pool["sharing"] = "mig:" + layout.split("+")[0].split("*")[0]


def keep_kubeconfig(case: Case) -> None:
    if isinstance(case.body, dict) and isinstance(case.body.get("kubeconfig"), str):
        case.body["kubeconfig"] = KUBECONFIG


KEEPERS: dict[str, Callable[[Case], None]] = {
    "window": keep_window,
    "buckets": keep_buckets,
    "gang_pods": keep_gang_pods,
    "unique_pod_set_names": keep_unique_pod_set_names,
    "min_replicas_within_replicas": keep_min_replicas,
    "min_available_within_pods": keep_min_available,
    "min_available_matches_minimums": keep_min_available_sum,
    "container_bytes": keep_container_bytes,
    "guarantee_within_limit": keep_guarantee_within_limit,
    "unique_pool_names": keep_unique_pool_names,
    "cluster_nodes": keep_cluster_nodes,
    "mig_layout_fits": keep_mig_layout_fits,
    "kubeconfig": keep_kubeconfig,
}


@schemathesis.hook
def map_case(context: HookContext, case: Case) -> Case:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return case
    stated = _stated_rules(case)
    unknown = stated - KEEPERS.keys()
    if unknown:
        raise AssertionError(f"{case.operation.label} states rules this hook cannot keep: {sorted(unknown)}")
    for rule, keep in KEEPERS.items():  # in this order: sizes before the minimums that depend on them
        if rule in stated:
            keep(case)
    return case
