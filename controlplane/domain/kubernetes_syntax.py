"""Kubernetes syntax rules for what gpufleet puts on objects: label keys and values, toleration
and taint keys, names. Checked at submit, so a request Kubernetes would reject never gets queued.

The rules are those of the Kubernetes API machinery validation (apimachinery `IsQualifiedName`,
`IsValidLabelValue`, `IsDNS1123Subdomain`, `IsDNS1123Label`), restated here; each function
returns the reasons a value breaks them (empty when it is fine), as sentences for a person.
"""

from __future__ import annotations

import re

# The patterns are ECMA-262 regular expressions as well as Python ones (no lookaround, `^...$`
# meaning the whole text), so the request models publish them unchanged in the OpenAPI; the checks
# below apply them with `fullmatch` (Python's `$` alone would also match before a final newline).
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
# A label key, taint or toleration key: `[prefix/]name`; with PREFIX_LENGTH_PATTERN (a second
# pattern, as JSON Schema has no lookahead) the prefix is at most 253 characters.
QUALIFIED_NAME_PATTERN = rf"^({_SUBDOMAIN}/)?{_NAME_PART}$"
PREFIX_LENGTH_PATTERN = r"^([^/]{1,253}/)?[^/]*$"
LABEL_VALUE_PATTERN = rf"^({_NAME_PART})?$"
# The names of gpufleet objects (workloads, queues, clusters, pools...) are DNS labels: they end up
# in Kubernetes object names and labels. Exported for request models, which check it as a pattern.
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_PATTERN = rf"^{_SUBDOMAIN}$"
# An extended resource name (`nvidia.com/gpu.shared`): `<DNS subdomain>/<name>`, outside the
# kubernetes.io domains and the `requests.` prefix (RESERVED_RESOURCE_PATTERN must not match).
EXTENDED_RESOURCE_PATTERN = rf"^{_SUBDOMAIN}/{_NAME_PART}$"
RESERVED_RESOURCE_PATTERN = r"^(([^/]*\.)?kubernetes\.io/|requests\.)"
_QUALIFIED_NAME = re.compile(rf"^{_NAME_PART}$")
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)
_DNS1123_LABEL = re.compile(DNS1123_LABEL_PATTERN)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN_PATTERN)

QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
# `[prefix/]name` at its longest.
QUALIFIED_KEY_MAX = DNS1123_SUBDOMAIN_MAX + 1 + QUALIFIED_NAME_MAX

TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def dns1123_label_errors(value: str) -> list[str]:
    if not value or len(value) > DNS1123_LABEL_MAX:
        return [f"must be 1 to {DNS1123_LABEL_MAX} characters"]
    if not _DNS1123_LABEL.fullmatch(value):
        return ["must be lower-case letters, digits and '-', starting and ending with a letter or digit"]
    return []


def dns1123_subdomain_errors(value: str) -> list[str]:
    if not value or len(value) > DNS1123_SUBDOMAIN_MAX:
        return [f"must be 1 to {DNS1123_SUBDOMAIN_MAX} characters"]
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        return ["must be lower-case DNS labels separated by '.'"]
    return []


def qualified_name_errors(key: str) -> list[str]:
    """A label key, annotation key or taint/toleration key: `[prefix/]name`."""
    prefix, slash, name = key.rpartition("/")
    errors: list[str] = []
    if slash:
        if not prefix:
            errors.append("prefix before '/' must not be empty")
        else:
            errors += [f"prefix {e}" for e in dns1123_subdomain_errors(prefix)]
    if not name or len(name) > QUALIFIED_NAME_MAX:
        errors.append(f"name part must be 1 to {QUALIFIED_NAME_MAX} characters")
    elif not _QUALIFIED_NAME.fullmatch(name):
        errors.append("name part must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
    return errors


def is_extended_resource(name: str) -> bool:
    return (
        re.fullmatch(EXTENDED_RESOURCE_PATTERN, name) is not None
        and re.fullmatch(PREFIX_LENGTH_PATTERN, name) is not None
        and re.match(RESERVED_RESOURCE_PATTERN, name) is None
    )


def label_value_errors(value: str) -> list[str]:
    if len(value) > LABEL_VALUE_MAX:
        return [f"must be at most {LABEL_VALUE_MAX} characters"]
    if not _LABEL_VALUE.fullmatch(value):
        return ["must be empty or letters, digits, '-', '_' or '.', starting and ending with a letter or digit"]
    return []


def toleration_errors(key: str, operator: str, value: str, effect: str) -> list[str]:
    """Kubernetes' core validation of a toleration (`validateTolerations`)."""
    errors: list[str] = []
    if key:
        errors += [f"key {e}" for e in qualified_name_errors(key)]
    elif operator != "Exists":
        errors.append("an empty key needs operator Exists (it then tolerates every taint)")
    if operator not in TOLERATION_OPERATORS:
        errors.append(f"operator must be one of {', '.join(TOLERATION_OPERATORS)}")
    if operator == "Exists" and value:
        errors.append("operator Exists takes no value")
    if operator == "Equal":
        errors += [f"value {e}" for e in label_value_errors(value)]
    if effect and effect not in TAINT_EFFECTS:
        errors.append(f"effect must be empty or one of {', '.join(TAINT_EFFECTS)}")
    return errors


def taint_errors(key: str, value: str, effect: str) -> list[str]:
    errors = [f"key {e}" for e in qualified_name_errors(key)]
    errors += [f"value {e}" for e in label_value_errors(value)]
    if effect not in TAINT_EFFECTS:
        errors.append(f"effect must be one of {', '.join(TAINT_EFFECTS)}")
    return errors
