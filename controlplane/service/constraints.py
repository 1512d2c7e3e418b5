"""Building blocks of the request models that make their JSON Schema (the OpenAPI) say exactly what
they accept: a rule a model enforces is stated in the schema it publishes, in one place.

- `Strict`: the base of every request model: no coercion, no unknown field, and an integer field
  takes `3.0`, as JSON Schema's `integer` does.
- `matching(pattern, sentence)`: a regular expression that the schema carries (`pattern`) and
  validation applies, refused with a sentence for a person instead of the raw expression.
- `KeysMatch`: a dict whose keys are constrained is published with `propertyNames` (pydantic writes
  `patternProperties`, which leaves keys that do not match the pattern allowed).
- `Also(...)`: JSON Schema keywords for what a validator function checks (to keep its sentences).
- `rules(...)`: what JSON Schema cannot say (a rule across fields, a sum, uniqueness by a field) is
  stated under `x-rules`, one sentence per rule id, besides the description; clients and fuzzers
  read it there (tests/openapi/schemathesis_hooks.py generates data that keeps these rules).
"""

from __future__ import annotations

import types
import typing
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    GetJsonSchemaHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError


def _takes_int(annotation: object) -> bool:
    """`int`, `int | None`, `Annotated[int, ...]` (never `bool`, which is no integer here)."""
    if annotation is int:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _takes_int(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_takes_int(arg) for arg in typing.get_args(annotation))
    return False


class Strict(BaseModel):
    """Inputs are taken as their schema says, never coerced: `true` is no number, `"5"` no integer,
    `" a"` no name (the published OpenAPI must describe exactly what is accepted). No NaN or
    infinities in any float field of any request (REST or NATS): they break quota arithmetic and
    JSON columns, and no quantity gpufleet takes can be infinite.

    One conversion, the one JSON Schema makes: `3.0` is an `integer` (generated clients and fuzzers
    send it), so an integer field takes it as 3; `3.5`, `true` and `"3"` stay refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    _int_fields: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._int_fields = frozenset(
            info.alias or name for name, info in cls.model_fields.items() if _takes_int(info.annotation)
        )

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not cls._int_fields:
            return data
        whole = {
            name: int(value)
            for name in cls._int_fields & data.keys()
            if type(value := data[name]) is float and value.is_integer()
        }
        return {**data, **whole} if whole else data


def matching(sentence: str) -> WrapValidator:
    """Put after a `Field(pattern=...)`: a value that does not match is refused with `sentence`
    (what the pattern means, for a person) rather than pydantic's "should match pattern '^...$'"."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            if any(error["type"] == "string_pattern_mismatch" for error in exc.errors()):
                raise PydanticCustomError("string_pattern_mismatch", sentence) from None
            raise

    return WrapValidator(check)


class KeysMatch:
    """Annotate a `dict[Key, Value]` whose `Key` has a pattern with it: the schema then says
    `propertyNames: {pattern, ...}` and `additionalProperties: <value>`, which is what validation
    does, instead of pydantic's `patternProperties`, under which a key off the pattern is valid."""

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        published = handler(schema)
        target = handler.resolve_ref_schema(published)
        patterns = target.pop("patternProperties", None)
        if patterns:
            ((pattern, values),) = patterns.items()
            target["propertyNames"] = {**target.get("propertyNames", {}), "pattern": pattern}
            target["additionalProperties"] = values
        return published


class Also:
    """Annotate a type with JSON Schema keywords its validator (a function, for its sentences)
    enforces: a second pattern, a `not`, an `if`/`then` across fields. The keywords are built from the
    same constants the validator uses (the Kubernetes syntax patterns, the reserved label prefixes)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        published = handler(schema)
        handler.resolve_ref_schema(published).update(self.schema)
        return published


def rules(**sentences: str) -> dict[str, Any]:
    """`json_schema_extra` stating rules JSON Schema cannot express, keyed by a stable id."""
    return {"x-rules": dict(sentences)}
