"""The shared decoder of untrusted JSON: everything hostile becomes `UnsafeJson`, nothing else."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import pytest

from controlplane.service.events import envelope
from controlplane.service.safejson import MAX_DEPTH, UnsafeJson, decode, decode_object, nesting_depth


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "levels deep"),
        (b'{"a":' * 5_000 + b"1" + b"}" * 5_000, "levels deep"),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), f"nested {MAX_DEPTH + 1} levels"),
        (b"[Infinity]", "no NaN or infinities"),
        (b"[-Infinity]", "no NaN or infinities"),
        (b'{"x": NaN}', "no NaN or infinities"),
        (b"[1e309]", "infinity"),
        (b"[-1e400]", "infinity"),
        (b'"\xff"', "UTF-8"),
        ("[1]".encode("utf-16"), "UTF-8"),
        (b'{"a": 1, "a": 2}', "appears twice"),
        (b"1" * 5_000, "digits"),
        (b"{not json", "not JSON"),
        (b"", "not JSON"),
        (b" " * (1 << 20) + b"1", "larger than"),
    ],
)
def test_hostile_documents_raise_unsafe_json_only(data: bytes, words: str) -> None:
    with pytest.raises(UnsafeJson, match=words):
        decode(data)


def test_depth_is_measured_without_recursion_and_ignores_brackets_in_strings() -> None:
    deep = b"[" * (sys.getrecursionlimit() * 50)
    assert nesting_depth(deep) == len(deep)  # far beyond the recursion limit, no RecursionError
    assert nesting_depth(b'{"a": "[[[[[[", "b": "\\"[[[", "c": [[1]]}') == 3
    assert decode(b'{"a": "' + b"[" * 1000 + b'"}') == {"a": "[" * 1000}


def test_ordinary_documents_decode_as_json_does() -> None:
    doc = {"name": "x", "pods": [{"i": i, "f": i / 3} for i in range(100)], "u": "h\u00e9", "n": None}
    assert decode(json.dumps(doc).encode()) == doc
    assert decode_object(json.dumps(doc)) == doc
    with pytest.raises(UnsafeJson, match="expected a JSON object"):
        decode_object(b"[1]")


def test_events_never_carry_nan_or_infinity() -> None:
    _, payload = envelope("x", {"mean": float("nan"), "nested": [{"max": float("inf")}], "ok": 0.5}, datetime.now(UTC))
    assert decode(payload)["data"] == {"mean": None, "nested": [{"max": None}], "ok": 0.5}
