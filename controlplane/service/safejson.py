"""The one JSON decoder for untrusted bytes: NATS messages of every consumer and REST bodies.

Python's `json` module is not safe on hostile input by itself:
- nesting is parsed recursively, so `[[[[...` a few thousand deep raises `RecursionError` (not a
  `ValueError`), which escaped the consumers and made a message redeliver forever;
- it accepts `NaN`, `Infinity` and `-Infinity`, and turns `1e309` into `inf`, values that break
  quota arithmetic (`Fraction(inf)` raises `OverflowError`) and PostgreSQL JSON columns;
- `json.loads(bytes)` guesses UTF-16/32 from the first bytes instead of insisting on UTF-8;
- an integer longer than Python's `int_max_str_digits` raises a plain `ValueError`;
- a duplicated key keeps the last value silently, so two readers of one message can disagree.

`decode` checks size, encoding and nesting depth *before* parsing (the depth scan is iterative,
so it cannot recurse itself), then parses with hooks that refuse non-finite numbers and duplicate
keys, and turns every failure into `UnsafeJson` with a sentence. Nothing else can escape it.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

# The NATS streams cap messages at 1 MiB and the REST API caps bodies at 1 MiB.
MAX_BYTES = 1 << 20
# The deepest document gpufleet itself produces is a submit with a container spec (about 8);
# 64 leaves room for any container spec a person writes, and is far below the recursion limit.
MAX_DEPTH = 64

# The depth scan works on bytes with C-speed passes: drop escape pairs, keep only quotes and
# brackets, drop what is left of strings; what remains is the nesting structure.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRUCTURE = bytes(range(256)).translate(None, b'"[]{}')
_STRING = re.compile(rb'"[^"]*"')
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1, ord('"'): 0}


class UnsafeJson(ValueError):
    """The bytes are not a JSON document gpufleet accepts; `str()` says why, for a person."""


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in UTF-8 `data`, without recursion.

    Brackets inside strings do not count. On malformed input the figure is approximate, which
    is fine: the parser refuses such input anyway, and this only has to bound what it sees.
    """
    if b"\\" in data:
        data = _ESCAPE.sub(b"", data)
    structure = _STRING.sub(b"", data.translate(None, _STRUCTURE))
    return max(accumulate(_STEP[c] for c in structure), default=0)


def _refuse_constant(name: str) -> Any:
    raise UnsafeJson(f"{name} is not a number gpufleet accepts (no NaN or infinities)")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise UnsafeJson(f"number {literal[:40]} is out of range (it would be an infinity)")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise UnsafeJson(f"key {key[:60]!r} appears twice in one object")
            seen.add(key)
    return out


def decode(data: bytes | str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse untrusted JSON; raise `UnsafeJson` (and only that) when it is not acceptable."""
    try:
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeJson("not valid Unicode (lone surrogate)") from None
    if len(raw) > max_bytes:
        raise UnsafeJson(f"document of {len(raw)} bytes is larger than the {max_bytes} bytes accepted")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafeJson(f"not valid UTF-8 (byte {exc.start})") from None
    try:
        depth = nesting_depth(raw)
    except Exception as exc:  # a hostile payload must never escape as anything else
        raise UnsafeJson(f"cannot scan the document: {type(exc).__name__}") from None
    if depth > max_depth:
        raise UnsafeJson(f"nested {depth} levels deep; at most {max_depth} are accepted")
    try:
        return json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
        )
    except UnsafeJson:
        raise
    except json.JSONDecodeError as exc:
        raise UnsafeJson(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except Exception as exc:  # e.g. an integer beyond int_max_str_digits
        raise UnsafeJson(f"not acceptable JSON: {type(exc).__name__}: {str(exc)[:200]}") from None


def decode_object(data: bytes | str, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """`decode`, insisting on a JSON object at the top."""
    body = decode(data, max_bytes)
    if not isinstance(body, dict):
        raise UnsafeJson(f"expected a JSON object, got {type(body).__name__}")
    return body
