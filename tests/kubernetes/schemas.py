"""Schema validation of everything the fake API server receives.

Built-in kinds: the OpenAPI schemas that the PyPI package `kubernetes-validate` ships for
Kubernetes `KUBERNETES_VERSION`, in strict mode (no property the API does not define).

Custom resources: the real CRDs vendored in `tests/kubernetes/crds/` (see its README), validated
with `jsonschema` against the `openAPIV3Schema` of the served version, after translating the
Kubernetes structural-schema extensions:

- `x-kubernetes-int-or-string`: an integer or a string;
- `nullable: true`: null is allowed;
- `x-kubernetes-preserve-unknown-fields`: any property is kept;
- `x-kubernetes-embedded-resource`: apiVersion, kind and metadata are allowed;
- `x-kubernetes-list-type: map` / `set`: items unique by their `x-kubernetes-list-map-keys` / whole;
- `format: int32`: within the int32 range;
- a Go regexp `pattern` starting `^(?i)`: the flag moved to the front, where Python's `re` wants it;
- every other object schema with `properties`: an unknown property is REFUSED.

On that last point a real API server prunes unknown fields of custom resources silently (with a
warning header under the default `fieldValidation=Warn`) and refuses them only under
`fieldValidation=Strict` (kubectl's default). This fake refuses them always, for built-in kinds
too: a field gpufleet sends that the cluster drops is a bug a test must see, not a warning nobody
reads. CEL rules (`x-kubernetes-validations`) are not evaluated generically; the ones that matter
on create are written by hand in `admission.py`. Transition rules (`self == oldSelf`) are not
checked (the fake has no update verb for clients).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate import utils as kv_utils
from referencing import Registry, Resource

# The newest Kubernetes version the installed kubernetes-validate ships schemas for (checked at import).
KUBERNETES_VERSION = "1.37"

CRD_DIR = Path(__file__).parent / "crds"
CRD_FILES = {
    ("scheduling.volcano.sh", "podgroups"): "volcano_podgroups.yaml",
    ("scheduling.x-k8s.io", "podgroups"): "coscheduling_podgroups.yaml",
    ("jobset.x-k8s.io", "jobsets"): "jobset_jobsets.yaml",
    ("monitoring.coreos.com", "servicemonitors"): "monitoring_servicemonitors.yaml",
    ("monitoring.coreos.com", "prometheusrules"): "monitoring_prometheusrules.yaml",
}

_MAX_ERRORS = 5


def _shipped_version() -> str:
    shipped = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) == KUBERNETES_VERSION]
    if not shipped:
        raise RuntimeError(
            f"kubernetes-validate {kubernetes_validate.__version__} ships no schemas "
            f"for Kubernetes {KUBERNETES_VERSION}"
        )
    return str(shipped[-1])


SCHEMA_DIR = f"kubernetes-json-schema/v{_shipped_version()}-local-strict"


def _path(parts: Iterator[Any] | Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"


def _messages(validator: jsonschema.protocols.Validator, body: dict[str, Any]) -> list[str]:
    errors = sorted(validator.iter_errors(body), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    out: list[str] = []
    for error in errors:
        text = f"{_path(error.absolute_path)}: {error.message}"
        if text not in out:
            out.append(text)
    return out[:_MAX_ERRORS]


@cache
def _builtin_validator(kind: str, api_version: str) -> jsonschema.protocols.Validator:
    # Same file layout as kubernetes_validate.validate(); cached, since loading the definitions
    # (1.8 MB of JSON) per object would make every test slow.
    group_version = api_version.split("/")
    slug = api_version if len(group_version) == 1 else f"{group_version[0].split('.')[0]}-{group_version[1]}"
    schema = kv_utils.schema_contents(f"{SCHEMA_DIR}/{kind.lower()}-{slug}.json", KUBERNETES_VERSION)
    definitions = kv_utils.schema_contents(f"{SCHEMA_DIR}/_definitions.json", KUBERNETES_VERSION)
    registry: Registry[Any] = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def builtin_schema_errors(body: dict[str, Any]) -> list[str]:
    """Errors of a built-in object against the Kubernetes OpenAPI schema (strict)."""
    try:
        validator = _builtin_validator(str(body.get("kind")), str(body.get("apiVersion")))
    except (FileNotFoundError, kv_utils.SchemaNotFoundError):
        return [f"no schema for {body.get('apiVersion')} {body.get('kind')} in Kubernetes {KUBERNETES_VERSION}"]
    return _messages(validator, body)


# -- custom resources ------------------------------------------------------------------------


def _structural(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI v3 structural schema as plain JSON Schema (see the module docstring)."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-") and k not in ("nullable", "default")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if schema.get("format") == "int32" and schema.get("type") == "integer":  # go-openapi's int32 check
        out.setdefault("minimum", -(2**31))
        out.setdefault("maximum", 2**31 - 1)
    pattern = out.get("pattern")
    if isinstance(pattern, str) and "(?i)" in pattern and not pattern.startswith("(?i)"):
        # Go's regexp takes a flag group anywhere and applies it from there on; Python's only at the
        # start. Where it follows nothing but `^` (the PrometheusRule CRD's `^(?i)(abort|warn)?$`)
        # moving it to the front matches the same strings.
        assert pattern.startswith("^(?i)"), pattern
        out["pattern"] = "(?i)^" + pattern.removeprefix("^(?i)")
    if schema.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
    if "properties" in out:
        out["properties"] = {name: _structural(sub) for name, sub in out["properties"].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _structural(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = _structural(out["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [_structural(s) for s in out[key]]
    if schema.get("x-kubernetes-embedded-resource"):
        props = out.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not preserve and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if schema.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


def _list_map_keys(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """Every list with `x-kubernetes-list-type: map`: (path with "*" for list items, its keys)."""
    if schema.get("x-kubernetes-list-type") == "map":
        yield path, list(schema.get("x-kubernetes-list-map-keys") or [])
    for name, sub in (schema.get("properties") or {}).items():
        yield from _list_map_keys(sub, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from _list_map_keys(schema["items"], (*path, "*"))


@cache
def _crd(group: str, plural: str) -> tuple[dict[str, dict[str, Any]], str, str]:
    """(openAPIV3Schema per served version, kind, scope) of a vendored CRD."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the JobSet CRD is 800 kB of YAML
    doc = yaml.load((CRD_DIR / CRD_FILES[(group, plural)]).read_text(), Loader=loader)
    spec = doc["spec"]
    if (spec["group"], spec["names"]["plural"]) != (group, plural):
        raise RuntimeError(f"{CRD_FILES[(group, plural)]} is not {plural}.{group}")
    schemas = {v["name"]: v["schema"]["openAPIV3Schema"] for v in spec["versions"] if v.get("served")}
    return schemas, spec["names"]["kind"], spec["scope"]


@cache
def _crd_validator(group: str, version: str, plural: str) -> tuple[jsonschema.protocols.Validator, tuple[Any, ...]]:
    schemas, _, _ = _crd(group, plural)
    raw = copy.deepcopy(schemas[version])
    structural = _structural(raw)
    # The API server fills and checks apiVersion/kind/metadata itself; the schema's
    # `metadata: {type: object}` only says it is an object.
    jsonschema.Draft7Validator.check_schema(structural)
    return jsonschema.Draft7Validator(structural), tuple(_list_map_keys(raw))


def served_crd_versions(group: str, plural: str) -> set[str]:
    return set(_crd(group, plural)[0])


def crd_kind(group: str, plural: str) -> str:
    return _crd(group, plural)[1]


def _walk(obj: Any, path: tuple[str, ...], where: str) -> Iterator[tuple[str, Any]]:
    if not path:
        yield where, obj
        return
    head, rest = path[0], path[1:]
    if head == "*":
        for i, item in enumerate(obj if isinstance(obj, list) else []):
            yield from _walk(item, rest, f"{where}[{i}]")
    elif isinstance(obj, dict) and head in obj:
        yield from _walk(obj[head], rest, f"{where}.{head}" if where else head)


def custom_schema_errors(body: dict[str, Any], group: str, version: str, plural: str) -> list[str]:
    """Errors of a custom object against its CRD's schema for `version`."""
    if version not in served_crd_versions(group, plural):
        return [f"version {version} of {plural}.{group} is not served"]
    validator, map_lists = _crd_validator(group, version, plural)
    errors = _messages(validator, body)
    for path, keys in map_lists:
        for where, items in _walk(body, path, ""):
            if not isinstance(items, list):
                continue
            seen: set[str] = set()
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    continue
                missing = [k for k in keys if k not in item]
                if missing:
                    errors.append(f"{where}[{i}]: Required value: map list key {missing[0]} is required")
                    continue
                ident = json.dumps([item[k] for k in keys])
                if ident in seen:
                    errors.append(f"{where}[{i}]: Duplicate value: { {k: item[k] for k in keys} }")
                seen.add(ident)
    return errors


def validate_object(body: dict[str, Any]) -> None:
    """Raise AssertionError with every schema error of `body` (a built-in kind or one of the vendored CRDs)."""
    group, _, version = str(body.get("apiVersion", "")).rpartition("/")
    plural = next((p for (g, p) in CRD_FILES if g == group and crd_kind(g, p) == body.get("kind")), None)
    errors = custom_schema_errors(body, group, version, plural) if plural else builtin_schema_errors(body)
    name = (body.get("metadata") or {}).get("name")
    assert not errors, f"{body.get('kind')} {name}: " + "; ".join(errors[:_MAX_ERRORS])
