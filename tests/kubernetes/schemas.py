"""Validate objects the way a current API server does: built-in kinds with `kubernetes-validate`
(strict: unknown fields are errors), custom objects against the real CRD schemas vendored in
`crds/` (see crds/README.md for their origin), made strict the same way (a field the schema does
not declare is an error, as with `fieldValidation=Strict`, not silently pruned)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import yaml

KUBERNETES_VERSION = "1.35.0"
CRD_DIR = Path(__file__).parent / "crds"
CRD_FILES = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset_jobsets.yaml",
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "volcano_podgroups.yaml",
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "coscheduling_podgroups.yaml",
}


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if k != "properties"}
        if "properties" in schema:
            out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
            if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
                out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(x) for x in schema]
    return schema


@functools.cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the JobSet CRD is 800 kB
    crd = yaml.load((CRD_DIR / CRD_FILES[(api_version, kind)]).read_text(), Loader=loader)
    version = api_version.split("/")[1]
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = copy.deepcopy(served["schema"]["openAPIV3Schema"])
    # metadata is validated by the API server itself, not by the CRD schema
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(_strict(schema))


def validate_object(body: dict[str, Any]) -> None:
    """Raise AssertionError with every schema error of `body`."""
    key = (body.get("apiVersion", ""), body.get("kind", ""))
    if key in CRD_FILES:
        errors = sorted(_crd_validator(*key).iter_errors(body), key=lambda e: list(e.absolute_path))
        assert not errors, "; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5])
        return
    try:
        kubernetes_validate.validate(body, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{key[1]} {body['metadata'].get('name')}: {exc}") from exc
