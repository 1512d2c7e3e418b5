"""Kubernetes syntax rules for what gpufleet puts on objects: label keys and values, toleration
and taint keys, names. Checked at submit, so a request Kubernetes would reject never gets queued.

The rules are those of the Kubernetes API machinery validation (apimachinery `IsQualifiedName`,
`IsValidLabelValue`, `IsDNS1123Subdomain`, `IsDNS1123Label`), restated here; each function
returns the reasons a value breaks them (empty when it is fine), as sentences for a person.
"""

from __future__ import annotations

import re

_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
# The names of gpufleet objects (workloads, queues, clusters, pools...) are DNS labels: they end up
# in Kubernetes object names and labels. Exported for request models, which check it as a pattern.
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS1123_LABEL = re.compile(DNS1123_LABEL_PATTERN)
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253

TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def dns1123_label_errors(value: str) -> list[str]:
    if not value or len(value) > DNS1123_LABEL_MAX:
        return [f"must be 1 to {DNS1123_LABEL_MAX} characters"]
    if not _DNS1123_LABEL.match(value):
        return ["must be lower-case letters, digits and '-', starting and ending with a letter or digit"]
    return []


def dns1123_subdomain_errors(value: str) -> list[str]:
    if not value or len(value) > DNS1123_SUBDOMAIN_MAX:
        return [f"must be 1 to {DNS1123_SUBDOMAIN_MAX} characters"]
    if not _DNS1123_SUBDOMAIN.match(value):
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
    elif not _QUALIFIED_NAME.match(name):
        errors.append("name part must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
    return errors


def label_value_errors(value: str) -> list[str]:
    if len(value) > LABEL_VALUE_MAX:
        return [f"must be at most {LABEL_VALUE_MAX} characters"]
    if not _LABEL_VALUE.match(value):
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
