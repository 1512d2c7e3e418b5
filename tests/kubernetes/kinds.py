"""The resource types the fake Kubernetes API server serves, as (group, version, plural) keys."""

from __future__ import annotations

from dataclasses import dataclass

ResourceKey = tuple[str, str, str]  # (group, version, plural); group "" is the core group

PODS: ResourceKey = ("", "v1", "pods")
NODES: ResourceKey = ("", "v1", "nodes")
NAMESPACES: ResourceKey = ("", "v1", "namespaces")
JOBS: ResourceKey = ("batch", "v1", "jobs")
PRIORITY_CLASSES: ResourceKey = ("scheduling.k8s.io", "v1", "priorityclasses")
JOBSETS: ResourceKey = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
VOLCANO_PODGROUPS: ResourceKey = ("scheduling.volcano.sh", "v1beta1", "podgroups")
COSCHEDULING_PODGROUPS: ResourceKey = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")


def api_version(key: ResourceKey) -> str:
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


@dataclass(frozen=True)
class FailedCreate:
    """An object a controller tried to create and the API server refused (a FailedCreate event)."""

    resource: ResourceKey
    namespace: str
    name: str
    controller: str
    code: int
    message: str
