"""Kubernetes resource quantities (`resource.Quantity`) parsed exactly, as fractions.

Grammar from k8s.io/apimachinery `pkg/api/resource/quantity.go` (`ParseQuantity`): a signed
decimal number followed by a binary-SI suffix (Ki..Ei), a decimal-SI suffix (n, u, m, "", k, M, G,
T, P, E) or a decimal exponent (e3, E-2). JSON numbers are quantities too (`x-kubernetes-int-or-string`).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}


class QuantityError(ValueError):
    """Not a quantity the API server accepts."""


def parse_quantity(value: Any) -> Fraction:
    """The exact value of a quantity (`"500m"` -> 1/2, `"1Gi"` -> 1073741824, `4` -> 4)."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    match = _QUANTITY.match(value)
    if match is None:
        raise QuantityError(f"quantities must match the regular expression '{_QUANTITY.pattern}'")
    number = Fraction(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def format_quantity(value: Fraction) -> str:
    """A short canonical rendering for messages (`1/2` -> `500m`)."""
    if value.denominator == 1:
        return str(value.numerator)
    millis = value * 1000
    if millis.denominator == 1:
        return f"{millis.numerator}m"
    return f"{float(value):g}"
