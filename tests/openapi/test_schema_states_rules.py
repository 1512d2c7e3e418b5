"""The request schemas state the rules the request models enforce, and say them in sentences.

Fast and without a server; `test_schemathesis.py` holds the whole API to the same promise with
generated data. Here: hand-picked requests that only a rule across fields refuses are refused by the
published schema too, and accepted ones are accepted by both; pattern refusals read as sentences;
`3.0` is an integer; no dict publishes `patternProperties` (under which any other key is valid);
and every rule stated under `x-rules` is one the schemathesis hook keeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from controlplane.service.cluster_specs import ClusterSpec, PoolSpec
from controlplane.service.commands import NAME_SENTENCE, PodSetSpec, PriorityClassSpec, SubmitWorkload, TokenSpec
from controlplane.service.serving import ServingSpec
from tests.openapi import schemathesis_hooks


def _validator(schema: dict[str, Any], component: str) -> Any:
    document = json.loads(json.dumps(schema["components"]["schemas"]).replace("#/components/schemas/", "#/$defs/"))
    return jsonschema_rs.validator_for({"$ref": f"#/$defs/{component}", "$defs": document})


def _walk(node: object) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


GANG = {"name": "g", "queue": "q", "pod_sets": [{"replicas": 2, "gpus": 1}]}
POOL = {"name": "p", "gpu_model": "H100-80GB", "gpus_per_node": 8, "cpu_millis": 96000, "memory_mib": 1 << 20}
POOL["node_count"] = 2
# (model, body, accepted): each refused body breaks a rule across fields, which JSON Schema states
# with `if`/`then`, `not`, `anyOf` or `contains`, or a pattern per GPU model.
CASES: list[tuple[type[BaseModel], dict[str, Any], bool]] = [
    (TokenSpec, {"name": "ci", "team": "vision"}, True),
    (TokenSpec, {"name": "ci"}, False),
    (TokenSpec, {"name": "root", "role": "admin"}, True),
    (TokenSpec, {"name": "root", "role": "admin", "team": "vision"}, False),
    (PodSetSpec, {"gpus": 1, "mig_profile": "3g.40gb"}, False),
    (PodSetSpec, {"mig_profile": "3g.40gb", "gpu_fraction": 0.5}, False),
    (PodSetSpec, {"gpus": 0, "mig_profile": "3g.40gb"}, True),
    (SubmitWorkload, GANG, True),
    (SubmitWorkload, {**GANG, "pod_sets": [{"replicas": 2}]}, False),
    (SubmitWorkload, {**GANG, "serving": {"traffic_metric": "http_requests_total"}}, False),
    (SubmitWorkload, {**GANG, "kind": "inference", "serving": {"traffic_metric": "http_requests_total"}}, True),
    (SubmitWorkload, {**GANG, "labels": {"gpufleet.io/epoch": "1"}}, False),
    (SubmitWorkload, {**GANG, "labels": {"example.com/team": "vision"}}, True),
    (SubmitWorkload, {**GANG, "labels": {"a" * 254 + "/x": "y"}}, False),
    (SubmitWorkload, {**GANG, "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, False),
    (ServingSpec, {}, False),
    (ServingSpec, {"traffic_metric": "rps", "latency_objective_ms": 100}, False),
    (ServingSpec, {"latency_metric": "lat", "latency_objective_ms": 100}, True),
    (PoolSpec, {**POOL, "sharing": "mig:all-balanced"}, True),
    (PoolSpec, {**POOL, "sharing": "mig:3g.40gb*2"}, True),
    (PoolSpec, {**POOL, "sharing": "mig:3g.20gb"}, False),  # an A100-40GB profile
    (PoolSpec, {**POOL, "gpu_model": "L4", "sharing": "mig:all-balanced"}, False),
    (PoolSpec, {**POOL, "sharing": "timeslice:1"}, False),
    (ClusterSpec, {"name": "c", "pools": [POOL]}, True),
    (ClusterSpec, {"name": "c"}, False),
    (ClusterSpec, {"name": "c", "pools": [POOL], "account": "1234"}, False),
    (ClusterSpec, {"name": "c", "provider": "eks", "cluster": "k", "region": "us-east-1"}, True),
    (ClusterSpec, {"name": "c", "provider": "eks", "cluster": "k"}, False),
    (ClusterSpec, {"name": "c", "provider": "aks", "cluster": "k", "region": "westus"}, False),
    (ClusterSpec, {"name": "c", "provider": "oke", "cluster": "k", "region": "r", "cluster_id": "ocid"}, True),
    (ClusterSpec, {"name": "c", "provider": "oke", "cluster": "k", "region": "r"}, False),
    (ClusterSpec, {"name": "c", "provider": "gke", "cluster": "k", "region": "r", "account": "p"}, True),
    (ClusterSpec, {"name": "c", "provider": "gke", "cluster": "k", "region": "r", "pools": [POOL]}, False),
    (ClusterSpec, {"name": "c", "provider": "kubernetes"}, False),
    (ClusterSpec, {"name": "c", "provider": "kubernetes", "kubeconfig": "k", "resource_group": "rg"}, False),
    (ClusterSpec, {"name": "c", "pools": [POOL], "kubernetes": {"gpu_resource": "kubernetes.io/gpu"}}, False),
]


@pytest.mark.parametrize(("model", "body", "accepted"), CASES)
def test_the_schema_and_the_model_agree_on_rules_across_fields(
    schema: dict[str, Any], model: type[BaseModel], body: dict[str, Any], accepted: bool
) -> None:
    try:
        model.model_validate(body)
        model_accepts = True
    except ValidationError:
        model_accepts = False
    assert model_accepts is accepted, body
    assert _validator(schema, model.__name__).is_valid(body) is accepted, body


def _routes(routes: list[Any]) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):  # newer FastAPI keeps an included router as one entry
            yield from _routes(route.original_router.routes)


def _models(model: type[BaseModel]) -> Iterator[type[BaseModel]]:
    """The model and the models of its fields, all the way down."""
    yield model
    for field in model.model_fields.values():
        for candidate in (field.annotation, *getattr(field.annotation, "__args__", ())):
            for inner in (candidate, *getattr(candidate, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    yield from _models(inner)


def test_every_request_schema_names_every_field(app: FastAPI, schema: dict[str, Any]) -> None:
    """A model's `json_schema_extra` adds keywords; it must never replace its `properties`."""
    checked = set()
    for route in _routes(app.routes):
        if route.body_field is not None:
            body = route.body_field.field_info.annotation
            for top in (body, *getattr(body, "__args__", ())):
                if isinstance(top, type) and issubclass(top, BaseModel):
                    for model in _models(top):
                        published = schema["components"]["schemas"][model.__name__]
                        assert set(published["properties"]) == set(model.model_fields), model.__name__
                        checked.add(model.__name__)
    assert {"SubmitWorkload", "PodSetSpec", "ServingSpec", "ClusterSpec", "PoolSpec", "TokenSpec"} <= checked


def test_a_dict_with_constrained_keys_says_so_with_property_names(schema: dict[str, Any]) -> None:
    nodes = list(_walk(schema["components"]["schemas"]))
    assert not [n for n in nodes if "patternProperties" in n]
    key_patterns = [n["propertyNames"]["pattern"] for n in nodes if "pattern" in n.get("propertyNames", {})]
    assert len(key_patterns) >= 4  # labels of pools and workloads, pool prices, priority class map


def test_a_pattern_refusal_is_a_sentence_not_the_expression() -> None:
    with pytest.raises(ValidationError) as refused:
        SubmitWorkload.model_validate({**GANG, "name": "Not_A-Name"})
    (error,) = refused.value.errors()
    assert error["msg"] == NAME_SENTENCE
    assert "^" not in error["msg"]
    with pytest.raises(ValidationError) as refused:
        PodSetSpec.model_validate({"mig_profile": "3g"})
    assert refused.value.errors()[0]["msg"] == "is not a MIG profile like 3g.40gb"


def test_an_integer_may_be_written_as_a_whole_float_as_json_schema_counts_it() -> None:
    assert PriorityClassSpec.model_validate({"name": "batch", "value": 100.0}).value == 100
    assert PodSetSpec.model_validate({"replicas": 4.0, "gpus": 1.0, "min_replicas": 2.0}).min_replicas == 2
    for wrong in (100.5, True, "100"):
        with pytest.raises(ValidationError):
            PriorityClassSpec.model_validate({"name": "batch", "value": wrong})


def test_every_stated_rule_is_kept_by_the_schemathesis_hook(schema: dict[str, Any]) -> None:
    stated = {rule for node in _walk(schema) for rule in node.get("x-rules", {})}
    assert stated == set(schemathesis_hooks.KEEPERS)
    for node in _walk(schema):
        for rule, sentence in node.get("x-rules", {}).items():
            assert isinstance(sentence, str), rule
            assert len(sentence) > 20, rule
