"""The subset of Kustomize that `deploy/member`, `deploy/control-plane` and `deploy/dcgm-exporter`
use, in Python, for machines without kubectl 1.27+ (kustomize v5): `resources` (files and
kustomization directories), `namespace`, `labels` (metadata only, as `includeSelectors: false`),
`images`, `replicas` (by name), `configMapGenerator` (files, `disableNameSuffixHash`, labels),
inline JSON 6902 `patches` with a kind/name target, and `components` (kind Component, applied in
order after the kustomization's resources and before its own transformers, as kustomize does: a
component's resources join the accumulated objects and its transformers apply to all of them).
Anything else in a kustomization is refused rather than ignored. When kubectl is installed the
tests check this renderer against it, object for object."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KNOWN = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "replicas",
    "configMapGenerator",
    "patches",
    "components",
}
_SCALABLE = {"Deployment", "ReplicaSet", "ReplicationController", "StatefulSet"}
_CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "Node"}


def render(directory: Path) -> list[dict[str, Any]]:
    kustomization = _load(directory, "Kustomization")
    objects = _resources(directory, kustomization)
    for entry in kustomization.get("components", []):
        component_dir = (directory / entry).resolve()
        component = _load(component_dir, "Component")
        objects += _resources(component_dir, component)
        _transform(component, objects)
    _transform(kustomization, objects)
    return objects


def _load(directory: Path, kind: str) -> dict[str, Any]:
    kustomization: dict[str, Any] = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN
    if unknown:
        raise ValueError(f"{directory}: kustomize_lite does not support {sorted(unknown)}")
    if kustomization.get("kind", "Kustomization") != kind:
        raise ValueError(f"{directory}: a {kustomization.get('kind')} where a {kind} is expected")
    return kustomization


def _resources(directory: Path, kustomization: dict[str, Any]) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for generator in kustomization.get("configMapGenerator", []):
        objects.append(_config_map(directory, generator))
    return objects


def _transform(kustomization: dict[str, Any], objects: list[dict[str, Any]]) -> None:
    namespace = kustomization.get("namespace")
    for obj in objects:
        if namespace and obj["kind"] not in _CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
        for entry in kustomization.get("labels", []):
            if entry.get("includeSelectors") or entry.get("includeTemplates"):
                raise ValueError("kustomize_lite applies labels to metadata only")
            obj["metadata"].setdefault("labels", {}).update(entry["pairs"])
        for image in kustomization.get("images", []):
            _set_image(obj, image)
    for entry in kustomization.get("replicas", []):
        for obj in objects:
            if obj["kind"] in _SCALABLE and obj["metadata"]["name"] == entry["name"]:
                obj["spec"]["replicas"] = entry["count"]
    for patch in kustomization.get("patches", []):
        target = patch["target"]
        for obj in objects:
            if obj["kind"] == target["kind"] and obj["metadata"]["name"] == target["name"]:
                for op in yaml.safe_load(patch["patch"]):
                    _json6902(obj, op)


def _config_map(directory: Path, generator: dict[str, Any]) -> dict[str, Any]:
    options = generator.get("options") or {}
    if not options.get("disableNameSuffixHash"):
        raise ValueError("kustomize_lite only generates ConfigMaps with disableNameSuffixHash")
    data: dict[str, str] = {}
    for item in generator.get("files", []):
        key, _, path = item.rpartition("=")
        data[key or Path(path).name] = (directory / path).read_text()
    metadata: dict[str, Any] = {"name": generator["name"]}
    if options.get("labels"):
        metadata["labels"] = dict(options["labels"])
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _set_image(obj: dict[str, Any], image: dict[str, str]) -> None:
    template = (obj.get("spec") or {}).get("template") or {}
    for container in (template.get("spec") or {}).get("containers", []):
        name, _, _ = container["image"].partition(":")
        if name == image["name"]:
            container["image"] = f"{image.get('newName', name)}:{image['newTag']}"


def _json6902(obj: dict[str, Any], op: dict[str, Any]) -> None:
    if op["op"] != "add":
        raise ValueError(f"kustomize_lite supports JSON 6902 'add' only, not {op['op']!r}")
    *parents, last = op["path"].strip("/").split("/")
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    value = copy.deepcopy(op["value"])
    if isinstance(node, list):
        node.insert(len(node) if last == "-" else int(last), value)
    else:
        node[last] = value
