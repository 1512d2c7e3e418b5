"""Kubernetes resource quantities ("191450m", "2003307344Ki", "1.5Gi", "1e3") in gpufleet's integer units.

Pure. What does not match Kubernetes' quantity grammar is refused with `BadQuantity`, never guessed at.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIXES = {
    "n": Decimal(10) ** -9,
    "u": Decimal(10) ** -6,
    "m": Decimal(10) ** -3,
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
# Kubernetes' quantity grammar: a signed decimal number, then a binary or decimal SI suffix or an exponent.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_QUANTITY_MAX_CHARS = 64


class BadQuantity(ValueError):
    pass


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity ("191450m", "2003307344Ki", "1.5Gi", "8", "1e3") as a Decimal."""
    value = str(text).strip()
    match = _QUANTITY.fullmatch(value) if len(value) <= _QUANTITY_MAX_CHARS else None
    if match is None:
        raise BadQuantity(f"{text!r} is not a Kubernetes quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number)
        if suffix[:1] in ("e", "E"):
            exponent = int(suffix[1:])
            if abs(exponent) > 30:
                raise BadQuantity(f"{text!r}: exponent out of range")
            return amount.scaleb(exponent)
        return amount * _SUFFIXES[suffix]
    except (InvalidOperation, KeyError) as exc:
        raise BadQuantity(f"{text!r} is not a Kubernetes quantity") from exc


def quantity_units(name: str, text: str) -> int:
    """A quantity in gpufleet's integer unit for it: millicores for cpu, the base unit (bytes, devices)
    otherwise, rounded down (a node cannot hold a fraction of a device it advertises)."""
    amount = parse_quantity(text)
    if name == "cpu":
        amount *= 1000
    return max(0, math.floor(amount))


def quantities(raw: Mapping[str, Any]) -> tuple[dict[str, int], list[str]]:
    """Parsed quantities, and what could not be read."""
    parsed: dict[str, int] = {}
    bad: list[str] = []
    for name, text in sorted(raw.items())[:64]:
        try:
            parsed[str(name)[:253]] = quantity_units(str(name), str(text))
        except BadQuantity:
            bad.append(f"{name}={str(text)[:40]}")
    return parsed, bad
